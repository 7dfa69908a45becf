"""Delegated-task rules, pure: first result wins, when to wake the parent, how to back off,
which failures end a task at once.

    pending ──launch answered──> running ──result──> completed | failed | cancelled | interrupted
       │                            │
       └──terminal failure──────────┴──> failed (with the reason)

A task ends once. A later or duplicate report is refused and wakes nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TaskStatus = Literal["pending", "running", "completed", "failed", "cancelled", "interrupted"]
Wake = Literal["always", "settled_only"]
TASK_TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "interrupted"})

BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 300.0
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


def should_wake(wake: Wake, *, parent_live: bool) -> bool:
    """`always` wakes the parent with a new run; `settled_only` (a waiting tool call is there to
    take the result) only when the parent has no live run left to take it."""
    return wake == "always" or not parent_live


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


def backoff_delay(attempts: int, jitter: float) -> float:
    """2 s, 4 s, 8 s ... capped at 5 minutes, plus up to 1 s of jitter (`jitter` in [0, 1))."""
    exponent = max(attempts - 1, 0)
    base = BACKOFF_MAX_S if exponent > 16 else min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**exponent)
    return base + jitter


def task_status_from_run(run_status: str) -> TaskStatus:
    """A child's terminal run status as the task's; anything unknown counts as cancelled."""
    if run_status in ("completed", "failed", "interrupted", "cancelled"):
        return run_status  # type: ignore[return-value]  # checked against the literal above
    return "cancelled"


def cancel_result(reason: str | None) -> str:
    return f"Cancelled: {reason}" if reason else "Cancelled."


@dataclass(frozen=True)
class RunFact:
    id: str
    number: int
    status: str
    origin: str  # "user" or "wake"
    reason: str | None = None


def settlement(
    launched: RunFact, runs: list[RunFact], *, open_children: bool, queue_held: bool
) -> tuple[bool, RunFact]:
    """Is the delegated work done, and which run's reply is its result?

    The launched run's own reply, unless the child delegated work of its own: then it is done only
    when that work settled and the wake runs it caused ended, and the result is the last of those.
    A later run someone else started is never taken as the result.
    """
    if not is_terminal_run(launched.status) or open_children:
        return False, launched
    wakes = [r for r in runs if r.origin == "wake" and r.number > launched.number]
    if not queue_held and any(not is_terminal_run(r.status) for r in wakes):
        return False, launched
    done = [r for r in wakes if is_terminal_run(r.status)]
    return True, max(done, key=lambda r: r.number) if done else launched


def is_terminal_run(status: str) -> bool:
    return status in ("completed", "failed", "cancelled", "interrupted")
