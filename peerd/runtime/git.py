"""Typed git operations peerd needs: repository queries, worktrees, diffs.

Every command runs through the one runner in `peerd.runtime.gitrun` (`_git`/`_git_raw`,
re-exported here): argument lists, never a shell, a fixed environment without system or global
config, and `-c` overrides that turn off every way repository config makes git run a program
(`SAFE_CONFIG`). A command in a directory an agent could write names its git dir and work tree
(`GitLocation`, from `locate_worktree`). A failure raises `GitError` carrying git's own stderr,
with any `//user:password@` credentials scrubbed; a path that is not in a git repository raises
`InvalidRequest`.

The user's checkout is only read, never changed: status and diff run without optional locks and
`diff` lists untracked files without touching the index. Only `create_worktree`/`remove_worktree`
write, and only to the worktree and branch peerd owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

from peerd.core.repo_identity import canonical_repo_key
from peerd.errors import GitError, InvalidRequest, NotFound
from peerd.runtime import gitworktree
from peerd.runtime.gitrun import (
    _DIFF_OPTIONS,
    IGNORE_NESTED,
    SAFE_CONFIG,
    GitLocation,
    Where,
    _git,
    _raise_for,
    checkout_location,
    common_dir,
    find_record,
    locate_worktree,
    own_common_dir,
)

__all__ = [
    "SAFE_CONFIG",
    "GitLocation",
    "Where",
    "branch_exists",
    "checkout_location",
    "common_dir",
    "create_worktree",
    "diff",
    "head_commit",
    "locate_worktree",
    "origin_url",
    "remove_worktree",
    "repository_key",
    "status_porcelain",
    "toplevel",
    "valid_branch_name",
]

# Untracked files are diffed one `git diff --no-index` process each; bound how many run at once.
_UNTRACKED_DIFF_CONCURRENCY = 8


def _check_rev(rev: str) -> None:
    # A revision that starts with `-` would be read as an option; one with whitespace or a control
    # character is never a revision peerd was given (and would end a line `cat-file --batch` reads).
    if not rev or rev.startswith("-") or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in rev):
        raise InvalidRequest(f"Invalid git revision: {rev!r}.")


_REF_FORBIDDEN = frozenset(" ~^:?*[\\\x7f")


def valid_branch_name(branch: str) -> bool:
    """Whether `refs/heads/<branch>` is a valid ref name, by `git check-ref-format`'s rules (no
    process): no component that starts with `.` or ends with `.lock`, no `..`, `@{`, `//`, control
    characters, space or any of `~^:?*[\\`, no leading or trailing `/`, no trailing `.`; and,
    for peerd, no leading `-` (it would be read as an option)."""
    if not branch or branch.startswith(("-", "/")) or branch.endswith(("/", ".")):
        return False
    if ".." in branch or "@{" in branch or "//" in branch:
        return False
    if any(ord(ch) < 0x20 or ch in _REF_FORBIDDEN for ch in branch):
        return False
    return all(part and not part.startswith(".") and not part.endswith(".lock") for part in branch.split("/"))


async def toplevel(path: Path) -> Path:
    """The top directory of the working tree that contains `path`."""
    result = await _git(path, "rev-parse", "--show-toplevel")
    return Path(result.stdout.strip())


async def origin_url(repo: Path) -> str | None:  # noqa: RET503  # _raise_for never returns
    """The URL of the `origin` remote (after `insteadOf` rewriting), or None without one."""
    result = await _git(repo, "remote", "get-url", "origin", ok=(0, 2, 128))
    if result.returncode == 0:
        return result.stdout.strip() or None
    if "No such remote" in result.stderr:
        return None
    _raise_for(repo, ("remote", "get-url", "origin"), result)


async def repository_key(repo: Path) -> str | None:
    """The canonical key of `repo`'s origin (see `canonical_repo_key`); None without an origin."""
    url = await origin_url(repo)
    if url is None:
        return None
    key = canonical_repo_key(url)
    if key is None and "://" not in url and not url.startswith("/"):
        # Possibly a relative local path: git resolves it against the working tree's top level.
        key = canonical_repo_key(url, base=str(await toplevel(repo)))
    if key is not None and key.startswith("file:"):
        # Resolve symlinked directories (e.g. /tmp -> /private/tmp) so that clones made through
        # different spellings of one origin's path still match.
        key = "file:" + str(Path(key.removeprefix("file:")).resolve())
    return key


async def head_commit(repo: Where) -> str | None:
    """The commit id HEAD points at, or None in a repository with no commits yet."""
    result = await _git(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", "HEAD^{commit}", ok=(0, 1)
    )
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


async def _commit_exists(repo: Where, rev: str) -> bool:
    result = await _git(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    return result.returncode == 0


async def _branch_exists(repo: Where, branch: str) -> bool:
    result = await _git(repo, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", ok=(0, 1))
    return result.returncode == 0


def _require_branch_name(branch: str) -> None:
    if not valid_branch_name(branch):
        raise InvalidRequest(f"Invalid branch name: {branch!r}.")


async def _check_branch_name(repo: Where, branch: str) -> None:  # callers await it
    _require_branch_name(branch)


async def _resolve(repo: Where, *names: str) -> list[str | None]:
    """The object id each of `names` resolves to, or None where it does not: one process for any
    number of names (`git cat-file --batch-check`). Each name is a full ref or a checked revision."""
    result = await _git(
        repo, "cat-file", "--batch-check=%(objectname)", stdin="".join(f"{n}\n" for n in names).encode()
    )
    lines = result.stdout.splitlines()
    if len(lines) != len(names):
        raise GitError(
            f"`git cat-file --batch-check` in {_where(repo)} answered {len(lines)} lines for {len(names)} names."
        )
    # A name that does not resolve is answered `<name> missing` (or `ambiguous`): never a bare id.
    return [None if " " in line else line for line in lines]


def _where(repo: Where) -> Path:
    return repo.work_tree if isinstance(repo, GitLocation) else repo


@dataclass(frozen=True, slots=True)
class _Worktree:
    path: Path
    branch: str | None  # None when detached or bare
    prunable: bool


async def _worktrees(repo: Where) -> list[_Worktree]:
    result = await _git(repo, "worktree", "list", "--porcelain")
    found: list[_Worktree] = []
    for record in result.stdout.split("\n\n"):
        fields: dict[str, str] = {}
        for line in record.splitlines():
            name, _, value = line.partition(" ")
            fields[name] = value
        if "worktree" not in fields:
            continue
        branch = fields.get("branch")
        found.append(
            _Worktree(
                path=Path(fields["worktree"]),
                branch=branch.removeprefix("refs/heads/") if branch is not None else None,
                prunable="prunable" in fields,
            )
        )
    return found


def _same_path(a: Path, b: Path) -> bool:
    # git records worktree paths as absolute real paths; `worktree` may be relative or symlinked.
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
    directly (`find_record`), never by listing every worktree, and a new worktree on a new branch
    is made without `git worktree add` (which reads every other worktree): two git processes,
    `update-ref` (the branch, only if it is new, only on a commit) and `read-tree`
    (peerd/runtime/gitworktree.py); `cat-file` and `worktree add` only when that does not apply.
    """
    _require_branch_name(branch)
    if base is not None:
        _check_rev(base)
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
        if gitworktree.half_made(record.admin):  # a creation that was cut: made again from its branch
            await asyncio.to_thread(gitworktree.forget_half_made, record.admin, worktree)
        elif worktree.is_dir():
            return
        else:
            stale = True  # registered, but its directory is gone: git would refuse the path

    start = base if base is not None else "HEAD"
    if record is None and gitworktree.direct_add_possible(admin_root.parent, worktree):
        # The usual case (a new thread's own branch): two git processes. `update-ref` creates the
        # branch only if it does not exist and only on a commit; anything else is sorted out below.
        try:
            await gitworktree.add_direct(repo, admin_root.parent, worktree, branch, f"{start}^{{commit}}")
            return
        except GitError:
            pass
    branch_tip, start_commit = await _resolve(repo, f"refs/heads/{branch}", f"{start}^{{commit}}")
    if branch_tip is not None:
        # Forget worktrees whose directories are gone, or git refuses to check the branch out
        # again ("already checked out") or to reuse the path ("missing but already registered").
        await _git(repo, "worktree", "prune")
        await _git(repo, "worktree", "add", "--", str(worktree), branch)
        return
    if start_commit is None:
        if await head_commit(repo) is None:
            raise GitError(
                f"{repo.work_tree} has no commits yet, so there is nothing to start a worktree from; "
                "commit once or launch with --in-place."
            )
        raise GitError(f"{start!r} is not a commit in {repo.work_tree}.")
    if stale:
        await _git(repo, "worktree", "prune")
    if gitworktree.direct_add_possible(admin_root.parent, worktree):
        await gitworktree.add_direct(repo, admin_root.parent, worktree, branch, start_commit)
        return
    add = ("worktree", "add", "-b", branch, "--", str(worktree), start_commit)
    try:
        await _git(repo, *add)
    except GitError:
        if worktree.exists():
            raise
        # A record of this path that the lookup did not see (a name git sanitised): forget the
        # records whose directories are gone, and try once more.
        await _git(repo, "worktree", "prune")
        await _git(repo, *add)


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
        await _git(repo, "worktree", "remove", "--force", "--", str(worktree))
    await _git(repo, "worktree", "prune")
    if delete_branch is not None:
        _require_branch_name(delete_branch)
        if await _branch_exists(repo, delete_branch):
            await _git(repo, "branch", "-D", "--", delete_branch)


async def _empty_tree(repo: Where) -> str:
    # The empty tree's id depends on the repository's hash (SHA-1 or SHA-256); ask git.
    result = await _git(repo, "hash-object", "-t", "tree", "--stdin", stdin=b"")
    return result.stdout.strip()


async def diff(worktree: Where, base: str | None = None) -> str:
    """The working tree's changes against `base` (default HEAD), untracked files included.

    Tracked changes come from `git diff <base>`; untracked (not ignored) files follow as
    new-file patches from `git diff --no-index /dev/null <file>`, so the index of the checkout is
    never touched. In a repository with no commits, the diff is against the empty tree. A
    `GitLocation` is used as it is; a directory is first taken to the top of its working tree.
    """
    if base is not None:
        _check_rev(base)
    top = worktree if isinstance(worktree, GitLocation) else await toplevel(worktree)
    if base is None:
        base = "HEAD" if await head_commit(top) is not None else await _empty_tree(top)
    tracked = await _git(top, "diff", *_DIFF_OPTIONS, "--end-of-options", base, "--")
    listed = await _git(top, "ls-files", "--others", "--exclude-standard", "-z")
    # A trailing `/` marks a nested repository, which has no content to diff as a file.
    untracked = [name for name in listed.stdout.split("\0") if name and not name.endswith("/")]

    limit = asyncio.Semaphore(_UNTRACKED_DIFF_CONCURRENCY)

    async def new_file_patch(name: str) -> str:
        async with limit:
            # Exit 1 means "there are differences", the expected outcome here.
            result = await _git(top, "diff", "--no-index", *_DIFF_OPTIONS, "--", os.devnull, name, ok=(0, 1))
            return result.stdout

    tasks = [asyncio.ensure_future(new_file_patch(name)) for name in untracked]
    try:
        patches = await asyncio.gather(*tasks)
    except BaseException:
        # gather leaves the other diffs running on failure; stop them (each kills its git).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return tracked.stdout + "".join(patches)


async def status_porcelain(path: Where) -> list[str]:
    """`git status --porcelain=v1` lines for the working tree at `path`, every untracked file listed."""
    result = await _git(path, "status", "--porcelain=v1", "--untracked-files=all", IGNORE_NESTED)
    return result.stdout.splitlines()


async def branch_exists(repo: Path, branch: str) -> bool:
    """Whether `refs/heads/<branch>` exists in `repo` (a launch may not take an existing branch)."""
    _require_branch_name(branch)
    return await _branch_exists(repo, branch)
