"""A thread's move: its states and the transitions between them, pure (as `core/runs.py` is for
runs). The store changes a move's state only through this table (`handoff/store.py:_move_to`),
and names states in SQL only through the constants here (`store/sqltext.py:sql_list`).

    waiting ──(the commit point)──> moving ──(the thread there exists)──> moved
       │                              │
       ├──(a message; archived)──> cancelled
       └──(a final refusal)──────────┴──> failed

`moved`, `cancelled` and `failed` are final. The rules of when each transition happens are in
`handoff/machine.py`.
"""

from __future__ import annotations

from typing import Literal

MoveState = Literal["waiting", "moving", "moved", "cancelled", "failed"]

FIRST: MoveState = "waiting"  # a move is recorded waiting, before anything leaves
# Ordered as the partial indexes of migration 16 list them: SQLite uses such an index only for a
# query whose IN list is the index's own, in the same order (tests/handoff/test_move_states.py).
UNFINISHED: tuple[MoveState, ...] = ("waiting", "moving")  # `moves_unfinished`: a driver owes them
HELD: tuple[MoveState, ...] = ("waiting", "moving", "moved")  # `moves_open`: one per thread, ever
TERMINAL: frozenset[MoveState] = frozenset({"moved", "cancelled", "failed"})

TRANSITIONS: dict[MoveState, frozenset[MoveState]] = {
    "waiting": frozenset({"moving", "cancelled", "failed"}),
    "moving": frozenset({"moved", "failed"}),  # after the commit point a message cannot cancel it
    "moved": frozenset(),
    "cancelled": frozenset(),
    "failed": frozenset(),
}


class InvalidTransition(ValueError):
    pass


def can_transition(current: MoveState, new: MoveState) -> bool:
    return new in TRANSITIONS[current]


def check_transition(current: MoveState, new: MoveState) -> MoveState:
    """`new` if a move may go from `current` to it; a final state is final."""
    if not can_transition(current, new):
        raise InvalidTransition(f"a move cannot go from {current} to {new}")
    return new
