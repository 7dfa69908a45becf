"""The follower's state machine, pure: events in, actions out, time as numbers (no sockets, no
timers). Each test names the rule it guards."""

from __future__ import annotations

import socket

import pytest

from peerd.peer.client import CALL_TIMEOUT_S, LONG_POLL_MARGIN_S, keepalive_socket, read_timeout
from peerd.tasks.machine import (
    CRASH_RETRY_S,
    NO_RUN,
    AwaitPoll,
    CheckLink,
    DeliverStops,
    DropStop,
    EndTask,
    Exit,
    NoteError,
    OpenTask,
    PollAnswer,
    ReadResult,
    Relaunch,
    RunReport,
    SaveBackoff,
    Sleep,
    StopPoll,
    Subscribe,
    no_answer,
    not_found,
    watch_margin,
)
from peerd.tasks.rules import LINK_BACKOFF
from tests.support.follower import CHUNK, T0, machine, running, synced, watch_of


def answer(*runs: RunReport, cursor: str = "0123456789abcdef-1") -> PollAnswer:
    return PollAnswer(cursor, tuple(runs))


# --- the next step --------------------------------------------------------------------------------


def test_each_step_in_order_launches_then_stops_then_one_watch() -> None:
    m = machine()
    pending = OpenTask("p", "pending", None, None, False, "box")
    stopping = OpenTask("s", "cancelled", "ths", "runs", True, "box")
    assert m.plan(T0, [pending, stopping, *running(2)]) == [Relaunch(("p",))]
    assert m.plan(T0, [stopping, *running(2)]) == [DeliverStops(("s",))]
    [check] = m.plan(T0, running(2))
    assert isinstance(check, Subscribe) and check.delta.check_only, "after a start: the hash only"
    m.subscribed(T0, True)
    watch = watch_of(m.plan(T0))
    assert watch.cursor is None
    assert watch.timeout == CHUNK - watch_margin(CHUNK), "the box answers before the chunk is over"
    assert m.plan(T0 + 1) == [AwaitPoll(watch.deadline)], "one poll in flight per link"


def test_one_poll_per_link_whatever_the_number_of_runs() -> None:
    m = machine()
    watch = watch_of(synced(m, T0, running(25_000)))
    assert watch.cursor is None and len(m.sub.want) == m.max_followed, "the rest wait their turn"


def test_a_running_task_without_a_run_there_ends_instead_of_spinning() -> None:
    lost = OpenTask("x", "running", "thx", None, False, "box")
    assert machine().plan(T0, [lost]) == [EndTask("x", "failed", NO_RUN)]


def test_nothing_open_exits_and_clears_a_stored_backoff() -> None:
    m = machine()
    assert m.plan(T0, []) == [Exit()]
    m.restore(3, T0 + 10)
    assert m.plan(T0, []) == [SaveBackoff(0, 0.0, None), Exit()]


# --- backoff ----------------------------------------------------------------------------------------


def test_backoff_grows_to_five_minutes_with_jitter_and_no_attempt_limit() -> None:
    m, now, delays = machine(jitter=0.25), T0, []
    for _ in range(12):
        [sent] = m.plan(now, running())  # the subscription's check: it fails
        assert isinstance(sent, Subscribe)
        actions = m.failed(now, "unreachable", "box did not answer", subscribing=True)
        save, *note = actions
        assert isinstance(save, SaveBackoff) and save.attempts == m.attempts
        assert note == ([NoteError("box did not answer")] if len(delays) == 0 else []), "noted once"
        delays.append(save.next_at - now)
        assert m.plan(now + 1, running()) == [Sleep(save.next_at)], "no try before the stored next one"
        now = save.next_at
    assert delays[:5] == [2.25, 4.25, 8.25, 16.25, 32.25]
    assert delays[-1] == LINK_BACKOFF.cap + 0.25 == 300.25
    assert m.attempts == 12


def test_any_answer_from_the_box_ends_the_backoff_at_once() -> None:
    m = machine()
    m.plan(T0, running())
    for _ in range(9):  # 5 minutes by now
        m.failed(T0, "unreachable", "down")
    assert isinstance(m.plan(T0 + 1, running())[0], Sleep)
    assert m.answered(T0 + 1) == [SaveBackoff(0, 0.0, None)]
    assert not isinstance(m.plan(T0 + 1, running())[0], Sleep), "the next try is now, not in 5 minutes"
    assert m.answered(T0 + 2) == [], "nothing to clear: nothing written"


def test_a_poll_answer_is_an_answer() -> None:
    m = machine()
    m.plan(T0, running())
    m.failed(T0, "unreachable", "down")
    m.answered(T0 + 5)
    watch_of(synced(m, T0 + 5, running()))
    m.failed(T0 + 5, "unreachable", "down")
    watch_of(m.plan(T0 + 20))
    actions = m.polled(T0 + 21, answer(RunReport("run0", True, False)))
    assert actions == [SaveBackoff(0, 0.0, None)]
    assert m.attempts == 0


def test_a_restored_backoff_is_honoured() -> None:
    m = machine()
    m.restore(4, T0 + 16)
    assert m.plan(T0, running()) == [Sleep(T0 + 16)]
    assert isinstance(m.plan(T0 + 16, running())[0], Subscribe)


def test_new_work_while_backing_off_only_looks_at_the_link_here() -> None:
    m = machine()
    m.plan(T0, running())
    m.failed(T0, "unreachable", "down")
    assert m.poked(T0 + 1) == [CheckLink()]
    assert m.poked(m.next_at) == [], "not backing off: the shell simply plans again"


# --- black holes --------------------------------------------------------------------------------------


def test_a_black_hole_is_noticed_by_the_poll_deadline() -> None:
    m = machine()
    watch = watch_of(synced(m, T0, running()))
    assert watch.deadline == T0 + CHUNK, "a black hole is noticed within one chunk"
    assert watch.timeout + watch_margin(CHUNK) == CHUNK
    assert watch_margin(CHUNK) == 5.0 and watch_margin(2.0) == 1.0 and watch_margin(1.0) == 0.5
    assert m.overdue(watch.deadline - 0.1) == [], "not yet overdue"
    stop, save, note = m.overdue(watch.deadline)
    assert stop == StopPoll()
    assert isinstance(save, SaveBackoff) and save.attempts == 1
    assert save.next_at == watch.deadline + 2.0
    assert note == NoteError(no_answer("box", CHUNK))
    assert m.overdue(watch.deadline + 10) == [], "one poll fails once"


def test_a_poll_answered_in_time_is_not_overdue() -> None:
    m = machine()
    watch = watch_of(synced(m, T0, running()))
    m.polled(T0 + CHUNK, answer())
    assert m.overdue(watch.deadline + 1) == []


# --- terminal or transient: by code -------------------------------------------------------------------


@pytest.mark.parametrize("code", ["unreachable", "unavailable", "storage_unavailable", "shutting_down"])
def test_transient_codes_back_off(code: str) -> None:
    m = machine()
    m.plan(T0, running(2))
    kinds = [type(a) for a in m.failed(T0, code, "anything", task_id="t0")]
    assert kinds == [SaveBackoff, NoteError]


@pytest.mark.parametrize(
    "code", ["capability_denied", "link_revoked", "not_linked", "pin_mismatch", "not_a_peerd", "incompatible"]
)
def test_a_failing_link_ends_all_its_tasks_and_drops_its_stops(code: str) -> None:
    m = machine()
    stopped = OpenTask("s", "cancelled", "ths", "runs", True, "box")
    m.plan(T0, [*running(2), stopped])
    actions = m.failed(T0, code, "The link is gone.", task_id="t0")
    assert actions == [
        EndTask("t0", "failed", "The link is gone."),
        EndTask("t1", "failed", "The link is gone."),
        DropStop("s", "The stop could not be delivered: The link is gone."),
    ]
    assert m.attempts == 0, "no retries of a dead link"


def test_a_refusal_about_one_task_ends_only_that_task() -> None:
    m = machine()
    m.plan(T0, running(2))
    assert m.failed(T0, "thread_not_found", "gone", task_id="t1") == [EndTask("t1", "failed", "gone")]


def test_the_message_is_never_read_only_the_code() -> None:
    m = machine()
    m.plan(T0, running(2))
    said = "This environment is not linked to box."
    assert m.failed(T0, "invalid_request", said, task_id="t0") == [EndTask("t0", "failed", said)]
    assert len(m.failed(T0, "not_linked", "whatever it says", task_id="t0")) == 2


def test_a_refusal_of_the_feed_itself_ends_the_link() -> None:
    m = machine()
    watch_of(synced(m, T0, running(2)))
    assert [type(a) for a in m.poll_failed(T0, "invalid_request", "bad poll")] == [EndTask, EndTask]


# --- results ------------------------------------------------------------------------------------------


def test_settled_runs_are_read_and_lost_ones_end() -> None:
    m = machine()
    watch_of(synced(m, T0, running(3)))
    reports = [
        RunReport("run0", True, True, "completed", None, "run0b"),
        RunReport("run1", False, False),
        RunReport("run2", True, False),
        RunReport("elsewhere", True, True, "completed"),
    ]
    actions = m.polled(T0 + 1, answer(*reports))
    read = ReadResult("t0", "th0", "run0b", "completed", None, "box")
    assert actions == [read, EndTask("t1", "failed", not_found("box"))]
    assert m.result_read(read, "the reply") == [EndTask("t0", "completed", "the reply")]


def test_the_result_text_is_the_one_policy() -> None:
    m = machine()
    failed = ReadResult("t0", "th0", "r", "failed", "the provider's error", "box")
    assert m.result_read(failed, "a reply") == [EndTask("t0", "failed", "the provider's error")]
    silent = ReadResult("t0", "th0", "r", "interrupted", None, "box")
    assert m.result_read(silent, None) == [
        EndTask("t0", "interrupted", "(The child thread in box ended without a reply.)")
    ]


# --- this daemon's store, and bugs ----------------------------------------------------------------------


def test_a_store_fault_waits_with_its_own_backoff_and_writes_nothing() -> None:
    m = machine()
    m.plan(T0, running())
    assert m.store_failed(T0) == []
    assert m.plan(T0 + 1, running()) == [Sleep(T0 + 2)]
    m.store_failed(T0 + 2)
    assert m.plan(T0 + 3, running()) == [Sleep(T0 + 6)], "grows while the store keeps failing"
    assert m.attempts == 0, "the link's stored backoff is not the store's"
    m.step_done()
    assert not isinstance(m.plan(T0 + 3, running())[0], Sleep)


def test_a_bug_is_retried_in_five_seconds() -> None:
    m = machine()
    m.plan(T0, running())
    assert m.crashed(T0) == [SaveBackoff(1, T0 + CRASH_RETRY_S, "internal error", CRASH_RETRY_S)]


# --- the peer client's side of noticing a silent box ------------------------------------------------------


def test_read_timeouts_are_the_wait_plus_a_margin() -> None:
    """Rule: no call waits on a silent box longer than its own wait plus a small margin (was 70 s)."""
    assert read_timeout("POST", "/v1/watch", {"runs": [], "timeout": 50}, None) == 50 + LONG_POLL_MARGIN_S
    assert read_timeout("POST", "/v1/watch", {"runs": [], "timeout": 2}, None) == 2 + LONG_POLL_MARGIN_S
    assert read_timeout("GET", "/v1/threads/t/wait", None, {"timeout": 10}) == 10 + LONG_POLL_MARGIN_S
    assert read_timeout("GET", "/v1/threads/t/events", None, {"timeout": 999}) == 50 + LONG_POLL_MARGIN_S
    assert read_timeout("GET", "/v1/threads/t/events", None, None) == 50 + LONG_POLL_MARGIN_S
    assert read_timeout("POST", "/v1/threads", {"timeout": 50}, None) == CALL_TIMEOUT_S
    assert CALL_TIMEOUT_S < 50, "a silent box is noticed within one chunk on any call"


def test_client_sockets_use_tcp_keepalive() -> None:
    sock = keepalive_socket((socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", 0)))
    with sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
