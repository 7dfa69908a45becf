"""Run lifecycle rules, pure: which transitions are allowed, which run starts next, what an
interrupt does, and how startup recovers runs a dead daemon left live.

    queued ──> starting ──> running ──> completed | failed | interrupted
      │           │                       ^
      └───────────┴──> cancelled          └── (starting can also end failed or interrupted)

The run manager asks these functions and then performs the I/O; nothing here touches a store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from peerd.contracts import RunStatus

TERMINAL: frozenset[RunStatus] = frozenset({"completed", "failed", "cancelled", "interrupted"})
LIVE: frozenset[RunStatus] = frozenset({"starting", "running"})

_ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    "queued": frozenset({"starting", "cancelled"}),
    "starting": frozenset({"running", "failed", "interrupted", "cancelled"}),
    "running": frozenset({"completed", "failed", "interrupted"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "interrupted": frozenset(),
}

RECOVERY_REASON = "The daemon stopped while this run was live; it was interrupted."
SHUTDOWN_REASON = "The daemon shut down while this run was live; it was interrupted."


class InvalidTransition(ValueError):
    pass


def is_terminal(status: RunStatus) -> bool:
    return status in TERMINAL


def is_live(status: RunStatus) -> bool:
    return status in LIVE


def check_transition(current: RunStatus, new: RunStatus) -> RunStatus:
    """Return `new` if a run may go from `current` to it; a terminal status is final."""
    if new not in _ALLOWED[current]:
        raise InvalidTransition(f"a run cannot go from {current} to {new}")
    return new


@dataclass(frozen=True)
class RunView:
    """The little a decision needs to know about a run."""

    id: str
    number: int
    status: RunStatus


def next_to_start(runs: Sequence[RunView], *, queue_held: bool, archived: bool) -> str | None:
    """The run to start now: the oldest queued one, only when nothing is live and the queue flows."""
    if queue_held or archived or any(is_live(r.status) for r in runs):
        return None
    queued = [r for r in runs if r.status == "queued"]
    return min(queued, key=lambda r: r.number).id if queued else None


@dataclass(frozen=True)
class InterruptPlan:
    target_run: str | None
    hold_queue: bool
    outcome: Literal["interrupt_requested", "no_active_run"]


def plan_interrupt(runs: Sequence[RunView], *, stop: bool) -> InterruptPlan:
    """Interrupt the live run, if any; `stop` also holds the queue so nothing queued starts."""
    live = [r for r in runs if is_live(r.status)]
    if live:
        return InterruptPlan(max(live, key=lambda r: r.number).id, stop, "interrupt_requested")
    return InterruptPlan(None, stop, "no_active_run")


def recover_at_startup(runs: Sequence[RunView]) -> list[tuple[str, RunStatus, str]]:
    """Runs that were live when the daemon died are interrupted, with the reason recorded."""
    return [(r.id, "interrupted", RECOVERY_REASON) for r in runs if is_live(r.status)]
