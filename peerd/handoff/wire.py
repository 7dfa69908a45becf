"""The wire models and typed errors of a thread's move to a linked environment (`peerd thread
move`, the `thread_move` tool, `/v1/threads/{id}/move`, and the box's side of it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from peerd import contracts as c
from peerd.contracts import MovedRef as MovedRef  # noqa: PLC0414  # re-exported for the handoff modules
from peerd.core.moves import MoveState as MoveState  # noqa: PLC0414  # the states' table is core's

# `not-yours`: the branch there belongs to someone else by the ownership ledger (core/ownership.py).
BranchOutcome = Literal["absent", "same", "fast-forward", "diverged", "checked-out", "not-yours"]

MAX_MOVE_MESSAGE_CHARS = 8_000
# A move's id names refs (`refs/peerd/moved/<id>`): peerd's own ids only.
MOVE_ID = r"^mov_[0-9a-f]{20}$"
SHA = r"^[0-9a-f]{40,64}$"


class ThreadMove(c.Input):
    to: str | None = Field(default=None, min_length=1, max_length=200)
    message: str | None = Field(default=None, min_length=1, max_length=MAX_MOVE_MESSAGE_CHARS)
    interrupt: bool = False
    dry_run: bool = False
    client_request_id: str | None = c.ClientRequestId


class Candidate(c.Wire):
    """One linked environment as a dry run sees it."""

    environment_id: str
    label: str
    fits: bool
    reason: str  # why not, or what the thread there would be
    project_id: str | None = None  # the project there with the same repository


class MoveInfo(c.Wire):
    move_id: str
    thread_id: str
    environment_id: str
    state: MoveState
    started_by: str
    message: str | None = None
    snapshot: str | None = None  # the commit that carries the thread's work
    branch_there: str | None = None  # the thread there's branch
    kept_ref: str | None = None  # refs/peerd/moved/<id> there when the branch there had diverged
    moved_to: MovedRef | None = None
    error: str | None = None
    created_at: float
    updated_at: float
    replayed: bool = False


class MoveAnswer(c.Wire):
    """`POST /v1/threads/{id}/move`: the move (not on a dry run) and the candidates (a dry run)."""

    move: MoveInfo | None = None
    candidates: list[Candidate] | None = None


# --- the box's side -------------------------------------------------------------------------------


class TakeCheck(c.Input):
    repository_key: str = Field(min_length=1, max_length=2000)
    provider: str = Field(min_length=1, max_length=64)


class TakeAnswer(c.Wire):
    project_id: str | None
    provider_installed: bool
    provider_allowed: bool
    providers: list[str]  # installed here
    access: c.RuntimeMode  # the calling link's level here


class BranchLanding(c.Input):
    move_id: str = Field(pattern=MOVE_ID)
    branch: str = Field(pattern=r"^(orchestrate|peerd)/[A-Za-z0-9._/-]{1,200}$")
    tip: str = Field(pattern=SHA)


class BranchLanded(c.Wire):
    outcome: BranchOutcome
    branch: str | None  # the branch the thread there takes (None: one of its own, peerd/<thread>)
    kept_ref: str | None = None
    # Who the branch there belongs to when it was left as it is for being someone else's.
    owner: str | None = None


class MovedFrom(c.Input):
    environment_id: str = Field(min_length=1, max_length=64)
    thread_id: str = Field(min_length=1, max_length=64)
