"""Issue 26, case 8: a stuck result is visible. The follower's machine, pure: a followed run the
box says nothing of for `QUIET_CHUNKS` whole chunks (polls answered with nothing) is noted once,
for a log line; a report, or the task changing here, starts its count again."""

from __future__ import annotations

from peerd.tasks.machine import (
    QUIET_CHUNKS,
    FollowerMachine,
    NoteQuiet,
    OpenTask,
    PollAnswer,
    RunReport,
    Subscribe,
)
from tests.support.follower import T0, machine, running, synced, watch_of


def empty(cursor: str = "0123456789abcdef-1") -> PollAnswer:
    return PollAnswer(cursor, ())


def chunks(m: FollowerMachine, n: int, now: float = T0) -> list[object]:
    noted: list[object] = []
    for _ in range(n):
        actions = m.plan(now)
        while isinstance(actions[0], Subscribe):  # a task changed here: the box is told first
            m.subscribed(now, True)
            actions = m.plan(now)
        watch_of(actions)
        noted += [a for a in m.polled(now, empty()) if isinstance(a, NoteQuiet)]
    return noted


def started(n: int) -> FollowerMachine:
    """A follower of `n` running tasks past its first answer (a resync, which is no chunk)."""
    m = machine()
    watch_of(synced(m, T0, running(n)))
    m.polled(T0, PollAnswer("0123456789abcdef-1", (), resynced=True))
    return m


def test_a_run_quiet_for_quiet_chunks_is_noted_once() -> None:
    m = started(2)
    assert chunks(m, QUIET_CHUNKS - 1) == [], "not before QUIET_CHUNKS whole chunks"
    assert chunks(m, 1) == [NoteQuiet(("t0", "t1"), QUIET_CHUNKS)]
    assert chunks(m, 3 * QUIET_CHUNKS) == [], "once per run, not every chunk after"


def test_word_of_a_run_or_a_change_here_starts_its_count_again() -> None:
    m = started(3)
    chunks(m, QUIET_CHUNKS - 1)
    watch_of(m.plan(T0))
    m.polled(T0, PollAnswer("0123456789abcdef-2", (RunReport("run0", True, False),)))  # word of run0
    m.upsert(OpenTask("t1", "running", "th1", "run1", False, "box"))  # t1 changed here
    assert chunks(m, 1) == [NoteQuiet(("t2",), QUIET_CHUNKS)]
    assert chunks(m, QUIET_CHUNKS - 1) == [NoteQuiet(("t0", "t1"), QUIET_CHUNKS)]


def test_an_ended_task_is_not_noted() -> None:
    m = started(2)
    chunks(m, QUIET_CHUNKS - 1)
    m.drop("t0")
    assert chunks(m, 1) == [NoteQuiet(("t1",), QUIET_CHUNKS)]
