"""Git plumbing shared by the orchestration modules (locks, commit identity, sha checks), and the
commit and diff functions a packet's result is described by.

Functions that touch a worktree an agent wrote take a `GitLocation` (`peerd.runtime.git.
locate_worktree`): git then uses the recorded git dir, never the worktree's own `.git`."""

from __future__ import annotations

import asyncio
import re
import weakref
from pathlib import Path

from peerd.errors import GitError, InvalidRequest, NotFound
from peerd.runtime.git import (
    _check_rev,
    head_commit,
)
from peerd.runtime.gitcontent import content_tree
from peerd.runtime.gitrun import (
    _DIFF_OPTIONS,
    Where,
    _git,
    common_dir,
)

DEFAULT_AUTHOR = "peerd orchestrate <orchestrate@peerd.invalid>"

CONFLICT_TEXT_MAX_CHARS = 20_000
CHECK_OUTPUT_MAX_CHARS = 20_000
# A UTF-8 character is at most 4 bytes: this many bytes always hold the last 20,000 characters.
_CHECK_TAIL_BYTES = 4 * CHECK_OUTPUT_MAX_CHARS
# After SIGTERM on timeout, how long the group gets before SIGKILL.
_CHECK_TERM_GRACE_S = 2.0
# After the command exits (and its group is killed), how long to wait for the output pipe to close.
_CHECK_EOF_GRACE_S = 2.0

_AUTHOR = re.compile(r"^\s*(?P<name>[^<>]*?)\s*<(?P<email>[^<>]*)>\s*$")
_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")
_BRANCH_PROTECTED = frozenset({"main", "master"})


# --- small helpers ------------------------------------------------------------------------------


_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, Path], asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _lock(kind: str, path: Path) -> asyncio.Lock:
    """One lock per (operation kind, directory) and event loop: two recoveries in one checkout, or
    two merges in one integration worktree, would otherwise race on that checkout's index."""
    locks = _LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault((kind, path.resolve()), asyncio.Lock())


def _identity(author: str) -> tuple[str, str]:
    match = _AUTHOR.match(author)
    if match is None or not match["name"] or not match["email"]:
        raise InvalidRequest(f"Invalid git author {author!r}: expected 'Name <email>'.")
    return match["name"], match["email"]


def _commit_config(author: str) -> tuple[str, ...]:
    """`-c` options that make a commit independent of the machine's git identity and signing."""
    name, email = _identity(author)
    return (
        "-c",
        f"user.name={name}",
        "-c",
        f"user.email={email}",
        "-c",
        "commit.gpgSign=false",
    )


def _cap(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {what} truncated: {len(text) - limit} more characters]\n"


def _check_sha(sha: str) -> str:
    if not _HEX.match(sha):
        raise InvalidRequest(f"Invalid commit id: {sha!r} (expected a hexadecimal object name).")
    return sha.lower()


async def _resolve_commit(repo: Where, rev: str) -> str:
    _check_rev(rev)
    result = await _git(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    sha = result.stdout.strip()
    if result.returncode != 0 or not sha:
        raise NotFound(f"{rev!r} is not a commit in {repo}.")
    return sha


async def _current_branch(worktree: Where) -> str | None:
    result = await _git(worktree, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


async def _common_dir(path: Where) -> Path:
    return await common_dir(path)


# --- commits and diffs --------------------------------------------------------------------------


async def head(repo: Where) -> str:
    """The full id of the commit HEAD points at."""
    sha = await head_commit(repo)
    if sha is None:
        raise GitError(f"{repo} has no commits yet.")
    return sha


async def commit_all(worktree: Where, message: str, *, author: str = DEFAULT_AUTHOR) -> str | None:
    """Commit everything `worktree` holds (new, modified, deleted and untracked files; ignored ones
    stay out) as `author` on the branch HEAD is on; return the new commit's id, or None when there
    was nothing to commit. Afterwards the worktree's index matches HEAD.

    The tree is hashed from the files (`peerd.runtime.gitcontent.content_tree`, a temporary index
    without stat data), never taken from the worktree's index's stat data, which an agent's tools
    can make lie (an mtime put back, `--assume-unchanged`, a repository's `core.checkStat`). The
    index is then set to the commit (`read-tree --reset`: it keeps the stat data of entries whose
    content did not change, and records none for the others, so git hashes those next time).

    Plumbing only (`ls-files`, `update-index`, `write-tree`, `commit-tree`, `update-ref`,
    `read-tree`): `git add` and `git commit` run `git status` inside every nested repository the
    agent made (with that repository's own config, so its filters), and `git commit` consults hooks
    and an editor. A nested repository is staged as what it is to git, a commit id (its HEAD)."""
    if not message.strip():
        raise InvalidRequest("A commit message must not be empty.")
    config = _commit_config(author)
    parent = await head(worktree)
    tree = await content_tree(worktree)
    before = await _git(worktree, "rev-parse", "--verify", "--end-of-options", f"{parent}^{{tree}}")
    sha: str | None = None
    if tree != before.stdout.strip():
        created = await _git(
            worktree, *config, "commit-tree", "--no-gpg-sign", "-p", parent, "-m", message, tree
        )
        sha = created.stdout.strip()
        # The old value makes the move atomic: a HEAD that moved meanwhile is not overwritten.
        subject = f"peerd: {message.splitlines()[0][:100]}"
        await _git(worktree, "update-ref", "-m", subject, "HEAD", sha, parent)
    await _git(worktree, "read-tree", "--reset", tree)
    return sha


async def changed_files(repo: Where, base: str, tip: str) -> list[str]:
    """The paths that differ between `base` and `tip`, sorted; a rename lists both its paths."""
    _check_rev(base)
    _check_rev(tip)
    result = await _git(
        repo,
        "diff",
        "--name-only",
        "-z",
        "--no-renames",
        "--no-ext-diff",
        "--end-of-options",
        base,
        tip,
        "--",
    )
    return sorted({name for name in result.stdout.split("\0") if name})


async def diff_stat(repo: Where, base: str, tip: str) -> str:
    """`git diff --stat` from `base` to `tip` (wide enough that paths are not shortened)."""
    _check_rev(base)
    _check_rev(tip)
    result = await _git(
        repo, "diff", "--stat=200", "--no-color", "--no-ext-diff", "--end-of-options", base, tip, "--"
    )
    return result.stdout


async def diff_text(repo: Where, base: str, tip: str, *, max_chars: int = 200_000) -> str:
    """The patch from `base` to `tip`; past `max_chars` it is cut and a marker line says so."""
    _check_rev(base)
    _check_rev(tip)
    result = await _git(repo, "diff", *_DIFF_OPTIONS, "--end-of-options", base, tip, "--")
    return _cap(result.stdout, max_chars, "diff")
