"""An orchestration's and a packet's states, and the packet's transitions, pure (as `core/moves.py`
is for a thread's move). The store changes a packet's state only along this table, by
compare-and-set in its write transaction (`orchestrate/store.py:update_packet`), and names states in
SQL only through the constants here (`store/sqltext.py:sql_list`).

A packet:

    queued ──> implementing ──> verifying ──> reviewing ──> approved ──> integrated
                 ^  │  ^           │              │            │
                 └──┘  └───────────┴──────────────┘            │   (a re-dispatch; a fix; changes)
    every state but approved ──> parked | cancelled;  approved ──> parked (a merge conflict)

`integrated`, `parked` and `cancelled` are final: `parked` is "stopped after its retry, reported
with its failure output verbatim" (a dependency that did not make it parks its dependents too).

An orchestration:

    planning ──> running ──> integrating ──> completed | not_integrated | check_failed
       └────────────┴────────────┴──> failed | cancelling ──> cancelled
    integrating ──> waiting (--until: on its pull request) ──> completed | failed | running (a fix)

`completed`, `not_integrated`, `check_failed`, `failed` and `cancelled` are final. A run that
reached its integration ends by what the integration found (`end_state`): `not_integrated` when it
merged no packet, `check_failed` when the full check failed on what it merged, else `completed`
(some packets may still be parked: the reason names them). A store written by a release before
these two states holds `completed` for such runs, and reads as it was written. Standard library
only: the API models (`orchestrate/models.py`) and the store both take the states from here.
"""

from __future__ import annotations

from typing import Literal

PacketState = Literal[
    "queued", "implementing", "verifying", "reviewing", "approved", "integrated", "parked", "cancelled"
]
PACKET_STATES: tuple[PacketState, ...] = (
    "queued",
    "implementing",
    "verifying",
    "reviewing",
    "approved",
    "integrated",
    "parked",
    "cancelled",
)
FIRST_PACKET: PacketState = "queued"  # a plan's packets are recorded queued
TERMINAL_PACKET: frozenset[PacketState] = frozenset({"integrated", "parked", "cancelled"})
# Where its coder's work is done: what depends on it may start (`approved`), and what it is in a
# merged integration branch (`integrated`).
DONE_PACKET: frozenset[PacketState] = frozenset({"approved", "integrated"})
# What a packet that depends on one in these cannot wait out: it parks too.
FAILED_PACKET: frozenset[PacketState] = frozenset({"parked", "cancelled"})

# The engine moves a packet only along these edges (and may rewrite a state with itself).
TRANSITIONS: dict[PacketState, frozenset[PacketState]] = {
    "queued": frozenset({"implementing", "parked", "cancelled"}),  # parked: a dependency failed
    "implementing": frozenset({"implementing", "verifying", "parked", "cancelled"}),  # re-dispatch
    "verifying": frozenset({"reviewing", "implementing", "parked", "cancelled"}),  # fix
    "reviewing": frozenset({"approved", "implementing", "parked", "cancelled"}),  # changes
    "approved": frozenset({"integrated", "parked"}),  # parked: a merge conflict
    "integrated": frozenset(),
    "parked": frozenset(),
    "cancelled": frozenset(),
}

RunState = Literal[
    "planning",
    "running",
    "integrating",
    "waiting",
    "cancelling",
    "completed",
    "not_integrated",
    "check_failed",
    "failed",
    "cancelled",
]
FIRST_RUN: RunState = "planning"
TERMINAL_RUN: frozenset[RunState] = frozenset(
    {"completed", "not_integrated", "check_failed", "failed", "cancelled"}
)
# The open ones, in the order the engine goes through them (`recover` resumes each).
OPEN_RUN: tuple[RunState, ...] = ("planning", "running", "integrating", "waiting", "cancelling")


def end_state(merged: int, check_passed: bool | None) -> RunState:
    """How a run that reached its integration ends: `not_integrated` when it merged no packet,
    `check_failed` when the full check failed on what it merged (`check_passed` is None when no
    full check ran), else `completed`."""
    if merged == 0:
        return "not_integrated"
    if check_passed is False:
        return "check_failed"
    return "completed"


def can_transition(current: PacketState, new: PacketState) -> bool:
    """Whether a packet may go from `current` to `new` (writing its own state again is no move)."""
    return current == new or new in TRANSITIONS[current]


def may_become(new: PacketState) -> tuple[PacketState, ...]:
    """The states a packet may be in for a write of `new` to land: the compare-and-set's set when
    the writer did not say which state it decided from."""
    return tuple(state for state in PACKET_STATES if can_transition(state, new))
