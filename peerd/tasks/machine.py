"""The follower's rules, pure: one link's open remote tasks, driven to their end through the box's
change feed.

The I/O shell (`peerd.tasks.follower`) loads the link's open tasks once (`load`), tells the
machine when one changes (`upsert`, `drop`), asks `plan` for the next step, performs the actions
it gets, and feeds back what happened. Time comes in as `now` from the one injected clock; the
jitter is injected too. Nothing here touches a socket, the store or a timer. The machine keeps
its indexes as tasks change, so a step costs O(1) in the number of open tasks.

    plan(now) -> the next step, one of:
        Exit                         nothing open on the link (a stored backoff is cleared)
        Sleep(until)                 backing off (the box, or this daemon's store): until then
        Relaunch(ids)                launches the box has not answered (same key: the same launch)
        DeliverStops(ids)            stops owed to threads there
        EndTask... (NO_RUN)          running tasks that name no run there
        Subscribe(delta)             tell the box which runs to follow (changes only, or a hash)
        Poll(cursor, timeout, ...)   ONE long-poll per link for changes after the cursor
        AwaitPoll(deadline)          the poll is in flight: wait for it (new work does not cut it)
    events, each returning actions (SaveBackoff, NoteError, EndTask, ReadResult, DropStop,
    CheckLink, StopPoll):
        answered(now)                any successful exchange with the box: the backoff is over
        subscribed(now, in_sync)     the box took the subscription change (or its set differs)
        polled(now, answer)          the poll answered: settled runs are read, lost ones end
        result_read(read, reply)     the settled run's reply: the task ends with the result
        failed(now, code, message)   a call failed with a typed code (`rules.classify`)
        overdue(now)                 the poll's deadline passed unanswered (a black hole)
        store_failed(now)            this daemon's store raised: the step is retried later
        crashed(now)                 a bug: the step is retried in 5 s
        poked(now)                   new work or a link change here

Backoff (`rules.LINK_BACKOFF`): 2 s, 4 s ... 5 min plus jitter, without an attempt limit; any
answer from the box ends it at once (`answered`), so results arrive as soon as the box is back,
not when the backoff ends.
Every `now` is monotonic (the shell's `clock.monotonic()`, `core/clock.py`): a step of the wall
clock moves no backoff or deadline here. What is stored is the delay (`SaveBackoff.delay_s`); a restart resumes at most
that (`restore`, with `rules.backoff_wait`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from peerd.tasks.actions import (
    Action,
    AwaitPoll,
    CheckLink,
    DeliverStops,
    DropStop,
    EndTask,
    Exit,
    NoteError,
    NoteQuiet,
    OpenTask,
    Poll,
    PollAnswer,
    ReadResult,
    Relaunch,
    RunReport,
    SaveBackoff,
    Sleep,
    StopPoll,
    Subscribe,
)
from peerd.tasks.rules import (
    LINK_BACKOFF,
    STORE_RETRY,
    classify,
    is_task_terminal,
    result_text,
    task_status_from_run,
)
from peerd.tasks.subscription import MAX_FOLLOWED_RUNS, Subscription

__all__ = [  # the actions are re-exported: the machine's callers import them from here
    "Action",
    "AwaitPoll",
    "CheckLink",
    "DeliverStops",
    "DropStop",
    "EndTask",
    "Exit",
    "FollowerMachine",
    "NoteError",
    "NoteQuiet",
    "OpenTask",
    "Poll",
    "PollAnswer",
    "ReadResult",
    "Relaunch",
    "RunReport",
    "SaveBackoff",
    "Sleep",
    "StopPoll",
    "Subscribe",
]

CRASH_RETRY_S = 5.0
QUIET_CHUNKS = 6  # whole chunks with no word of a followed run before a log line says so
NO_RUN = "The thread in the linked environment has no run to follow."


def watch_margin(chunk_s: float) -> float:
    """How long an answer may take to arrive after the box's wait ended: a tenth of the chunk,
    1 s to 5 s, and at most half of it. The box is asked to wait the chunk less this margin, so an
    unanswered poll is noticed when the chunk is over (a black hole within one chunk)."""
    return min(5.0, max(1.0, chunk_s / 10), chunk_s / 2)


def no_answer(label: str, seconds: float) -> str:
    return f"{label} accepted the connection but did not answer within {seconds:.0f} s."


def not_found(label: str) -> str:
    return f"The thread in {label} was not found; it may have been removed."


@dataclass
class FollowerMachine:
    chunk_s: float
    jitter: Callable[[], float]
    max_followed: int = MAX_FOLLOWED_RUNS
    attempts: int = 0  # failed tries since the box last answered (stored: survives restarts)
    next_at: float = 0.0  # no try before this (stored)
    store_failures: int = 0  # this daemon's store raised (kept in memory only: it cannot be stored)
    store_retry_at: float = 0.0
    poll_deadline: float | None = None  # a poll is in flight until answered, failed or stopped
    sub: Subscription = field(default_factory=Subscription)
    _tasks: dict[str, OpenTask] = field(default_factory=dict)
    _pending: dict[str, None] = field(default_factory=dict)  # no thread there yet: (re)launch
    _stops: dict[str, None] = field(default_factory=dict)  # a stop owed to a known thread
    _lost: dict[str, None] = field(default_factory=dict)  # running, but no run there to follow
    _by_run: dict[str, str] = field(default_factory=dict)  # followed (or queued) run -> task
    _queued: dict[str, None] = field(default_factory=dict)  # runs past the cap, in arrival order
    _quiet_since: dict[str, int] = field(default_factory=dict)  # followed run -> `_quiet` then
    _quiet: int = 0  # polls answered with nothing: whole chunks the box had nothing to say
    _noted: str | None = None  # the error last written on the link's tasks
    _leaving: bool = False  # nothing open: the box is told the last changes, then the follower exits

    @property
    def label(self) -> str:
        first = next(iter(self._tasks.values()), None)
        return first.label if first is not None else "the linked environment"

    @property
    def polling(self) -> bool:
        return self.poll_deadline is not None

    @property
    def open_count(self) -> int:
        return len(self._tasks)

    def restore(self, attempts: int, next_at: float) -> None:
        """The backoff stored by an earlier follower (before a restart, say): `next_at` in this
        machine's time (the shell adds the bounded wait left, `rules.backoff_wait`, to `now`)."""
        self.attempts, self.next_at = attempts, next_at

    # --- the link's open tasks, kept in memory --------------------------------------------------------

    def load(self, tasks: Iterable[OpenTask]) -> None:
        """All of the link's open tasks: when the follower starts (the box should still hold their
        runs: the first request checks, by hash), or again after a change of the link here."""
        first = not self._tasks and not self.sub.want and not self.sub.in_flight
        indexes = (self._tasks, self._pending, self._stops, self._lost, self._by_run, self._queued)
        for index in (*indexes, self._quiet_since):
            index.clear()
        runs = [run for run in (self._index(task) for task in tasks) if run is not None]
        if first:
            self.sub.load(runs[: self.max_followed])
            self._queued = dict.fromkeys(runs[self.max_followed :])
            return
        wanted = set(runs)
        for run_id in list(self.sub.want.ids):
            if run_id not in wanted:
                self.sub.unfollow(run_id)
        for run_id in runs:
            if run_id not in self.sub.want:
                self._place(run_id)

    def upsert(self, task: OpenTask) -> None:
        """A task changed here (it was re-read): index it again."""
        self._unindex(task.id)
        run = self._index(task)
        if run is not None:
            self._place(run)

    def drop(self, task_id: str) -> None:
        """A task owes this follower nothing any more (it ended, no stop owed)."""
        self._unindex(task_id)

    def _index(self, task: OpenTask) -> str | None:
        """Index one task; its run there if it is one to follow."""
        self._tasks[task.id] = task
        if task.child_thread_id is None:
            self._pending[task.id] = None
        elif task.stop_owed:
            self._stops[task.id] = None
        if task.status != "running" or task.child_thread_id is None:
            return None
        if task.child_run_id is None:
            self._lost[task.id] = None
            return None
        self._by_run[task.child_run_id] = task.id
        self._quiet_since.pop(task.child_run_id, None)  # to the end: the oldest stays first
        self._quiet_since[task.child_run_id] = self._quiet
        return task.child_run_id

    def _place(self, run_id: str) -> None:
        """Follow the run, or queue it while the link follows its cap of runs."""
        if len(self.sub.want) < self.max_followed:
            self.sub.follow(run_id)
        else:
            self._queued[run_id] = None

    def _unindex(self, task_id: str) -> None:
        task = self._tasks.pop(task_id, None)
        if task is None:
            return
        self._pending.pop(task_id, None)
        self._stops.pop(task_id, None)
        self._lost.pop(task_id, None)
        run = task.child_run_id
        if run is None or self._by_run.get(run) != task_id:
            return
        del self._by_run[run]
        self._quiet_since.pop(run, None)
        if run in self._queued:
            del self._queued[run]
            return
        self.sub.unfollow(run)
        if self._queued:  # room for the oldest waiting run
            oldest = next(iter(self._queued))
            del self._queued[oldest]
            self.sub.follow(oldest)

    # --- the next step ---------------------------------------------------------------------------

    def plan(self, now: float, open_tasks: Sequence[OpenTask] | None = None) -> list[Action]:
        if open_tasks is not None:
            self.load(open_tasks)
        if not self._tasks:
            return self._leave()
        self._leaving = False
        until = max(self.next_at, self.store_retry_at)
        if now < until:
            return [Sleep(until)]
        if self._pending:
            return [Relaunch(tuple(self._pending))]
        if self._stops:
            return [DeliverStops(tuple(self._stops))]
        if self._lost:
            return [EndTask(task_id, "failed", NO_RUN) for task_id in self._lost]
        delta = self.sub.next_delta()
        if delta is not None:
            return [Subscribe(delta)]
        if self.poll_deadline is not None:
            return [AwaitPoll(self.poll_deadline)]
        if not self.sub.want:
            return [Sleep(now + self.chunk_s)]  # nothing this follower can do now; look again later
        self.poll_deadline = now + self.chunk_s
        return [Poll(self.sub.cursor, self.chunk_s - watch_margin(self.chunk_s), self.poll_deadline)]

    def _leave(self) -> list[Action]:
        """Nothing open: stop polling, tell the box the last removals (once), clear the backoff."""
        actions: list[Action] = []
        if self.poll_deadline is not None:
            self.poll_deadline = None
            actions.append(StopPoll())
        if not self._leaving and not self.sub.in_flight:
            self._leaving = True
            delta = self.sub.next_delta()
            if delta is not None and not delta.check_only:
                return [*actions, Subscribe(delta)]
        if self.attempts:
            actions.append(SaveBackoff(0, 0.0, None))
        return [*actions, Exit()]

    def step_done(self) -> None:
        """A step went through without a store fault: the store works (again)."""
        self.store_failures, self.store_retry_at = 0, 0.0

    # --- events ----------------------------------------------------------------------------------

    def answered(self, now: float) -> list[Action]:
        self._noted = None
        if not self.attempts and not self.next_at:
            return []
        self.attempts, self.next_at = 0, 0.0
        return [SaveBackoff(0, 0.0, None)]

    def poked(self, now: float) -> list[Action]:
        """New work does not cut a poll short (it joins the subscription beside it), nor a
        backoff (the box was not answering): while backing off only the link here is looked at."""
        return [CheckLink()] if now < self.next_at else []

    def subscribed(self, now: float, in_sync: bool) -> list[Action]:
        self.sub.confirmed(in_sync)
        return self.answered(now)

    def polled(self, now: float, answer: PollAnswer) -> list[Action]:
        self.poll_deadline = None
        actions = self.answered(now)
        self.sub.polled(answer.cursor, answer.set_hash, answer.resynced)
        if not answer.runs and not answer.resynced:
            actions.extend(self._quiet_chunk())
        for run in answer.runs:
            if self._quiet_since.pop(run.run_id, None) is not None:  # word of it: counted again
                self._quiet_since[run.run_id] = self._quiet
            task_id = self._by_run.get(run.run_id)
            task = None if task_id is None else self._tasks.get(task_id)
            if task is None or task.child_thread_id is None:
                continue  # not ours (any more): nothing to do
            if not run.found:
                actions.append(EndTask(task.id, "failed", not_found(task.label)))
            elif run.settled:
                result_run = run.result_run_id or run.run_id
                read = ReadResult(
                    task.id, task.child_thread_id, result_run, run.status, run.reason, task.label, run.usage
                )
                # The reply came with the report: the task ends now, with no further request.
                actions.extend(self.result_read(read, run.reply) if run.inline else [read])
        return actions

    def _quiet_chunk(self) -> list[Action]:
        """A whole chunk passed with nothing from the box: the runs followed for `QUIET_CHUNKS` of
        them are logged, once each (oldest first: O(those logged), not O(followed))."""
        self._quiet += 1
        quiet: list[str] = []
        for run_id, since in self._quiet_since.items():
            if self._quiet - since < QUIET_CHUNKS:
                break
            quiet.append(run_id)
        for run_id in quiet:
            del self._quiet_since[run_id]
        tasks = tuple(self._by_run[run_id] for run_id in quiet if run_id in self._by_run)
        return [NoteQuiet(tasks, QUIET_CHUNKS)] if tasks else []

    def result_read(self, read: ReadResult, reply: str | None) -> list[Action]:
        status = task_status_from_run(read.status or "")
        text = result_text(read.status, reply, read.reason, where=read.label)
        return [EndTask(read.task_id, status, text, read.usage)]

    def failed(
        self, now: float, code: str, message: str, *, task_id: str | None = None, subscribing: bool = False
    ) -> list[Action]:
        """A call failed with a typed code: back off, end the link's tasks, or end this one task.
        `subscribing`: it was the subscription change in flight (sent again later)."""
        if subscribing:
            self.sub.unconfirmed()
        self.sub.cursor = None  # reports taken but maybe not acted on are asked for again
        kind = classify(code)
        if kind == "task" and task_id is not None:
            return [EndTask(task_id, "failed", message)]
        actions: list[Action] = []
        if self.poll_deadline is not None:
            self.poll_deadline = None
            actions.append(StopPoll())
        if kind == "transient":
            self.attempts += 1
            delay = LINK_BACKOFF.delay(self.attempts, self.jitter())
            self.next_at = now + delay
            actions.append(SaveBackoff(self.attempts, self.next_at, message, delay))
            if message != self._noted:
                self._noted = message
                actions.append(NoteError(message))
            return actions
        return actions + self._fail_link(message)  # the link refuses us, or the feed itself was refused

    def poll_failed(self, now: float, code: str, message: str) -> list[Action]:
        """The poll in flight failed (it is over: nothing to stop)."""
        self.poll_deadline = None
        return self.failed(now, code, message)

    def overdue(self, now: float) -> list[Action]:
        """The poll was not answered by its deadline: a black hole, noticed within one chunk."""
        if self.poll_deadline is None or now < self.poll_deadline:
            return []
        return self.failed(now, "unreachable", no_answer(self.label, self.chunk_s))

    def store_failed(self, now: float) -> list[Action]:
        """This daemon's store raised (full disk, say): nothing is lost, the step is retried later.
        Nothing is written about it: the store is what fails. A poll in flight goes on."""
        self.sub.cursor = None  # a report being acted on may not have been: ask for them again
        self.store_failures += 1
        self.store_retry_at = now + STORE_RETRY.delay(self.store_failures, self.jitter())
        return []

    def crashed(self, now: float) -> list[Action]:
        self.sub.cursor = None
        self.attempts += 1
        self.next_at = now + CRASH_RETRY_S
        actions: list[Action] = [SaveBackoff(self.attempts, self.next_at, "internal error", CRASH_RETRY_S)]
        if self.poll_deadline is not None:
            self.poll_deadline = None
            actions.insert(0, StopPoll())
        return actions

    def _fail_link(self, message: str) -> list[Action]:
        self.sub.forget()
        actions: list[Action] = []
        for task in self._tasks.values():
            if not is_task_terminal(task.status):
                actions.append(EndTask(task.id, "failed", message))
            if task.stop_owed:  # nothing can be stopped through a dead link; say so and stop trying
                actions.append(DropStop(task.id, f"The stop could not be delivered: {message}"))
        return actions
