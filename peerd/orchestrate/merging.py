"""Integration (the workflow's Integrate step): `--no-ff` merges into a peerd-owned integration
worktree; a conflicting merge is reported and aborted so the branch stays clean."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import Conflict, GitError, InvalidRequest, NotFound
from peerd.orchestrate.gitbase import (
    _BRANCH_PROTECTED,
    CONFLICT_TEXT_MAX_CHARS,
    DEFAULT_AUTHOR,
    _cap,
    _commit_config,
    _current_branch,
    _lock,
    _resolve_commit,
    head,
)
from peerd.runtime.git import (
    _branch_exists,
    _check_branch_name,
    _same_path,
    _worktrees,
    locate_worktree,
    toplevel,
)
from peerd.runtime.gitrun import (
    _DIFF_OPTIONS,
    IGNORE_NESTED,
    Where,
    _git,
    _git_raw,
    _raise_for,
    _Result,
)

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
    await _check_branch_name(repo, branch)
    sha = await _resolve_commit(repo, base)
    ref = f"refs/heads/{branch}"
    # An empty old value: create only if absent, atomically (two creators cannot both win).
    created = await _git(
        repo, "update-ref", "-m", "peerd orchestrate: create branch", ref, sha, "", ok=(0, 1, 128)
    )
    if created.returncode == 0:
        return
    existing = await _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", ok=(0, 1))
    if existing.returncode != 0:
        _raise_for(
            repo, ("update-ref", ref, sha), _Result(created.returncode, created.stdout, created.stderr)
        )
    tip = existing.stdout.strip()
    if tip != sha:
        raise Conflict(f"Branch {branch} already exists in {repo} at {tip}, not at {sha}.")


async def _protected_branches(repo: Where) -> set[str]:
    protected = set(_BRANCH_PROTECTED)
    worktrees = await _worktrees(repo)
    if worktrees and worktrees[0].branch:
        protected.add(worktrees[0].branch)  # the branch the user's own checkout is on
    default = await _git(
        repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", ok=(0, 1, 128)
    )
    if default.returncode == 0 and default.stdout.strip().startswith("origin/"):
        protected.add(default.stdout.strip().removeprefix("origin/"))
    return protected


async def _unmerged_paths(worktree: Where) -> list[str]:
    result = await _git_raw(worktree, "ls-files", "--unmerged", "-z")
    paths = set()
    for record in result.stdout.split(b"\0"):
        _, tab, path = record.partition(b"\t")
        if tab:
            paths.add(os.fsdecode(path))
    return sorted(paths)


async def _merge_in_progress(worktree: Where) -> bool:
    result = await _git(worktree, "rev-parse", "--verify", "--quiet", "MERGE_HEAD", ok=(0, 1))
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
    config = _commit_config(author)
    await _check_branch_name(repo, branch)
    if not await _branch_exists(repo, branch):
        raise NotFound(f"Branch {branch} does not exist in {repo}.")
    shown = await toplevel(integration_worktree)
    worktrees = await _worktrees(repo)
    if worktrees and _same_path(worktrees[0].path, shown):
        raise InvalidRequest(
            f"{shown} is the repository's own checkout; integrate in a separate worktree instead."
        )
    try:
        top = await locate_worktree(repo, shown)
    except NotFound:
        raise InvalidRequest(f"{shown} is not a worktree of the repository {repo}.") from None
    target = await _current_branch(top)
    if target is None:
        raise InvalidRequest(f"{top} is not on a branch (detached HEAD); nothing to merge into.")
    if target in await _protected_branches(repo):
        raise InvalidRequest(
            f"Refusing to merge into {target}: orchestrate never commits to the main branch."
        )
    if target == branch:
        raise InvalidRequest(f"Cannot merge {branch} into itself.")

    async with _lock("merge", top.work_tree):
        if await _merge_in_progress(top):
            raise Conflict(f"A merge is already in progress in {shown}.")
        dirty = await _git(top, "status", "--porcelain=v1", "--untracked-files=no", IGNORE_NESTED)
        if dirty.stdout.strip():
            raise Conflict(f"The integration worktree {shown} has uncommitted changes:\n{dirty.stdout}")
        before = await head(top)
        merge = await _git(
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
            _raise_for(
                top, ("merge", "--no-ff", branch), _Result(merge.returncode, merge.stdout, merge.stderr)
            )
        conflict_text = ""
        if conflicts:
            conflicted = await _git(top, "diff", *_DIFF_OPTIONS)
            conflict_text = _cap(conflicted.stdout, CONFLICT_TEXT_MAX_CHARS, "conflict diff")
        await _git(top, "merge", "--abort")
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
