"""Containment (the workflow's Verify step): a coder's edits that escaped into the orchestrator's own
checkout go back to its worktree, scoped strictly to the packet's files, and only the ones peerd
proved the coder wrote (`attribution.attribute`, called from `escapes.settle`): the checkout is the
user's, and everything else in it is left as it is.

Only for the orchestrator's own local packets, on the machine it runs on: a box never does this on
a link's request (a link could name the box owner's files as its "scope"); coders on a box are
confined to their worktree instead. The worktree side is a recorded `GitLocation`; the checkout
side is the checkout's own `.git` directory (`checkout_location`). This module is the policy (which
paths, when, checked before anything changes); git runs through `peerd.runtime.git`'s public API
(`status_entries`, `paths_patch`, `apply_patch`, `restore_from_head`)."""

from __future__ import annotations

import asyncio
import filecmp
import os
import shutil
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from peerd.errors import Conflict, GitError, InvalidRequest
from peerd.runtime import git
from peerd.runtime.git import GitLocation, Where

# Whether a checkout path is still exactly what was attributed to the coder (see recover_escaped).
Still = Callable[[str], bool]

# --- containment (workflow step 5) --------------------------------------------------------------


async def dirty_paths(checkout: Where) -> list[str]:
    """Every path `git status --porcelain` reports in `checkout`, untracked files included (each
    file, not its directory), a rename by its new path; relative to the top, sorted. A directory
    is taken to its checkout's top and `.git` directory first."""
    if not isinstance(checkout, GitLocation):
        checkout = await git.checkout_location(await git.toplevel(checkout))
    return sorted({entry.path for entry in await git.status_entries(checkout, renames=True)})


async def changed_paths(checkout: Path) -> tuple[Path, list[str]]:
    """The checkout's top directory and every path `git status` reports there, untracked files
    included, a rename as its two paths (both are someone's work); relative to the top, sorted."""
    top = await git.toplevel(checkout)
    entries = await git.status_entries(await git.checkout_location(top), renames=False)
    return top, sorted({entry.path for entry in entries if not entry.path.endswith("/")})


def in_scope(path: str, packet_files: Sequence[str]) -> bool:
    """Whether `path` is one of the packet's files or under one of its directories."""
    return _in_scope(path, _scope(packet_files))


def _scope(packet_files: Sequence[str]) -> list[str]:
    """Normalise packet scope entries to `a/b` form; reject anything that could leave the tree or
    cover all of it (the whole checkout is never a packet's scope: it holds the user's work)."""
    if isinstance(packet_files, str):
        raise InvalidRequest("packet_files must be a list of paths, not one string.")
    scope: list[str] = []
    for entry in packet_files:
        parts = [part for part in entry.split("/") if part not in ("", ".")]
        if not parts or entry.startswith("/") or ".." in parts or "\0" in entry:
            raise InvalidRequest(
                f"Invalid packet path {entry!r}: expected a file or directory relative to the "
                "repository's top, inside it and not the top itself."
            )
        scope.append("/".join(parts))
    return scope


def _in_scope(path: str, scope: Sequence[str]) -> bool:
    path = path.rstrip("/")
    return any(path == entry or path.startswith(entry + "/") for entry in scope)


def _same_file(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and a.readlink() == b.readlink()
    return a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)


def _blocked_destination(worktree: Path, relative: str) -> bool:
    """Whether a directory on the way to `worktree/relative` is a file (or link) in the worktree."""
    parent = (worktree / relative).parent
    while parent != worktree and worktree in parent.parents:
        if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
            return True
        parent = parent.parent
    return False


def _move_untracked(
    checkout: Path, worktree: Path, paths: Sequence[str], scope: Sequence[str], still: Still | None
) -> list[str]:
    moved: list[str] = []
    for relative in paths:
        source, target = checkout / relative, worktree / relative
        if still is not None and not still(relative):
            continue  # changed since it was attributed: whoever changed it keeps it there
        moved.append(relative)
        if os.path.lexists(target):
            source.unlink()  # identical content, checked before anything moved
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(source, target)
        # Remove directories the move emptied, but only ones inside the packet's scope.
        parent = source.parent
        while parent != checkout and _in_scope(parent.relative_to(checkout).as_posix(), scope):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    return moved


async def recover_escaped(
    checkout: Path,
    worktree: GitLocation,
    packet_files: list[str],
    *,
    only: Collection[str] | None = None,
    still: Still | None = None,
) -> list[str]:
    """Move a packet's edits that landed in the orchestrator's `checkout` into its `worktree` (the
    packet worktree's recorded location, `locate_worktree`).

    Only dirty paths in the packet's scope are considered: a path equal to an entry of
    `packet_files` or under one (an entry may be a directory). Tracked changes, staged and
    unstaged, travel as `git diff HEAD` applied in the worktree; untracked files are moved to the
    same relative path; then the tracked paths are restored to HEAD in the checkout (index and
    files). Nothing outside the scope is read into a patch, moved or restored: it may be the
    user's own uncommitted work. Everything that could fail (a patch that does not apply, an
    untracked file whose destination already holds something else) is checked before anything
    changes, and then the checkout is left untouched. Returns the recovered paths, sorted.

    `only`, when given, narrows it further to those paths: the ones that appeared after the run
    started and that peerd proved the coder wrote (`escapes.settle`); the user's own work is never
    a candidate. `still(path)`, when given, says whether a path is still exactly what was proven:
    asked before anything is read and again right before the checkout's copy is restored or moved,
    so a change made meanwhile (the user typing on) stays in the checkout.
    """
    scope = _scope(packet_files)
    checkout_top = await git.toplevel(checkout)
    place = await git.checkout_location(checkout_top)
    worktree_top = worktree.work_tree
    if git.same_path(checkout_top, worktree_top):
        raise InvalidRequest(f"The checkout and the worktree are the same directory: {checkout_top}.")

    async with git.path_lock("checkout", checkout_top):
        tracked: list[str] = []
        untracked: list[str] = []
        for entry in await git.status_entries(place, renames=False):
            if not _in_scope(entry.path, scope) or (only is not None and entry.path not in only):
                continue
            if entry.xy == "??":
                # A trailing `/` is a nested repository: not a file to move.
                if not entry.path.endswith("/"):
                    untracked.append(entry.path)
            elif entry.xy != "!!":
                tracked.append(entry.path)
        if still is not None:
            tracked = [path for path in tracked if still(path)]
            untracked = [path for path in untracked if still(path)]
        if not tracked and not untracked:
            return []

        blocked = [
            path
            for path in untracked
            if _blocked_destination(worktree_top, path)
            or (
                os.path.lexists(worktree_top / path)
                and not _same_file(checkout_top / path, worktree_top / path)
            )
        ]
        if blocked:
            raise Conflict(
                f"Cannot move untracked files from {checkout_top} into the worktree {worktree_top}: "
                f"it already has different content at {', '.join(sorted(blocked))}; "
                "the checkout was left as it was."
            )

        if tracked:
            # `--literal-pathspecs`: a file name with `*` or `:` must not match other paths.
            patch = await git.paths_patch(place, tracked)
            if patch:
                await git.apply_patch(worktree, patch)

        if untracked:
            try:
                untracked = await asyncio.to_thread(
                    _move_untracked, checkout_top, worktree_top, untracked, scope, still
                )
            except OSError as exc:
                raise GitError(
                    f"Moving untracked packet files from {checkout_top} to {worktree_top} failed "
                    f"part way: {exc}"
                ) from exc

        if still is not None:
            # In the worktree now; the checkout's copy is restored only if nobody changed it since.
            tracked = [path for path in tracked if still(path)]
        if tracked:
            await git.restore_from_head(place, tracked)
        return sorted(tracked + untracked)
