"""A thread's worktree: created on its own new branch, removed with it, and listed.

The user's checkout is only read, never changed: only `create_worktree`, `remove_worktree` and
`add_detached` write, and only to the worktree and branch peerd owns. Worktree changes are
serialised per repository (`_repo_lock`).

A new worktree on a new branch is made without `git worktree add` (which reads every other
worktree) when the installed git is one whose admin files peerd knows (`version.
DIRECT_WORKTREE_TESTED`): `direct.py` writes them, in two git processes. Otherwise, and for a
sparse or per-worktree-config repository or a name git would sanitise, `git worktree add` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import GitError, NotFound
from peerd.runtime.git.direct import add_direct, direct_add_possible, forget_half_made, half_made
from peerd.runtime.git.locations import (
    checkout_location,
    common_dir,
    find_record,
    locate_worktree,
    own_common_dir,
)
from peerd.runtime.git.repo import (
    _branch_exists,
    check_rev,
    head_commit,
    require_branch_name,
    resolve,
)
from peerd.runtime.git.runner import GitLocation, Where, run
from peerd.runtime.git.version import direct_worktree_tested, installed_version

__all__ = [
    "Worktree",
    "add_detached",
    "create_worktree",
    "list_worktrees",
    "remove_worktree",
    "same_path",
]


@dataclass(frozen=True, slots=True)
class Worktree:
    """One entry of `git worktree list`: the first is the repository's own checkout."""

    path: Path
    branch: str | None  # None when detached or bare
    prunable: bool


async def list_worktrees(repo: Where) -> list[Worktree]:
    """Every worktree git lists for `repo` (`git worktree list --porcelain`), the main one first."""
    result = await run(repo, "worktree", "list", "--porcelain")
    found: list[Worktree] = []
    for record in result.stdout.split("\n\n"):
        fields: dict[str, str] = {}
        for line in record.splitlines():
            name, _, value = line.partition(" ")
            fields[name] = value
        if "worktree" not in fields:
            continue
        branch = fields.get("branch")
        found.append(
            Worktree(
                path=Path(fields["worktree"]),
                branch=branch.removeprefix("refs/heads/") if branch is not None else None,
                prunable="prunable" in fields,
            )
        )
    return found


def same_path(a: Path, b: Path) -> bool:
    """Whether two paths name one directory (git records worktree paths as absolute real paths; a
    path peerd has may be relative or go through a symbolic link)."""
    return a.resolve() == b.resolve()


# git's worktree bookkeeping (.git/worktrees/<id>) is not safe under concurrent `worktree add` and
# `worktree prune` in one repository: a prune removes the admin directory of a worktree another add
# is still creating, and an add fails reading it ("failed to read .git/worktrees/<id>/commondir").
# Worktree changes are therefore serialised per repository (per event loop: a lock is bound to one).
_REPO_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _repo_lock(repo: Path) -> asyncio.Lock:
    locks = _REPO_LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(repo.resolve(), asyncio.Lock())


async def create_worktree(repo: Path, worktree: Path, branch: str, base: str | None) -> None:
    """Check out a new worktree at `worktree` on a new `branch` (see `_create_worktree`). `repo`
    is the project's checkout, named by its own `.git` directory (`checkout_location`): an
    in-place thread's agent works in it."""
    async with _repo_lock(repo):
        await _create_worktree(await checkout_location(repo), worktree, branch, base)


async def _create_worktree(repo: GitLocation, worktree: Path, branch: str, base: str | None) -> None:
    """Check out a new worktree at `worktree` on a new `branch` made from `base` (default HEAD).

    Idempotent, so a launch retried after a crash converges: a worktree already at `worktree`
    on `branch` is kept as is, and a `branch` that exists without its worktree (the directory was
    deleted) is checked out again as it stands; `base` is then ignored, so no work on the branch
    is lost.

    O(1) in the number of worktrees the repository has: the record of this one path is looked up
    directly (`find_record`), never by listing every worktree, and, with a git of the tested range
    (`version.DIRECT_WORKTREE_TESTED`), a new worktree on a new branch is made without `git worktree
    add` (which reads every other worktree): two git processes, `update-ref` (the branch, only if it
    is new, only on a commit) and `read-tree` (direct.py); `cat-file` and `worktree add` only when
    that does not apply.
    """
    require_branch_name(branch)
    if base is not None:
        check_rev(base)
    worktree = worktree.absolute()
    common = own_common_dir(repo)
    admin_root = (common if common is not None else await common_dir(repo)) / "worktrees"
    record = find_record(admin_root, worktree, thorough=worktree.exists())
    stale = False
    if record is not None:
        if record.branch != branch:
            raise GitError(
                f"{worktree} is already a worktree of {repo.work_tree} on "
                f"{'branch ' + record.branch if record.branch else 'a detached HEAD'}, not on {branch}."
            )
        if half_made(record.admin):  # a creation that was cut: made again from its branch
            await asyncio.to_thread(forget_half_made, record.admin, worktree)
        elif worktree.is_dir():
            return
        else:
            stale = True  # registered, but its directory is gone: git would refuse the path

    # The admin files are written by peerd only for a git whose files it knows; any other takes
    # `git worktree add` below (the version is asked once per process).
    tested = direct_worktree_tested(await installed_version())
    start = base if base is not None else "HEAD"
    if record is None and tested and direct_add_possible(admin_root.parent, worktree):
        # The usual case (a new thread's own branch): two git processes. `update-ref` creates the
        # branch only if it does not exist and only on a commit; anything else is sorted out below.
        try:
            await add_direct(repo, admin_root.parent, worktree, branch, f"{start}^{{commit}}")
            return
        except GitError:
            pass
    branch_tip, start_commit = await resolve(repo, f"refs/heads/{branch}", f"{start}^{{commit}}")
    if branch_tip is not None:
        # Forget worktrees whose directories are gone, or git refuses to check the branch out
        # again ("already checked out") or to reuse the path ("missing but already registered").
        await run(repo, "worktree", "prune")
        await run(repo, "worktree", "add", "--", str(worktree), branch)
        return
    if start_commit is None:
        if await head_commit(repo) is None:
            raise GitError(
                f"{repo.work_tree} has no commits yet, so there is nothing to start a worktree from; "
                "commit once or launch with --in-place."
            )
        raise GitError(f"{start!r} is not a commit in {repo.work_tree}.")
    if stale:
        await run(repo, "worktree", "prune")
    if tested and direct_add_possible(admin_root.parent, worktree):
        await add_direct(repo, admin_root.parent, worktree, branch, start_commit)
        return
    add = ("worktree", "add", "-b", branch, "--", str(worktree), start_commit)
    try:
        await run(repo, *add)
    except GitError:
        if worktree.exists():
            raise
        # A record of this path that the lookup did not see (a name git sanitised): forget the
        # records whose directories are gone, and try once more.
        await run(repo, "worktree", "prune")
        await run(repo, *add)


async def remove_worktree(repo: Path, worktree: Path, *, delete_branch: str | None) -> None:
    """Remove the worktree at `worktree` and optionally its branch (see `_remove_worktree`)."""
    async with _repo_lock(repo):
        await _remove_worktree(await checkout_location(repo), worktree, delete_branch=delete_branch)


async def _remove_worktree(repo: GitLocation, worktree: Path, *, delete_branch: str | None) -> None:
    """Remove the worktree at `worktree` (discarding its changes) and optionally its branch.

    Idempotent: a worktree that is already gone, or a branch that no longer exists, is fine. A
    directory at `worktree` that git does not know as a worktree is left alone: it is not ours.
    """
    worktree = worktree.absolute()
    common = own_common_dir(repo)
    admin_root = (common if common is not None else await common_dir(repo)) / "worktrees"
    if find_record(admin_root, worktree, thorough=True) is not None:
        # git refuses to remove a worktree whose `.git` no longer points back at its record (its
        # agent may have rewritten it): put the recorded one back first.
        with contextlib.suppress(NotFound):
            await locate_worktree(repo.work_tree, worktree, restore=True)
        # `--force`: an agent's uncommitted and untracked files go with its worktree.
        await run(repo, "worktree", "remove", "--force", "--", str(worktree))
    await run(repo, "worktree", "prune")
    if delete_branch is not None:
        require_branch_name(delete_branch)
        if await _branch_exists(repo, delete_branch):
            await run(repo, "branch", "-D", "--", delete_branch)


async def add_detached(repo: Path, worktree: Path, commit: str) -> None:
    """A throwaway checkout of `commit` at `worktree`, on no branch (records of worktrees whose
    directories are gone are forgotten first)."""
    await run(repo, "worktree", "prune")
    await run(repo, "worktree", "add", "--detach", "--", str(worktree), commit)
