"""Where a repository is, from peerd's own records: the common git dir, a checkout's own `.git`
directory, and a linked worktree's admin directory (`<common dir>/worktrees/<id>`), read from the
files git keeps there, never from a `.git` file in a directory an agent could write."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import NotFound
from peerd.runtime.git.runner import GitLocation, Where, dir_of, run

__all__ = [
    "WorktreeRecord",
    "admin_root_of",
    "checkout_location",
    "common_dir",
    "find_record",
    "locate_worktree",
    "own_common_dir",
]


async def common_dir(where: Where) -> Path:
    """The repository's common git dir (where `objects`, `refs` and `worktrees/` live)."""
    result = await run(where, "rev-parse", "--git-common-dir")
    common = Path(result.stdout.strip())
    return (common if common.is_absolute() else dir_of(where) / common).resolve()


async def checkout_location(checkout: Path) -> GitLocation:
    """The explicit location of a project checkout (the owner's; an in-place thread's agent works
    in it): its `.git` directory. A checkout whose `.git` is a file (itself a linked worktree of
    another repository, registered so by its owner) is resolved by git, once, with the safe
    options: reading config runs nothing."""
    top = checkout.absolute()
    dotgit = top / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        return GitLocation(dotgit, top)
    result = await run(top, "rev-parse", "--absolute-git-dir")
    return GitLocation(Path(result.stdout.strip()), top)


def _gitfile_target(admin: Path) -> Path | None:
    try:
        text = (admin / "gitdir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text:
        return None
    target = Path(text)
    # git >= 2.48 may record it relative to the admin directory (`worktree.useRelativePaths`).
    return target if target.is_absolute() else admin / target


def own_common_dir(location: GitLocation) -> Path | None:
    """The common git dir of a checkout's own git dir, read from its `commondir` file (present in a
    linked worktree's git dir) as git reads it, without running git; None if it cannot be read."""
    try:
        text = (location.git_dir / "commondir").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return location.git_dir.resolve()
    except (OSError, UnicodeDecodeError):
        return None
    common = Path(text)
    return (common if common.is_absolute() else location.git_dir / common).resolve()


@dataclass(frozen=True, slots=True)
class WorktreeRecord:
    """A linked worktree as the checkout's git dir records it: its admin directory
    `<common dir>/worktrees/<id>` and the branch its `HEAD` names (None when detached)."""

    admin: Path
    work_tree: Path
    branch: str | None


def _record_at(admin: Path, work_tree: Path) -> WorktreeRecord | None:
    target = _gitfile_target(admin)
    # Compare the directory holding `.git` (resolving links), never following `.git` itself.
    if target is None or target.name != ".git" or Path(os.path.realpath(target.parent)) != work_tree:
        return None
    try:
        head = (admin / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        head = ""
    branch = head.removeprefix("ref: refs/heads/") if head.startswith("ref: refs/heads/") else None
    return WorktreeRecord(admin.resolve(), work_tree, branch)


def find_record(admin_root: Path, worktree: Path, *, thorough: bool) -> WorktreeRecord | None:
    """The record of `worktree` under `admin_root` (`<common dir>/worktrees`), in O(1) for the
    worktrees peerd makes: git names the admin directory after the worktree's base name (with a
    number appended when that name is taken), so that name is looked at first, then names that
    start with it, and only with `thorough` every other record (a name git sanitised)."""
    work_tree = Path(os.path.realpath(worktree))
    name = worktree.name
    found = _record_at(admin_root / name, work_tree) if name else None
    if found is not None:
        return found
    try:
        names = sorted(entry.name for entry in os.scandir(admin_root) if entry.name != name)
    except OSError:
        return None
    near = [n for n in names if name and n.startswith(name)]
    rest = [n for n in names if not (name and n.startswith(name))] if thorough else []
    for candidate in near + rest:
        found = _record_at(admin_root / candidate, work_tree)
        if found is not None:
            return found
    return None


async def admin_root_of(repo: Path) -> Path:
    """`<common dir>/worktrees` of the project checkout `repo` (git runs only for a checkout whose
    `.git` is not a plain directory, or whose `commondir` cannot be read)."""
    common = own_common_dir(await checkout_location(repo))
    return (common if common is not None else await common_dir(repo)) / "worktrees"


async def locate_worktree(repo: Path, worktree: Path, *, restore: bool = True) -> GitLocation:
    """The recorded location of `worktree`, a linked worktree of the project checkout `repo`: its
    git dir is the admin directory `<repo's common dir>/worktrees/<id>` whose `gitdir` file names
    `<worktree>/.git` (`find_record`). The worktree's own `.git` (which its agent may have rewritten
    to point at a git dir it made, with hooks or an fsmonitor in its config) is never read; with
    `restore`, one that does not point at the record is put back as git wrote it."""
    admin_root = await admin_root_of(repo)
    record = find_record(admin_root, worktree, thorough=True)
    if record is None:
        raise NotFound(f"{worktree} is not a worktree of {repo} (no record of it in {admin_root}).")
    location = GitLocation(record.admin, record.work_tree)
    if restore:
        await asyncio.to_thread(_restore_gitfile, location)
    return location


def _restore_gitfile(location: GitLocation) -> None:
    if not location.work_tree.is_dir():
        return  # the worktree is gone: nothing to put back
    dotgit = location.work_tree / ".git"
    wanted = f"gitdir: {location.git_dir}\n"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if not dotgit.is_symlink() and dotgit.is_file() and dotgit.read_text(encoding="utf-8") == wanted:
            return
    if dotgit.is_dir() and not dotgit.is_symlink():
        shutil.rmtree(dotgit, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        dotgit.unlink()
    dotgit.write_text(wanted, encoding="utf-8")
