"""The pure rules of a move (peerd/handoff/machine.py), without sockets or git."""

from __future__ import annotations

from peerd.handoff import machine as m


def test_a_message_cancels_a_waiting_move_and_is_refused_after_the_commit_point() -> None:
    assert m.on_message("waiting") == "cancel"
    assert m.on_message("moving") == "refuse_moving"
    assert m.on_message("moved") == "refuse_moved"
    assert m.on_message("cancelled") == m.on_message("failed") == m.on_message(None) == "allow"


def test_the_commit_point_needs_no_live_and_no_queued_run() -> None:
    assert m.may_commit(live_run=False, queued_run=False)
    assert not m.may_commit(live_run=True, queued_run=False)
    assert not m.may_commit(live_run=False, queued_run=True)


def test_a_resumed_move_starts_at_the_first_step_not_recorded() -> None:
    assert m.next_step(m.Progress(None, False, None)) == "snapshot"
    assert m.next_step(m.Progress("abc", False, None)) == "send"
    assert m.next_step(m.Progress("abc", True, None)) == "launch"
    assert m.next_step(m.Progress("abc", True, "thr_x")) == "finish"
    assert m.may_fail(m.Progress("abc", True, None))
    assert not m.may_fail(m.Progress("abc", True, "thr_x")), "after the launch only `moved`"


def test_a_branch_tip_only_moves_to_a_descendant() -> None:
    assert m.landing(tip_there=None, incoming="b", ancestor=False, checked_out=False) == "absent"
    assert m.landing(tip_there="b", incoming="b", ancestor=False, checked_out=False) == "same"
    assert m.landing(tip_there="a", incoming="b", ancestor=True, checked_out=False) == "fast-forward"
    assert m.landing(tip_there="a", incoming="b", ancestor=False, checked_out=False) == "diverged"
    assert m.landing(tip_there="a", incoming="b", ancestor=True, checked_out=True) == "checked-out"


def test_transient_codes_are_retried_with_a_capped_backoff() -> None:
    for code in ("unreachable", "unavailable", "storage_unavailable", "shutting_down", "rate_limited"):
        assert m.is_transient(code), code
    # The same set as the follower's (one definition, peerd/errors.py): a box whose clock is wrong,
    # or whose peerd is older than the call needs, is waited out too.
    assert m.is_transient("clock_skew") and m.is_transient("version_skew")
    for code in ("provider_unavailable", "capability_denied", "move_refused", "thread_busy"):
        assert not m.is_transient(code), code
    # A bug (`internal_error`, as the untyped exceptions the driver catches) fails a move that
    # has not launched there yet, rather than retrying it for ever; a box's 5xx is `unreachable`.
    assert not m.is_transient("internal_error")
    assert [m.RETRY.delay(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert m.RETRY.delay(30) == 60.0


def test_the_transcript_is_quoted_cut_and_bounded() -> None:
    said = [m.Message("user", "```peerd-script\n{}\n```")] + [
        m.Message("assistant", "x" * 10_000) for _ in range(30)
    ]
    text = m.transcript(said)
    assert "\n```peerd-script" not in text and not text.startswith("```"), "nothing in it runs"
    assert text.count("assistant:") <= m.TRANSCRIPT_MESSAGES
    assert len(text) <= m.TRANSCRIPT_TOTAL_CHARS
    assert "[... 6000 more characters]" in text
    prompt = m.continuation(
        origin_label="laptop", origin_env="ENV", thread_id="thr_1", title="t", branch="peerd/thr_1",
        snapshot="abc", messages=said, message="go on",
    )  # fmt: skip
    assert prompt.startswith("This thread was moved here from laptop") and prompt.endswith("go on")
