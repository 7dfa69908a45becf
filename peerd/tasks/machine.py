"""The follower's rules, pure: one link's open remote tasks, driven to their end.

The I/O shell (`peerd.tasks.follower`) reads the link's open tasks, asks `plan` for the next step,
performs the actions it gets, and feeds back what happened. Time comes in as `now` from the one
injected clock; the jitter is injected too. Nothing here touches a socket, the store or a timer.

    plan(now, open tasks) -> the next step, one of:
        Exit                         nothing open on the link (a stored backoff is cleared)
        Sleep(until)                 backing off (the box, or this daemon's store): until then
        Relaunch(ids)                launches the box has not answered (same key: the same launch)
        DeliverStops(ids)            stops owed to threads there
        EndTask... (NO_RUN)          running tasks that name no run there
        Watch(batches, deadline)     ONE long-poll per 1,000 running tasks, answered by `deadline`
    events, each returning actions (SaveBackoff, NoteError, EndTask, ReadResult, DropStop, CheckLink):
        answered(now)                any successful exchange with the box: the backoff is over
        watched(now, runs)           the watch answered: lost runs end, settled ones are read
        result_read(read, reply)     the settled run's reply: the task ends with the result
        failed(now, code, message)   a call failed with a typed code (`rules.classify`)
        overdue(now)                 the watch's deadline passed unanswered (a black hole)
        store_failed(now)            this daemon's store raised: the step is retried later
        crashed(now)                 a bug: the step is retried in 5 s
        poked(now)                   new work or a link change here

Backoff: 2 s, 4 s ... 5 min plus jitter, without an attempt limit; any answer from the box ends it
at once (`answered`), so results arrive as soon as the box is back, not when the backoff ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from peerd.tasks.rules import (
    TaskStatus,
    backoff_delay,
    classify,
    is_task_terminal,
    result_text,
    store_retry_delay,
    task_status_from_run,
)

WATCH_BATCH = 1000  # runs per watch request (the contract's limit)
CRASH_RETRY_S = 5.0
NO_RUN = "The thread in the linked environment has no run to follow."


def watch_margin(chunk_s: float) -> float:
    """How long an answer may take to arrive after the box's wait ended: a tenth of the chunk,
    1 s to 5 s, and at most half of it. The box is asked to wait the chunk less this margin, so an
    unanswered watch is noticed when the chunk is over (a black hole within one chunk)."""
    return min(5.0, max(1.0, chunk_s / 10), chunk_s / 2)


def no_answer(label: str, seconds: float) -> str:
    return f"{label} accepted the connection but did not answer within {seconds:.0f} s."


def not_found(label: str) -> str:
    return f"The thread in {label} was not found; it may have been removed."


@dataclass(frozen=True)
class OpenTask:
    """What the follower knows of one open task (or one with a stop still owed)."""

    id: str
    status: str
    child_thread_id: str | None
    child_run_id: str | None
    stop_owed: bool
    label: str


@dataclass(frozen=True)
class RunReport:
    """One watched run as the box reported it."""

    run_id: str
    found: bool
    settled: bool
    status: str | None = None
    reason: str | None = None
    result_run_id: str | None = None


# --- actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    pass


@dataclass(frozen=True)
class Sleep:
    until: float


@dataclass(frozen=True)
class Relaunch:
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class DeliverStops:
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class WatchRef:
    task_id: str
    thread_id: str
    run_id: str


@dataclass(frozen=True)
class Watch:
    batches: tuple[tuple[WatchRef, ...], ...]
    timeout: float  # what the box is asked to wait at most
    deadline: float  # when an unanswered watch counts as a failure


@dataclass(frozen=True)
class EndTask:
    task_id: str
    status: TaskStatus
    result: str


@dataclass(frozen=True)
class ReadResult:
    """Read the settled run's last reply there, then feed it to `result_read`."""

    task_id: str
    thread_id: str
    result_run_id: str
    status: str | None
    reason: str | None
    label: str


@dataclass(frozen=True)
class DropStop:
    """A stop that can never be delivered (the link is gone): clear it, saying why."""

    task_id: str
    error: str


@dataclass(frozen=True)
class SaveBackoff:
    attempts: int  # 0 clears the stored backoff
    next_at: float
    error: str | None


@dataclass(frozen=True)
class NoteError:
    task_ids: tuple[str, ...]
    error: str


@dataclass(frozen=True)
class CheckLink:
    """Look at the link here (no network): forgotten or revoked meanwhile is a `failed` event."""


Action = (
    Exit
    | Sleep
    | Relaunch
    | DeliverStops
    | Watch
    | EndTask
    | ReadResult
    | DropStop
    | SaveBackoff
    | NoteError
    | CheckLink
)


@dataclass
class FollowerMachine:
    chunk_s: float
    jitter: Callable[[], float]
    attempts: int = 0  # failed tries since the box last answered (stored: survives restarts)
    next_at: float = 0.0  # no try before this (stored)
    store_failures: int = 0  # this daemon's store raised (kept in memory only: it cannot be stored)
    store_retry_at: float = 0.0
    watch_deadline: float | None = None
    _open: tuple[OpenTask, ...] = field(default=())

    @property
    def label(self) -> str:
        return self._open[0].label if self._open else "the linked environment"

    def restore(self, attempts: int, next_at: float) -> None:
        """The backoff stored by an earlier follower (before a restart, say)."""
        self.attempts, self.next_at = attempts, next_at

    # --- the next step ---------------------------------------------------------------------------

    def plan(self, now: float, open_tasks: Sequence[OpenTask]) -> list[Action]:
        self._open = tuple(open_tasks)
        if not open_tasks:
            return [SaveBackoff(0, 0.0, None), Exit()] if self.attempts else [Exit()]
        until = max(self.next_at, self.store_retry_at)
        if now < until:
            return [Sleep(until)]
        pending = tuple(t.id for t in open_tasks if t.child_thread_id is None)
        if pending:
            return [Relaunch(pending)]
        stops = tuple(t.id for t in open_tasks if t.stop_owed)
        if stops:
            return [DeliverStops(stops)]
        running = [t for t in open_tasks if t.status == "running"]
        lost = [EndTask(t.id, "failed", NO_RUN) for t in running if t.child_run_id is None]
        if lost:
            return list(lost)
        refs = [WatchRef(t.id, t.child_thread_id or "", t.child_run_id or "") for t in running]
        if not refs:
            return [Sleep(now + self.chunk_s)]  # nothing this follower can do now; look again later
        batches = tuple(tuple(refs[i : i + WATCH_BATCH]) for i in range(0, len(refs), WATCH_BATCH))
        self.watch_deadline = now + self.chunk_s
        return [Watch(batches, self.chunk_s - watch_margin(self.chunk_s), self.watch_deadline)]

    def step_done(self) -> None:
        """A step went through without a store fault: the store works again."""
        self.store_failures, self.store_retry_at = 0, 0.0

    # --- events ----------------------------------------------------------------------------------

    def answered(self, now: float) -> list[Action]:
        if not self.attempts and not self.next_at:
            return []
        self.attempts, self.next_at = 0, 0.0
        return [SaveBackoff(0, 0.0, None)]

    def poked(self, now: float) -> list[Action]:
        """New work interrupts a watch (the shell re-plans at once) but not a backoff: the box was
        not answering. While backing off, only the link itself is looked at again here."""
        return [CheckLink()] if now < self.next_at else []

    def watched(self, now: float, runs: Sequence[RunReport], refs: Sequence[WatchRef]) -> list[Action]:
        self.watch_deadline = None
        actions = self.answered(now)
        by_run = {r.run_id: r for r in refs}
        label = {t.id: t.label for t in self._open}
        for run in runs:
            ref = by_run.get(run.run_id)
            if ref is None:
                continue
            where = label.get(ref.task_id, self.label)
            if not run.found:
                actions.append(EndTask(ref.task_id, "failed", not_found(where)))
            elif run.settled:
                result_run = run.result_run_id or run.run_id
                actions.append(
                    ReadResult(ref.task_id, ref.thread_id, result_run, run.status, run.reason, where)
                )
        return actions

    def result_read(self, read: ReadResult, reply: str | None) -> list[Action]:
        status = task_status_from_run(read.status or "")
        return [EndTask(read.task_id, status, result_text(read.status, reply, read.reason, where=read.label))]

    def failed(self, now: float, code: str, message: str, *, task_id: str | None = None) -> list[Action]:
        """A call failed with a typed code: back off, end the link's tasks, or end this one task."""
        self.watch_deadline = None
        kind = classify(code)
        if kind == "transient":
            self.attempts += 1
            self.next_at = now + backoff_delay(self.attempts, self.jitter())
            ids = tuple(t.id for t in self._open)
            return [SaveBackoff(self.attempts, self.next_at, message), NoteError(ids, message)]
        if kind == "task" and task_id is not None:
            return [EndTask(task_id, "failed", message)]
        return self._fail_link(message)  # the link refuses us, or the watch itself was refused

    def overdue(self, now: float) -> list[Action]:
        """The watch was not answered by its deadline: a black hole, noticed within one chunk."""
        if self.watch_deadline is None or now < self.watch_deadline:
            return []
        return self.failed(now, "unreachable", no_answer(self.label, self.chunk_s))

    def store_failed(self, now: float) -> list[Action]:
        """This daemon's store raised (full disk, say): nothing is lost, the step is retried later.
        Nothing is written about it: the store is what fails."""
        self.watch_deadline = None
        self.store_failures += 1
        self.store_retry_at = now + store_retry_delay(self.store_failures, self.jitter())
        return []

    def crashed(self, now: float) -> list[Action]:
        self.watch_deadline = None
        self.attempts += 1
        self.next_at = now + CRASH_RETRY_S
        return [SaveBackoff(self.attempts, self.next_at, "internal error")]

    def _fail_link(self, message: str) -> list[Action]:
        actions: list[Action] = []
        for task in self._open:
            if not is_task_terminal(task.status):
                actions.append(EndTask(task.id, "failed", message))
            if task.stop_owed:  # nothing can be stopped through a dead link; say so and stop trying
                actions.append(DropStop(task.id, f"The stop could not be delivered: {message}"))
        return actions
