"""A new linked worktree on a new branch, made the way `git worktree add -b` makes it, in O(1).

`git worktree add` reads every other worktree of the repository (their admin directories and
HEADs: about 90 ms at 1,000 worktrees here, growing with each) and starts three more git
processes (`branch`, `symbolic-ref`, `reset --hard`). peerd knows the branch is new and the path is
its own, so it writes the admin files git would write and lets git do the rest:

1. `git update-ref -m "branch: Created from <start>" refs/heads/<branch> <start>^{commit} ""`: the
   branch, created only if it does not exist, on a commit only, with its reflog entry (as `git
   branch` writes it; `cat-file` is not needed first: a branch that exists, or a start that is not a
   commit, fails here, having made nothing, and `worktrees.py` takes its slower path);
2. `<common>/worktrees/<name>/`: `<name>` is the worktree's base name, with 1, 2, ... appended
   while that is taken (git's own rule); in it, as the git releases of `version.
   DIRECT_WORKTREE_TESTED` (2.39-2.47) write them: `locked`
   ("initializing", so a `git worktree prune` meanwhile keeps it), `gitdir` (`<worktree>/.git`,
   real path), `commondir` (`../..`), `HEAD` (`ref: refs/heads/<branch>`); and `<worktree>/.git`
   (`gitdir: <admin directory>`);
3. `git read-tree -u --reset HEAD` with that git dir and work tree: the index and the files (what
   `git reset --hard` does in a new worktree), then `locked` is removed.

Both git processes run through `runner.py` (`SAFE_CONFIG`: no hooks, no fsmonitor, only the owner's
repository config), so repository content runs nothing, as before. A repository with per-worktree
config or a sparse checkout (`config.worktree`, `info/sparse-checkout`), a base name git would
sanitise, or a path that is not an empty directory takes `git worktree add` itself
(`direct_add_possible`), and so does every new worktree with a git outside that range
(`worktrees.py` asks `version.direct_worktree_tested` first). A start that fails leaves no admin
directory; one that was cut (a crash) leaves `locked` reading "initializing", which `half_made`
recognises so the worktree is made again.
tests/integration/test_worktree_scale.py checks the result with `git worktree list`, `prune`,
`status` and `remove`.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

from peerd.runtime.git.runner import GitLocation, Where, run

INITIALIZING = "initializing"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def direct_add_possible(common: Path, worktree: Path) -> bool:
    """Whether the admin files can be written directly (else `git worktree add` runs)."""
    if not _PLAIN_NAME.fullmatch(worktree.name) or worktree.name.endswith(".lock"):
        return False  # a name git would sanitise: let git name its admin directory
    if (common / "config.worktree").exists() or (common / "info" / "sparse-checkout").exists():
        return False  # per-worktree config or a sparse checkout: git copies or applies them
    try:
        return not any(os.scandir(worktree))  # git's rule: a new path, or an empty directory
    except FileNotFoundError:
        return True
    except OSError:
        return False


def half_made(admin: Path) -> bool:
    """A worktree whose creation was cut before its files were checked out."""
    try:
        return (admin / "locked").read_text(encoding="utf-8").strip() == INITIALIZING
    except (OSError, UnicodeDecodeError):
        return False


def forget_half_made(admin: Path, worktree: Path) -> None:
    """Remove a half-made worktree (its admin directory and its files): made again from its branch."""
    shutil.rmtree(admin, ignore_errors=True)
    shutil.rmtree(worktree, ignore_errors=True)


async def add_direct(repo: Where, common: Path, worktree: Path, branch: str, start: str) -> None:
    """Make `worktree` on the new `branch` at `start` (a checked revision). See the module doc.
    Raises `GitError` when the branch exists or `start` is not a commit, having made nothing."""
    message = f"branch: Created from {start.removesuffix('^{commit}')}"
    await run(repo, "update-ref", "-m", message, f"refs/heads/{branch}", start, "")
    admin = await asyncio.to_thread(_write_admin, common / "worktrees", worktree, branch)
    try:
        await run(GitLocation(admin, worktree), "read-tree", "-u", "--reset", "HEAD")
    except BaseException:
        await asyncio.to_thread(forget_half_made, admin, worktree)
        raise
    (admin / "locked").unlink()


def _write_admin(admin_root: Path, worktree: Path, branch: str) -> Path:
    # The record first, marked `locked: initializing`, and only then the directory: a creation cut
    # at any point (kill -9) leaves either nothing at the path or a record start-up recognises and
    # makes again (`half_made`), never a directory with no record that git refuses to reuse.
    admin_root.mkdir(parents=True, exist_ok=True)
    name, counter = worktree.name, 0
    while True:
        admin = admin_root / (name if counter == 0 else f"{name}{counter}")
        try:
            admin.mkdir()
            break
        except FileExistsError:
            counter += 1
    try:
        (admin / "locked").write_text(INITIALIZING, encoding="utf-8")
        (admin / "gitdir").write_text(f"{os.path.realpath(worktree)}/.git\n", encoding="utf-8")
        (admin / "commondir").write_text("../..\n", encoding="utf-8")
        (admin / "HEAD").write_text(f"ref: refs/heads/{branch}\n", encoding="utf-8")
        worktree.mkdir(parents=True, exist_ok=True)
        (worktree / ".git").write_text(f"gitdir: {admin}\n", encoding="utf-8")
    except BaseException:
        forget_half_made(admin, worktree)
        raise
    return admin
