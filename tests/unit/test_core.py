"""The pure core: run lifecycle rules, idempotency keys and text paging. No I/O."""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import get_args

import pytest

from peerd.core.idempotency import Receipt, replay, request_hash, scoped_request_id
from peerd.core.runs import (
    CONTINUE_NOTE,
    MAX_CONTINUATIONS,
    RECOVERY_REASON,
    SHUTDOWN_REASON,
    CutThread,
    InvalidTransition,
    RunStatus,
    RunView,
    ThreadKind,
    check_transition,
    continuation_prompt,
    cut_chain,
    interrupted_notice,
    is_live,
    is_terminal,
    next_to_start,
    plan_cut,
    plan_interrupt,
    recover_at_startup,
    stop_reason,
    thread_kind,
)
from peerd.core.text import slice_text
from peerd.errors import IdempotencyKeyReused

STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
TERMINAL_STATUSES: tuple[RunStatus, ...] = ("completed", "failed", "cancelled", "interrupted")

# The lifecycle as documented, written out by hand (not copied from the implementation's table).
ALLOWED: set[tuple[RunStatus, RunStatus]] = {
    ("queued", "starting"),
    ("queued", "cancelled"),
    ("starting", "running"),
    ("starting", "failed"),
    ("starting", "interrupted"),
    ("starting", "cancelled"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "interrupted"),
}
FORBIDDEN = sorted(set(itertools.product(STATUSES, STATUSES)) - ALLOWED)


# --- run transitions ------------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "new"), sorted(ALLOWED))
def test_every_allowed_transition_is_accepted(current: RunStatus, new: RunStatus) -> None:
    assert check_transition(current, new) == new


@pytest.mark.parametrize(("current", "new"), FORBIDDEN)
def test_every_other_transition_is_refused(current: RunStatus, new: RunStatus) -> None:
    with pytest.raises(InvalidTransition) as err:
        check_transition(current, new)
    assert current in str(err.value) and new in str(err.value)


@pytest.mark.parametrize("terminal", TERMINAL_STATUSES)
def test_a_terminal_status_is_final(terminal: RunStatus) -> None:
    assert is_terminal(terminal)
    assert not is_live(terminal)
    for new in STATUSES:
        with pytest.raises(InvalidTransition):
            check_transition(terminal, new)


def test_live_and_terminal_partition_the_statuses() -> None:
    assert {s for s in STATUSES if is_live(s)} == {"starting", "running"}
    assert {s for s in STATUSES if is_terminal(s)} == set(TERMINAL_STATUSES)
    assert not is_live("queued") and not is_terminal("queued")


# --- which run starts next -----------------------------------------------------------------------


def test_next_to_start_is_the_oldest_queued_run_whatever_the_order_given() -> None:
    runs = [
        RunView("r3", 3, "queued"),
        RunView("r1", 1, "completed"),
        RunView("r4", 4, "queued"),
        RunView("r2", 2, "queued"),
    ]
    assert next_to_start(runs, queue_held=False, archived=False) == "r2"


def test_nothing_starts_while_a_run_is_live() -> None:
    for live in ("starting", "running"):
        runs = [RunView("r1", 1, live), RunView("r2", 2, "queued")]
        assert next_to_start(runs, queue_held=False, archived=False) is None


def test_nothing_starts_when_the_queue_is_held_or_the_thread_archived() -> None:
    runs = [RunView("r1", 1, "interrupted"), RunView("r2", 2, "queued")]
    assert next_to_start(runs, queue_held=False, archived=False) == "r2"
    assert next_to_start(runs, queue_held=True, archived=False) is None
    assert next_to_start(runs, queue_held=False, archived=True) is None


def test_nothing_starts_without_a_queued_run() -> None:
    assert next_to_start([], queue_held=False, archived=False) is None
    done = [RunView("r1", 1, "completed"), RunView("r2", 2, "cancelled")]
    assert next_to_start(done, queue_held=False, archived=False) is None


# --- interrupts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("live", ["starting", "running"])
def test_interrupt_targets_the_live_run(live: RunStatus) -> None:
    runs = [RunView("r1", 1, "completed"), RunView("r2", 2, live), RunView("r3", 3, "queued")]
    plan = plan_interrupt(runs, stop=False)
    assert plan.outcome == "interrupt_requested"
    assert plan.target_run == "r2"
    assert plan.hold_queue is False


def test_interrupt_without_a_live_run_reports_no_active_run() -> None:
    runs = [RunView("r1", 1, "completed"), RunView("r2", 2, "queued")]
    plan = plan_interrupt(runs, stop=False)
    assert plan.outcome == "no_active_run"
    assert plan.target_run is None
    assert plan.hold_queue is False
    assert plan_interrupt([], stop=False).outcome == "no_active_run"


def test_interrupting_one_queued_run_cancels_it_and_leaves_the_live_one() -> None:
    runs = [RunView("r1", 1, "running"), RunView("r2", 2, "queued"), RunView("r3", 3, "queued")]
    plan = plan_interrupt(runs, stop=False, run_id="r2")
    assert (plan.cancel_run, plan.target_run, plan.outcome) == ("r2", None, "cancelled")
    live = plan_interrupt(runs, stop=False, run_id="r1")
    assert (live.cancel_run, live.target_run, live.outcome) == (None, "r1", "interrupt_requested")
    ended = plan_interrupt([RunView("r1", 1, "completed")], stop=False, run_id="r1")
    assert (ended.cancel_run, ended.target_run, ended.outcome) == (None, None, "completed")


def test_stop_holds_the_queue_with_or_without_a_live_run() -> None:
    live = plan_interrupt([RunView("r1", 1, "running"), RunView("r2", 2, "queued")], stop=True)
    assert (live.target_run, live.outcome, live.hold_queue) == ("r1", "interrupt_requested", True)
    idle = plan_interrupt([RunView("r1", 1, "queued")], stop=True)
    assert (idle.target_run, idle.outcome, idle.hold_queue) == (None, "no_active_run", True)


# --- startup recovery ----------------------------------------------------------------------------


def plain(
    *runs: RunView, kind: ThreadKind = "plain", stopped: bool = False, session: bool = True
) -> CutThread:
    return CutThread(kind=kind, stopped=stopped, has_session=session, runs=runs)


def test_recovery_interrupts_only_live_runs_with_the_reason() -> None:
    runs = [RunView(f"r-{s}", i, s) for i, s in enumerate(STATUSES, start=1)]
    plan = recover_at_startup([plain(*runs)])
    assert sorted((c.run_id, c.reason, c.continued) for c in plan) == [
        ("r-running", RECOVERY_REASON, False),
        ("r-starting", RECOVERY_REASON, False),
    ]
    assert "interrupted" in RECOVERY_REASON
    assert recover_at_startup([plain(RunView("r1", 1, "queued"), RunView("r2", 2, "completed"))]) == []


def test_a_cut_says_whose_daemon_stopped_and_what_becomes_of_the_run() -> None:
    crash = plan_cut(RunView("r1", 1, "running"), plain(RunView("r1", 1, "running")), label="box",
                     continue_children=True, how="crash")  # fmt: skip
    assert crash.reason == "The daemon of box stopped while this run was live; it was interrupted."
    wake = RunView("r2", 2, "running", "wake")
    stop = plan_cut(wake, plain(RunView("r1", 1, "completed"), wake), label="laptop",
                    continue_children=False, how="shutdown")  # fmt: skip
    assert (
        stop.reason
        == "The daemon of laptop shut down while this run was live; it goes on in a new run after the restart."
    )
    assert stop_reason(None, "shutdown", continued=False) == SHUTDOWN_REASON


def test_a_cut_wake_run_is_continued_with_its_message_whatever_the_setting() -> None:
    wake = RunView("w", 2, "running", "wake")
    thread = plain(RunView("r1", 1, "completed"), wake)
    for setting in (True, False):
        cut = plan_cut(wake, thread, label="laptop", continue_children=setting, how="crash")
        assert (cut.continued, cut.repeat_prompt_of) == (True, "w"), "the wake's message is repeated"


@pytest.mark.parametrize(("kind", "setting", "continued"), [
    ("child", True, True), ("child", False, False), ("plain", True, False), ("orchestrated", True, False),
])  # fmt: skip
def test_a_cut_user_run_is_continued_only_for_a_delegated_child_and_only_when_the_box_allows_it(
    kind: ThreadKind, setting: bool, continued: bool
) -> None:
    run = RunView("r1", 1, "running")
    cut = plan_cut(run, plain(run, kind=kind), label="box", continue_children=setting, how="shutdown")
    assert cut.continued is continued
    assert cut.repeat_prompt_of is None, "its session holds the task: the note alone"


def test_a_thread_a_person_or_parent_stopped_is_never_continued() -> None:
    wake = RunView("w", 2, "running", "wake")
    for kind in ("child", "plain"):
        thread = plain(RunView("r1", 1, "completed"), wake, kind=kind, stopped=True)  # type: ignore[arg-type]
        assert not plan_cut(wake, thread, label="box", continue_children=True, how="crash").continued


def test_a_run_the_agent_may_not_have_seen_is_continued_with_its_prompt() -> None:
    starting = RunView("r1", 1, "starting")
    assert plan_cut(starting, plain(starting, kind="child"), label="b", continue_children=True,
                    how="crash").repeat_prompt_of == "r1"  # fmt: skip
    running = RunView("r1", 1, "running")
    no_session = plain(running, kind="child", session=False)
    assert (
        plan_cut(running, no_session, label="b", continue_children=True, how="crash").repeat_prompt_of == "r1"
    )
    assert continuation_prompt(None) == CONTINUE_NOTE
    assert continuation_prompt("Delegated task t1 ...").startswith(CONTINUE_NOTE)
    assert continuation_prompt("Delegated task t1 ...").endswith("\n\nDelegated task t1 ...")


def test_each_cut_is_continued_once_and_a_restart_loop_ends() -> None:
    """A wake cut again and again: each cut is continued (repeating the wake's message), until
    MAX_CONTINUATIONS continuations in a row were cut too."""
    ended: list[RunView] = [RunView("r1", 1, "completed")]
    live = RunView("w", 2, "running", "wake")
    continued = 0
    for _ in range(MAX_CONTINUATIONS + 5):  # bounded, also when the rule is broken
        cut = plan_cut(live, plain(*ended, live), label="b", continue_children=False, how="crash")
        assert cut_chain(live, [*ended, live])[-1].id == "w"
        if not cut.continued:
            break
        assert cut.repeat_prompt_of == "w"
        continued += 1
        ended.append(RunView(live.id, live.number, "interrupted", live.origin, live.continues))
        live = RunView(f"c{continued}", live.number + 1, "running", "continue", live.id)
    assert continued == MAX_CONTINUATIONS
    assert "interrupted" in cut.reason


def test_a_continuation_starts_before_runs_queued_behind_the_cut() -> None:
    runs = [
        RunView("r1", 1, "interrupted"),
        RunView("r2", 2, "queued"),
        RunView("c3", 3, "queued", "continue", "r1"),
    ]
    assert next_to_start(runs, queue_held=False, archived=False) == "c3"
    assert next_to_start(runs[:2], queue_held=False, archived=False) == "r2"
    assert next_to_start(runs, queue_held=True, archived=False) is None


def test_who_started_a_thread_decides_its_kind() -> None:
    assert thread_kind(started_by="task:thr_1", delegated=False) == "child"
    assert thread_kind(started_by="link:cli_1", delegated=True) == "child"
    assert thread_kind(started_by="link:cli_1", delegated=False) == "plain"
    assert thread_kind(started_by="orchestrate:orc_1", delegated=False) == "orchestrated"
    assert thread_kind(started_by=None, delegated=False) == "plain"


# --- idempotency ---------------------------------------------------------------------------------


def test_request_hash_ignores_key_order_at_every_depth() -> None:
    a = {"prompt": "p", "provider": "script", "nested": {"x": 1, "y": [1, {"b": 2, "a": 1}]}}
    b = {"nested": {"y": [1, {"a": 1, "b": 2}], "x": 1}, "provider": "script", "prompt": "p"}
    assert request_hash("thread_launch", a) == request_hash("thread_launch", b)
    assert re.fullmatch(r"[0-9a-f]{64}", request_hash("thread_launch", a))


def test_request_hash_differs_by_value_and_by_operation() -> None:
    body = {"prompt": "p"}
    assert request_hash("thread_launch", body) != request_hash("thread_launch", {"prompt": "q"})
    assert request_hash("thread_launch", body) != request_hash("thread_send", body)
    # A list keeps its order: that is part of what was asked.
    assert request_hash("op", {"l": [1, 2]}) != request_hash("op", {"l": [2, 1]})


def _receipt(request_hash_: str) -> Receipt:
    return Receipt("local", "thread_launch", "key-42", request_hash_, {"threadId": "thr_1", "runId": "run_1"})


def test_replay_of_a_new_command_is_none() -> None:
    assert replay(None, request_hash="h") is None


def test_replay_with_the_same_hash_returns_the_first_result() -> None:
    assert replay(_receipt("h1"), request_hash="h1") == {"threadId": "thr_1", "runId": "run_1"}


def test_replay_with_another_hash_is_refused_naming_the_key() -> None:
    with pytest.raises(IdempotencyKeyReused) as err:
        replay(_receipt("h1"), request_hash="h2")
    assert err.value.code == "idempotency_key_reused"
    assert "key-42" in err.value.message
    assert "thread_launch" in err.value.message


def test_scoped_request_id_matches_per_namespace_and_key() -> None:
    assert scoped_request_id("env-a", "k") == scoped_request_id("env-a", "k")
    assert scoped_request_id("env-a", "k") != scoped_request_id("env-b", "k")
    assert scoped_request_id("env-a", "k") != scoped_request_id("env-a", "k2")


def test_scoped_request_id_format_and_formula() -> None:
    scoped = scoped_request_id("env-a", "k-1")
    assert re.fullmatch(r"fwd:[0-9a-f]{64}", scoped)
    assert scoped == "fwd:" + hashlib.sha256(b"env-a\nk-1").hexdigest()
    # The separator keeps a shifted namespace/key boundary from colliding.
    assert scoped_request_id("ab", "c") != scoped_request_id("a", "bc")


# --- text paging ---------------------------------------------------------------------------------


def test_slice_text_first_page() -> None:
    part = slice_text("abcdefghij", offset=0, max_chars=4)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("abcd", 0, True, 4)


def test_slice_text_middle_page_starts_at_the_offset() -> None:
    part = slice_text("abcdefghij", offset=4, max_chars=4)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("efgh", 4, True, 8)


def test_slice_text_last_page_is_not_truncated() -> None:
    part = slice_text("abcdefghij", offset=8, max_chars=4)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("ij", 8, False, None)
    exact = slice_text("abcdefgh", offset=4, max_chars=4)
    assert (exact.text, exact.truncated, exact.next_offset) == ("efgh", False, None)


def test_slice_text_pages_reassemble_the_whole_text() -> None:
    text = "0123456789" * 7 + "xyz"
    pieces, offset = [], 0
    while True:
        part = slice_text(text, offset=offset, max_chars=9)
        pieces.append(part.text)
        if part.next_offset is None:
            break
        offset = part.next_offset
    assert "".join(pieces) == text


def test_slice_text_offset_past_the_end_is_an_empty_last_page() -> None:
    part = slice_text("abc", offset=10, max_chars=5)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("", 3, False, None)


def test_slice_text_negative_offset_starts_at_zero() -> None:
    part = slice_text("abc", offset=-5, max_chars=2)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("ab", 0, True, 2)


def test_slice_text_of_empty_text() -> None:
    part = slice_text("", offset=0, max_chars=5)
    assert (part.text, part.offset, part.truncated, part.next_offset) == ("", 0, False, None)


def test_an_interrupts_item_says_why_as_a_sentence() -> None:
    assert interrupted_notice(None) == "Interrupted."
    assert interrupted_notice("Stopped.") == "Stopped."
    assert interrupted_notice("from the console") == "Interrupted: from the console"
