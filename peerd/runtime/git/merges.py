"""Integration merges: a branch made at an exact commit (`create_branch`), and `--no-ff` merges into
a peerd-owned worktree's branch (`merge_into`); a conflicting merge is reported and aborted so the
branch stays clean. Never into the repository's main branch (`protected_branches`). The merge's
identity is passed with `-c`; no hook runs (`--no-verify`, `SAFE_CONFIG`) and rerere is off."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import Conflict, GitError, InvalidRequest, NotFound
from peerd.runtime.git.commits import DEFAULT_AUTHOR, commit_config
from peerd.runtime.git.diffs import cap
from peerd.runtime.git.locations import locate_worktree
from peerd.runtime.git.locks import path_lock
from peerd.runtime.git.repo import (
    branch_exists,
    current_branch,
    head,
    require_branch_name,
    resolve_commit,
    toplevel,
)
from peerd.runtime.git.runner import DIFF_OPTIONS, IGNORE_NESTED, Result, Where, raise_for, run, run_raw
from peerd.runtime.git.worktrees import list_worktrees, same_path

__all__ = ["CONFLICT_TEXT_MAX_CHARS", "MergeResult", "create_branch", "merge_into", "protected_branches"]

CONFLICT_TEXT_MAX_CHARS = 20_000
# Branches orchestrate never commits to, besides the primary checkout's and origin/HEAD's.
_BRANCH_PROTECTED = frozenset({"main", "master"})

# --- integration (workflow step 6) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MergeResult:
    """The outcome of `merge_into`.

    `merged`: the branch is in the integration branch (`commit` is its tip then: the new merge
    commit, or the unchanged tip when the branch was already merged). On a conflict, `merged` is
    False, `commit` None, `conflicts` the conflicting paths, and `output` ends with the conflicted
    state's `git diff` (capped); the merge was aborted, so the integration branch is as before.
    """

    merged: bool
    commit: str | None
    conflicts: list[str]
    output: str


async def create_branch(repo: Path, branch: str, base: str) -> None:
    """Create `branch` at the commit `base`; a branch that already exists there is fine, one that
    exists at another commit raises `Conflict`. Nothing is checked out."""
    require_branch_name(branch)
    sha = await resolve_commit(repo, base)
    ref = f"refs/heads/{branch}"
    # An empty old value: create only if absent, atomically (two creators cannot both win).
    created = await run(
        repo, "update-ref", "-m", "peerd orchestrate: create branch", ref, sha, "", ok=(0, 1, 128)
    )
    if created.returncode == 0:
        return
    existing = await run(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok=(0, 1))
    if existing.returncode != 0:
        raise_for(repo, ("update-ref", ref, sha), Result(created.returncode, created.stdout, created.stderr))
    tip = existing.stdout.strip()
    if tip != sha:
        raise Conflict(f"Branch {branch} already exists in {repo} at {tip}, not at {sha}.")


async def protected_branches(repo: Where) -> set[str]:
    """The branches orchestrate never moves: `main`, `master`, the primary checkout's branch and
    `origin/HEAD`'s."""
    protected = set(_BRANCH_PROTECTED)
    worktrees = await list_worktrees(repo)
    if worktrees and worktrees[0].branch:
        protected.add(worktrees[0].branch)  # the branch the user's own checkout is on
    default = await run(
        repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", ok=(0, 1, 128)
    )
    if default.returncode == 0 and default.stdout.strip().startswith("origin/"):
        protected.add(default.stdout.strip().removeprefix("origin/"))
    return protected


async def _unmerged_paths(worktree: Where) -> list[str]:
    result = await run_raw(worktree, "ls-files", "--unmerged", "-z")
    paths = set()
    for record in result.stdout.split(b"\0"):
        _, tab, path = record.partition(b"\t")
        if tab:
            paths.add(os.fsdecode(path))
    return sorted(paths)


async def _merge_in_progress(worktree: Where) -> bool:
    result = await run(worktree, "rev-parse", "--verify", "--quiet", "MERGE_HEAD", ok=(0, 1))
    return result.returncode == 0


async def merge_into(
    repo: Path,
    integration_worktree: Path,
    branch: str,
    message: str,
    *,
    author: str = DEFAULT_AUTHOR,
) -> MergeResult:
    """`git merge --no-ff branch` into the branch checked out in `integration_worktree`.

    The integration worktree must be a peerd-owned worktree of `repo`, clean, on a branch that is
    not the repository's main branch (`main`, `master`, `origin/HEAD`'s branch, or the branch of
    the primary checkout). A conflicting merge is aborted and reported as `merged=False`.
    """
    if not message.strip():
        raise InvalidRequest("A merge message must not be empty.")
    config = commit_config(author)
    if not await branch_exists(repo, branch):
        raise NotFound(f"Branch {branch} does not exist in {repo}.")
    shown = await toplevel(integration_worktree)
    worktrees = await list_worktrees(repo)
    if worktrees and same_path(worktrees[0].path, shown):
        raise InvalidRequest(
            f"{shown} is the repository's own checkout; integrate in a separate worktree instead."
        )
    try:
        top = await locate_worktree(repo, shown)
    except NotFound:
        raise InvalidRequest(f"{shown} is not a worktree of the repository {repo}.") from None
    target = await current_branch(top)
    if target is None:
        raise InvalidRequest(f"{top} is not on a branch (detached HEAD); nothing to merge into.")
    if target in await protected_branches(repo):
        raise InvalidRequest(
            f"Refusing to merge into {target}: orchestrate never commits to the main branch."
        )
    if target == branch:
        raise InvalidRequest(f"Cannot merge {branch} into itself.")

    async with path_lock("merge", top.work_tree):
        if await _merge_in_progress(top):
            raise Conflict(f"A merge is already in progress in {shown}.")
        dirty = await run(top, "status", "--porcelain=v1", "--untracked-files=no", IGNORE_NESTED)
        if dirty.stdout.strip():
            raise Conflict(f"The integration worktree {shown} has uncommitted changes:\n{dirty.stdout}")
        before = await head(top)
        merge = await run(
            top,
            *config,
            "-c",
            "rerere.enabled=false",
            "merge",
            "--no-ff",
            "--no-edit",
            "--no-verify",
            "--no-log",
            "--no-squash",
            "--no-autostash",
            "--no-verify-signatures",
            "-m",
            message,
            "--end-of-options",
            f"refs/heads/{branch}",
            ok=range(256),
        )
        output = (merge.stdout + merge.stderr).strip()
        if merge.returncode == 0:
            return MergeResult(merged=True, commit=await head(top), conflicts=[], output=output)

        conflicts = await _unmerged_paths(top)
        if not conflicts and not await _merge_in_progress(top):
            # Refused before it started (e.g. untracked files it would overwrite): nothing to undo.
            raise_for(top, ("merge", "--no-ff", branch), Result(merge.returncode, merge.stdout, merge.stderr))
        conflict_text = ""
        if conflicts:
            conflicted = await run(top, "diff", *DIFF_OPTIONS)
            conflict_text = cap(conflicted.stdout, CONFLICT_TEXT_MAX_CHARS, "conflict diff")
        await run(top, "merge", "--abort")
        after = await head(top)
        if after != before:
            raise GitError(f"Aborting the merge of {branch} in {shown} left HEAD at {after}, not {before}.")
        if not conflicts:
            raise GitError(f"Merging {branch} into {target} in {shown} failed and was aborted:\n{output}")
        return MergeResult(
            merged=False,
            commit=None,
            conflicts=conflicts,
            output=f"{output}\n\n{conflict_text}" if conflict_text else output,
        )
