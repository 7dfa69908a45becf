"""Owned, owed or ending: the invariant every open record keeps, and the sweep's decision (pure).

Every non-terminal run, task, approval and move is, at any moment, one of:

- **owned by live work**: a run this daemon is executing (its run manager holds it); a pending
  question of a live run; a local task whose child thread has a live run; a remote task (the
  link's follower drives it, with backoff, until the box answers); a move its driver runs;
- **covered by owed queued work**: a queued run on a thread whose queue flows (the run manager
  starts it); a local task whose child thread has a run queued (a continuation, a wake);
- **on a bounded clock toward an end**: a run recorded `starting` for less than
  `STARTING_GRACE_S` (its task is being made); a pending question's deadline (it expires);
  a queued run on a held queue (a person's or a parent's Stop: the owner's to release).

`sweep` reads a snapshot of the open rows and what this daemon is running (`Owners`) and returns
the records that break it, each with the fix that ends or re-owns it:

- a run `starting`/`running` that no run task of this daemon holds (past the grace, for
  `starting`): `cut_run`, interrupted as a daemon stop cuts it and continued where the run rules say;
- queued runs of a thread with nothing live there, its queue flowing, queued past the grace:
  `start_queue`, the run manager is asked to start them;
- a `pending` question whose run is not live and that no gate waits on: `withdraw_approval`;
- a local task `pending`/`running` whose child thread has nothing live or queued and no open
  task of its own: `settle_task`, the task's own settlement decides;
- a remote task whose link is gone here: `end_task`, failed, naming the link;
- a move `waiting`/`moving` its driver is not running: `resume_move`.

Nothing here reads a clock or a store: the shell (`peerd/runtime/sweep.py`) gives `now`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from peerd.core.moves import UNFINISHED

LIVE_RUN = frozenset({"starting", "running"})
OPEN_TASK = frozenset({"pending", "running"})
OPEN_MOVE = frozenset(UNFINISHED)
# A run is recorded `starting` a moment before its task exists; a queued run a moment before the
# run manager is asked to start it. Younger than this, neither is anybody's fault yet.
STARTING_GRACE_S = 30.0

ORPHAN_RUN = (
    "peerd found this run recorded live with no process of this daemon running it; it was "
    "interrupted (the sweep of open work)."
)
ORPHAN_QUESTION = (
    "the run that asked is no longer live (a restart of peerd cut it, or it ended); the question was "
    "withdrawn. If the work goes on, it asks again."
)

Action = Literal[
    "cut_run", "start_queue", "withdraw_approval", "settle_task", "end_task", "resume_move", "resume_wait"
]


@dataclass(frozen=True)
class OpenRun:
    id: str
    thread_id: str
    status: str  # queued, starting, running
    since: float  # started_at (or created_at when it has none)
    queue_held: bool = False
    archived: bool = False


@dataclass(frozen=True)
class OpenApproval:
    id: str
    run_id: str
    run_status: str | None  # None: the run is gone


@dataclass(frozen=True)
class OpenTask:
    id: str
    status: str
    target_env: str | None  # None: a local child
    child_thread_id: str | None = None
    child_busy: bool = False  # the child thread has a run live or queued
    link_known: bool = True  # for a remote task: its link still exists here


@dataclass(frozen=True)
class OpenMove:
    id: str
    state: str


@dataclass(frozen=True)
class OpenWait:
    id: str  # a wait on a pull request still `watching` (peerd/waits/)


@dataclass(frozen=True)
class Snapshot:
    now: float
    runs: Sequence[OpenRun] = ()
    approvals: Sequence[OpenApproval] = ()
    tasks: Sequence[OpenTask] = ()
    moves: Sequence[OpenMove] = ()
    waits: Sequence[OpenWait] = ()


@dataclass(frozen=True)
class Owners:
    """What this daemon is doing right now: the live owners of open records."""

    runs: frozenset[str] = field(default_factory=frozenset)  # runs its run manager executes
    questions: frozenset[str] = field(default_factory=frozenset)  # approvals a gate waits on
    moves: frozenset[str] = field(default_factory=frozenset)  # moves its driver runs
    waits: frozenset[str] = field(default_factory=frozenset)  # waits a watcher of it drives


@dataclass(frozen=True)
class Fix:
    action: Action
    id: str  # the record's id (for start_queue and settle_task: the thread's)
    reason: str


def sweep(snapshot: Snapshot, owners: Owners, *, grace_s: float = STARTING_GRACE_S) -> list[Fix]:
    """The open records nothing owns, owes or ends, each with its fix (see the module's table)."""
    fixes: list[Fix] = []
    now = snapshot.now
    live_threads: set[str] = set()
    for run in snapshot.runs:
        if run.status not in LIVE_RUN:
            continue
        live_threads.add(run.thread_id)
        young = run.status == "starting" and now - run.since < grace_s
        if run.id not in owners.runs and not young:
            fixes.append(Fix("cut_run", run.id, ORPHAN_RUN))
    waiting: set[str] = set()
    for run in snapshot.runs:
        if run.status != "queued" or run.queue_held or run.archived or run.thread_id in live_threads:
            continue
        if now - run.since >= grace_s and run.thread_id not in waiting:
            waiting.add(run.thread_id)
            fixes.append(
                Fix("start_queue", run.thread_id, "a queued run waited with nothing live on its thread")
            )
    for approval in snapshot.approvals:
        if approval.run_status not in LIVE_RUN and approval.id not in owners.questions:
            fixes.append(Fix("withdraw_approval", approval.id, ORPHAN_QUESTION))
    settled: set[str] = set()
    for task in snapshot.tasks:
        if task.status not in OPEN_TASK:
            continue
        if task.target_env is None:
            child = task.child_thread_id
            if child is not None and not task.child_busy and child not in settled:
                settled.add(child)
                fixes.append(
                    Fix("settle_task", child, f"task {task.id}: its child has nothing live or queued")
                )
        elif not task.link_known:
            fixes.append(
                Fix(
                    "end_task",
                    task.id,
                    f"The link to {task.target_env} is gone from this machine; the task cannot be followed.",
                )
            )
    for move in snapshot.moves:
        if move.state in OPEN_MOVE and move.id not in owners.moves:
            fixes.append(Fix("resume_move", move.id, "an unfinished move nobody was driving"))
    for wait in snapshot.waits:
        if wait.id not in owners.waits:
            fixes.append(Fix("resume_wait", wait.id, "a wait on a pull request nobody was watching"))
    return fixes
