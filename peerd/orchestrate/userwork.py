"""The user's own work in their checkout, which a run never takes.

At the start of a run peerd records every path `git status` reports in the user's checkout
(uncommitted edits, staged or not, deletions and untracked files) with a hash of its content
(`snapshot`), in the run's own store row. From then on:

- a packet whose files hold any of those paths is refused at plan time (`dirty_in_packets`,
  `DirtyCheckout`), naming the paths and the three ways on: commit, stash, or `--include-dirty`;
- with `--include-dirty`, the run starts from the user's working state instead of `HEAD`: a commit
  made in a throwaway worktree from copies of those paths (`working_state_commit`); the checkout
  itself is only read;
- containment (`escapes.settle`) considers only paths whose content is not what was recorded
  (`appeared`): a path that was the user's before the run is never moved, restored or committed,
  and one that changed during the run is moved only when `attribution.attribute` proves the
  packet's coder wrote it (otherwise it is the user's too, and left).

Reading the checkout is reading the owner's own files; symbolic links are hashed as links (never
followed) and anything but a regular file or a link is hashed by its kind only.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from peerd.errors import DirtyCheckout, InvalidRequest
from peerd.orchestrate.containment import changed_paths, in_scope
from peerd.orchestrate.models import PacketSpec
from peerd.runtime import git

MAX_DIRTY_PATHS = 10_000
_CHUNK = 1 << 20


def content_hash(path: Path) -> str:
    """What is at `path` now, as a short stable string: `absent`, `link:<sha256 of the target>`,
    `sha256:<hex>` for a regular file, or the kind of anything else (`dir`, `special`)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    if stat.S_ISLNK(info.st_mode):
        return "link:" + hashlib.sha256(os.fsencode(path.readlink())).hexdigest()
    if stat.S_ISDIR(info.st_mode):
        return "dir"
    if not stat.S_ISREG(info.st_mode):
        return "special"
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _hash_all(top: Path, paths: Sequence[str]) -> dict[str, str]:
    return {path: content_hash(top / path) for path in paths}


async def snapshot(checkout: Path) -> dict[str, str]:
    """Every path `git status` reports in `checkout` (relative to its top) -> its content hash."""
    top, paths = await changed_paths(checkout)
    if len(paths) > MAX_DIRTY_PATHS:
        raise InvalidRequest(
            f"{top} has {len(paths)} uncommitted or untracked paths (peerd records at most "
            f"{MAX_DIRTY_PATHS:,}); commit, stash or ignore (.gitignore) most of them first."
        )
    return await asyncio.to_thread(_hash_all, top, paths)


def appeared(before: Mapping[str, str], now: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """Paths dirty now whose content is not what was recorded at the start: (new paths, the user's
    own recorded paths that changed since). Paths the user committed or reverted meanwhile are in
    neither."""
    new = sorted(p for p in now if p not in before)
    changed = sorted(p for p, h in now.items() if p in before and before[p] != h)
    return new, changed


def dirty_in_packets(packets: Sequence[PacketSpec], baseline: Mapping[str, str]) -> dict[str, list[str]]:
    """Packet id -> the user's dirty paths inside its files (only packets that have any)."""
    found: dict[str, list[str]] = {}
    for packet in packets:
        paths = [path for path in sorted(baseline) if in_scope(path, packet.files)]
        if paths:
            found[packet.id] = paths
    return found


def refusal(overlap: Mapping[str, Sequence[str]], checkout: Path) -> DirtyCheckout:
    """The plan-time refusal: which packets hold which of the user's paths, and the ways on."""
    listed = "; ".join(f"{pid}: {', '.join(paths[:10])}" + (" ..." if len(paths) > 10 else "")
                       for pid, paths in overlap.items())  # fmt: skip
    return DirtyCheckout(
        f"Your checkout {checkout} has uncommitted or untracked work inside the files of packet(s) "
        f"{listed}. peerd never takes your own work: commit it (`git commit`), stash it "
        "(`git stash --include-untracked`), or run again with --include-dirty to start the run from "
        "your working state (your checkout stays as it is)."
    )


def _copy_state(top: Path, worktree: Path, paths: Sequence[str]) -> None:
    for relative in paths:
        source, target = top / relative, worktree / relative
        if os.path.lexists(target) and not target.is_dir():
            target.unlink()
        if not os.path.lexists(source):
            continue  # deleted in the checkout: deleted in the snapshot
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.readlink())
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            shutil.copymode(source, target)


async def working_state_commit(
    checkout: Path, scratch: Path, branch: str, baseline: Mapping[str, str]
) -> str:
    """A commit of the checkout's working state (`HEAD` plus every recorded path as it is on disk),
    on `branch`, made in a throwaway worktree at `scratch` from copies: the checkout is only read.
    Returns `HEAD` itself when nothing is dirty."""
    top = (await changed_paths(checkout))[0]
    base = await git.head(top)
    if not baseline:
        return base
    await git.remove_worktree(top, scratch, delete_branch=None)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    await git.create_worktree(top, scratch, branch, base)
    try:
        await asyncio.to_thread(_copy_state, top, scratch, sorted(baseline))
        where = await git.locate_worktree(top, scratch)
        message = "peerd orchestrate: your working state when the run started (--include-dirty)"
        return await git.commit_all(where, message) or base
    finally:
        await git.remove_worktree(top, scratch, delete_branch=None)
