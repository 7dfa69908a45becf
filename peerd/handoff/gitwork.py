"""The git side of a move: the snapshot commit here, the branch landing there.

**The snapshot** (`snapshot`, on the machine the thread leaves): the thread's commits past its
base, plus its uncommitted edits and untracked (not ignored) files committed on top by peerd, as
one commit whose parent is the worktree's HEAD (`peerd.runtime.git.snapshot`). Its tree is what
the files hold, hashed (`runtime/git/content.py:content_tree`: a temporary index with the
worktree's entries but none of their stat data, so a same-size edit made in the second the
worktree was checked out is taken; a copied index trusted it, issue 26 case 1), so the worktree,
its index and its branch here are not changed: a move that is cancelled or fails leaves the thread
exactly as it was. The commit is kept under `refs/peerd/moving/<move id>` so git never collects it
while the move is open, and is recorded with the move before it is sent (a resumed move sends the
same commit). It travels as a bundle with the orchestration's transport (`GitTransport.send_base`:
the box's ref tips, then `snapshot --not <tips>`).

**The landing** (`land`, on the machine the thread arrives at, asked by the link): the branch of
the thread's name there only moves to a descendant of itself (`machine.landing`). Absent: the
thread there is launched on it. The same commit: nothing. An ancestor of the moved work, not
checked out in any worktree: fast-forwarded. Diverged (or checked out): left exactly as it is,
and the moved work is kept under `refs/peerd/moved/<move id>`. In every case but "absent" the
thread there takes a branch of its own (`peerd/<thread>`, a launch never takes an existing
branch). The branch name must be under `peerd/` or `orchestrate/` (the wire model says so), and
only a branch the ownership ledger gives to the calling link moves at all (`not-yours`
otherwise: an orchestration's branch, another link's, one the owner made by hand - a branch in
git with no record is the owner's - is left as it is and the work kept beside, the outcome
naming whose it is). The kept ref is recorded as the caller's before it is made
(`boxside.land`): a move id another link used is refused, and a kept ref is created, never
replaced.

This module is the move's policy (which refs, which identity, what becomes of the branch); git runs
only through `peerd.runtime.git`'s public API (its one runner: a fixed environment, no hooks,
filters or external programs from repository config), in the recorded git dir of a worktree an
agent wrote, never its own `.git` file.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from peerd.core.ownership import Owner, effective_owner, may_change
from peerd.errors import Conflict, InvalidRequest
from peerd.handoff.machine import landing
from peerd.handoff.wire import BranchLanded
from peerd.runtime import git
from peerd.runtime.git import GitLocation

AUTHOR = "peerd handoff <handoff@peerd.invalid>"


def moving_ref(move_id: str) -> str:
    return f"refs/peerd/moving/{move_id}"


def kept_ref(move_id: str) -> str:
    return f"refs/peerd/moved/{move_id}"


async def snapshot(worktree: GitLocation, *, move_id: str, message: str) -> tuple[str, bool]:
    """The commit that carries the thread's work (see the module docstring), kept under
    `moving_ref(move_id)`: (commit, whether peerd made a commit for uncommitted work). Its tree is
    hashed from the files (`content_tree`), never taken from stat data."""
    return await git.snapshot(worktree, ref=moving_ref(move_id), message=message, author=AUTHOR)


async def drop_moving_ref(worktree_repo: Path, move_id: str) -> None:
    """Forget the snapshot's keep-alive ref once the move ended (the commit stays while reachable)."""
    await git.delete_ref(await git.checkout_location(worktree_repo), moving_ref(move_id))


async def land(
    checkout: Path,
    *,
    move_id: str,
    branch: str,
    tip: str,
    recorded: Owner | None,
    caller: Owner,
    reserve: Callable[[str], Awaitable[None]],
) -> BranchLanded:
    """The box's side: what becomes of its branch named `branch` now that `tip` (already received
    with the bundle) arrives (see the module docstring). `recorded`: the branch's owner in the
    ledger; a branch that is not `caller`'s (`core/ownership.py:may_change`; one in git with no
    record is the person's) is never moved, only kept beside."""
    repo = await git.checkout_location(checkout)
    if not await git.has_commit(repo, tip):
        raise InvalidRequest(
            f"Commit {tip} is not here: send its bundle first (POST /v1/projects/{{id}}/bundle)."
        )
    ref = f"refs/heads/{branch}"
    there = await git.verify(repo, f"{ref}^{{commit}}")
    ancestor = checked_out = False
    if there is not None and there != tip:
        ancestor = await git.is_ancestor(repo, there, tip)
        checked_out = await git.checked_out(repo, ref)
    right = may_change(recorded, exists=there is not None, caller=caller)
    outcome = landing(tip_there=there, incoming=tip, ancestor=ancestor, checked_out=checked_out, right=right)
    if outcome == "absent":
        return BranchLanded(outcome=outcome, branch=branch)
    if outcome == "fast-forward":
        assert there is not None  # noqa: S101  # landing() says so
        # The old value makes it atomic: a tip that moved meanwhile is not overwritten.
        await git.update_ref(repo, ref, tip, there, message=f"peerd: move {move_id}")
        return BranchLanded(outcome=outcome, branch=None)
    if outcome == "same":
        return BranchLanded(outcome=outcome, branch=None)
    keep = kept_ref(move_id)
    await reserve(keep)  # the ledger's record, before git makes the ref (a move id another used: refused)
    current = await git.verify(repo, keep)
    if current is not None and current != tip:
        raise Conflict(f"{keep} holds another commit here; a move's kept work is never overwritten.")
    if current is None:
        # Created only (the empty old value): a ref of another move is never replaced.
        await git.update_ref(repo, keep, tip, "", message=f"peerd: move {move_id}")
    owner = effective_owner(recorded, there is not None) if outcome == "not-yours" else None
    return BranchLanded(
        outcome=outcome, branch=None, kept_ref=keep, owner=None if owner is None else owner.describe()
    )
