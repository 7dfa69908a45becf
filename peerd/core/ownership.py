"""Who owns each piece of git state peerd makes or lands: the pure rules of the ledger.

Every ref peerd makes or lands (a thread's branch, an orchestration's `orchestrate/<run>/...`
branches, `refs/peerd/...`, a moved branch), every worktree and every checkout path is recorded
with its **owner** in one table (`store/ownership.py`), in the same transaction as the decision
that makes it and before git is asked to make it. Four kinds of owner:

- the **person** (`person`): the owner of this machine, and of everything peerd did not make - a
  branch in git with no record is the person's;
- a **link** (`link:<client id>`): what a linked machine's work made here (its threads' branches
  and worktrees, what its moves kept);
- an **orchestration** (`orchestration:<run id>`): its integration branch and its packets'
  branches and worktrees;
- a **move** (`move:<move id>`): the snapshot a move keeps alive on the machine it leaves.

The one rule every feature asks before it moves a ref (`may_change`): a caller changes a ref only
when the ledger says it is the caller's, or when the name is new (no record and nothing in git);
anything else is the other owner's and is left exactly as it is (a move keeps its work beside it,
under `refs/peerd/moved/<move id>`, and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OwnerKind = Literal["person", "link", "orchestration", "move"]
OWNER_KINDS: tuple[OwnerKind, ...] = ("person", "link", "orchestration", "move")
# What a record names: a full ref name, a worktree's path, a project's checkout path.
Holding = Literal["ref", "worktree", "checkout"]
# What a caller may do with a ref (`may_change`).
Right = Literal["own", "new", "not_yours"]


@dataclass(frozen=True, slots=True)
class Owner:
    kind: OwnerKind
    id: str = ""

    @classmethod
    def person(cls) -> Owner:
        return cls("person")

    @classmethod
    def link(cls, client_id: str) -> Owner:
        return cls("link", client_id)

    @classmethod
    def orchestration(cls, run_id: str) -> Owner:
        return cls("orchestration", run_id)

    @classmethod
    def move(cls, move_id: str) -> Owner:
        return cls("move", move_id)

    @property
    def key(self) -> str:
        """`person`, `link:<client>`, `orchestration:<run>` or `move:<id>` (as stored and shown)."""
        return self.kind if self.kind == "person" else f"{self.kind}:{self.id}"

    @classmethod
    def from_key(cls, key: str) -> Owner:
        kind, _, ident = key.partition(":")
        if kind not in OWNER_KINDS or (kind == "person") != (ident == ""):
            raise ValueError(f"not an owner: {key!r}")
        return cls(kind, ident)

    def describe(self) -> str:
        return {
            "person": "this machine's owner",
            "link": f"the link {self.id}",
            "orchestration": f"the orchestration {self.id}",
            "move": f"the move {self.id}",
        }[self.kind]


def owner_of_thread(link_origin: str | None, started_by: str | None) -> Owner:
    """Whose a thread's branch and worktree are: the link it came through (everything a link's
    work starts carries the link), else the orchestration that started it, else the person."""
    if link_origin:
        return Owner.link(link_origin)
    if started_by and started_by.startswith("orchestrate:") and len(started_by) > len("orchestrate:"):
        return Owner.orchestration(started_by.removeprefix("orchestrate:"))
    return Owner.person()


def orchestration_of_branch(branch: str) -> Owner | None:
    """The orchestration a branch named `orchestrate/<run>/<packet or integrated>` is for."""
    parts = branch.split("/")
    if len(parts) == 3 and parts[0] == "orchestrate" and parts[1] and parts[2]:
        return Owner.orchestration(parts[1])
    return None


def effective_owner(recorded: Owner | None, exists: bool) -> Owner | None:
    """The owner of a ref: the recorded one; else the person's if git has it (peerd did not make
    it); else nobody's (a new name)."""
    if recorded is not None:
        return recorded
    return Owner.person() if exists else None


def may_change(recorded: Owner | None, *, exists: bool, caller: Owner) -> Right:
    """Whether `caller` may move (fast-forward, delete) a ref: `own` when the ledger says it is the
    caller's (an unrecorded ref in git is the person's), `new` when nobody has it (the caller may
    create it, recording itself), `not_yours` otherwise: left exactly as it is."""
    owner = effective_owner(recorded, exists)
    if owner is None:
        return "new"
    return "own" if owner == caller else "not_yours"
