"""A delegated task's rules, pure: its status, first result wins, when the parent is woken, when
the child's work has settled and which reply is the result, how to back off, and which failures
end a task (or all of a link's tasks) at once.

    pending ──launch answered──> running ──settled──> completed | failed | cancelled | interrupted
       │                            │
       └──terminal failure──────────┴──> failed (with the reason)

A task ends once. A later or duplicate report is refused and wakes nobody. Failures are sorted by
their typed error code (`classify`), never by their message.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

from peerd.core.backoff import Backoff
from peerd.core.runs import RunFact
from peerd.errors import Failure as Failure  # noqa: PLC0414  # the registry's, re-exported here
from peerd.errors import PeerdError, StorageUnavailable
from peerd.errors import classify as classify  # noqa: PLC0414  # the registry's, re-exported here

TaskStatus = Literal["pending", "running", "completed", "failed", "cancelled", "interrupted"]
Wake = Literal["always", "settled_only"]
TASK_TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "interrupted"})

# A link whose box does not answer: 2 s, 4 s, 8 s ... 5 minutes, plus up to 1 s of jitter, with no
# attempt limit (any answer from the box ends it). Stored with its delay (`link_backoff.delay_s`).
LINK_BACKOFF = Backoff(first=2.0, cap=300.0, jitter=1.0)
# This daemon's store failed (full disk, say): 2 s ... 30 s, plus jitter. A local retry costs
# nothing, and freed space should be noticed soon.
STORE_RETRY = Backoff(first=2.0, cap=30.0, jitter=1.0)
# A waiting tool call returns before MCP clients give up on it (Codex: 60 s by default).
WAIT_CAP_S = 45.0


def is_task_terminal(status: str) -> bool:
    return status in TASK_TERMINAL


@dataclass(frozen=True)
class Completion:
    status: TaskStatus
    result: str


def complete(current: str, status: TaskStatus, result: str) -> Completion | None:
    """First result wins: a task that already ended refuses every later report (returns None)."""
    if is_task_terminal(current) or not is_task_terminal(status):
        return None
    return Completion(status, result)


def should_wake(wake: Wake | str, *, parent_live: bool) -> bool:
    """`always` wakes the parent with a new run; `settled_only` (a waiting tool call is there to
    take the result) only when the parent has no live run left to take it."""
    return wake == "always" or not parent_live


def wake_due(
    wake: Wake | str, *, parent_status: str | None, queue_held: bool, parent_live: bool, wanted: bool = True
) -> bool:
    """Does the task's ending make a wake run on its parent (decided in the ending's transaction)?

    Not for a parent that is gone, archived or stopped (a Stop holds the queue and drops pending
    wakes); not when the caller learns the outcome from its own call (`wanted=False`: a dispatch
    that failed at once); otherwise as `should_wake` says."""
    if not wanted or parent_status != "active" or queue_held:
        return False
    return should_wake(wake, parent_live=parent_live)


def wake_text(task_ids: list[str]) -> str:
    if len(task_ids) == 1:
        return (
            f"Delegated task {task_ids[0]} reached a terminal state. "
            f"Use task_status with taskId {task_ids[0]} to read the result."
        )
    joined = ", ".join(task_ids)
    return f"Delegated tasks {joined} reached terminal states. Use task_status with each taskId to read the results."


def role_prompt(role: str | None, task: str) -> str:
    if role is None or role == "general":
        return task
    return f"Act as the {role} sub-agent for this task.\n\n{task}"


def backoff_wait(attempts: int, next_at: float, delay_s: float | None, wall_now: float) -> float:
    """After a restart: how long a stored backoff still holds, never longer than its delay.

    The store keeps the delay and the wall time of the next try (the wall time it was decided at
    plus the delay). What is left is `next_at - wall_now` bounded to [0, delay]: a wall clock
    stepped back (600 s, say) cannot stretch the wait past the delay itself, and one stepped
    forward ends it (a try now is cheap). A row without its delay (an older release's) is bounded
    by the most its attempts allow (`LINK_BACKOFF.longest`)."""
    bound = LINK_BACKOFF.longest(attempts) if delay_s is None else max(delay_s, 0.0)
    return min(max(next_at - wall_now, 0.0), bound)


def task_status_from_run(run_status: str) -> TaskStatus:
    """A child's terminal run status as the task's; anything unknown counts as cancelled."""
    if run_status in ("completed", "failed", "interrupted", "cancelled"):
        return run_status  # type: ignore[return-value]  # checked against the literal above
    return "cancelled"


def cancel_result(reason: str | None) -> str:
    return f"Cancelled: {reason}" if reason else "Cancelled."


def stopped_with_parent(reason: str | None) -> str:
    return f"Stopped with its parent: {reason}" if reason else "Stopped with its parent."


def result_text(
    status: str | None, reply: str | None, reason: str | None, *, where: str | None = None
) -> str:
    """The task's result from its result run: one policy for local and remote children.

    A failed run's result is its reason (the provider's error), else its reply; any other run's is
    its reply, else its reason. `where` names the linked environment the child ran in."""
    there = f" in {where}" if where else ""
    if status == "failed":
        return reason or reply or f"The child run{there} failed."
    return reply or reason or f"(The child thread{there} ended without a reply.)"


# --- settlement ----------------------------------------------------------------------------------

# Runs of a child thread that carry on its own delegated work: wake runs (its own tasks ended) and
# continuations (a run cut by a daemon stop, continued in its session after the restart). Runs a
# user or another caller sent to the child ("user") are never the task's result.
CHILD_WORK_ORIGINS: frozenset[str] = frozenset({"wake", "continue"})


def is_terminal_run(status: str) -> bool:
    return status in ("completed", "failed", "cancelled", "interrupted")


def settlement(
    launched: RunFact, runs: list[RunFact], *, open_children: bool, queue_held: bool
) -> tuple[bool, RunFact]:
    """Is the delegated work done, and which run's reply is its result?

    The launched run's own reply, unless the child carried on with runs of its own work (wakes of
    its own delegations, continuations after a restart): then it is done only when those ended and
    its own delegations settled, and the result is the last of those runs. A later run someone
    else started is never taken as the result.
    """
    if not is_terminal_run(launched.status) or open_children:
        return False, launched
    own = [r for r in runs if r.origin in CHILD_WORK_ORIGINS and r.number > launched.number]
    if not queue_held and any(not is_terminal_run(r.status) for r in own):
        return False, launched
    done = [r for r in own if is_terminal_run(r.status)]
    return True, max(done, key=lambda r: r.number) if done else launched


# --- failures, by typed code -----------------------------------------------------------------------

# `classify` (peerd/errors.py) sorts a failure by its code, from the error classes' own flags:
# `transient` (back off and retry without limit: the box did not answer or answered 5xx, this
# daemon's store or the box cannot serve now, the box runs an older peerd than is needed), the
# whole link (`ends_link`: revoked, expired, read-only, forgotten here, another certificate or
# environment; every open task of the link ends with the reason), else the one task.
STORE_FAULT = StorageUnavailable.code


def error_code(exc: BaseException) -> str:
    """The typed code of a failure; a raw SQLite operational error (full, locked, read-only) is a
    store fault until the store layer types it; anything else is a bug (`internal_error`)."""
    if isinstance(exc, PeerdError):
        return exc.code
    if isinstance(exc, sqlite3.OperationalError):
        return STORE_FAULT
    return "internal_error"


def is_store_fault(exc: BaseException) -> bool:
    return error_code(exc) == STORE_FAULT
