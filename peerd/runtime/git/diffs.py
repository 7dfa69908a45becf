"""Patches: a working tree's changes (`diff`), what changed between two commits (`changed_files`,
`diff_stat`, `diff_text`), the patch of some paths against HEAD and applying one (`paths_patch`,
`apply_patch`). Output is config-independent (`DIFF_OPTIONS`: no color, no external diff, fixed
prefixes, nested repositories by their commit only)."""

from __future__ import annotations

import asyncio
import os

from peerd.errors import GitError
from peerd.runtime.git.repo import check_rev, head_commit, toplevel
from peerd.runtime.git.runner import DIFF_OPTIONS, GitLocation, Where, run, run_raw, trim_stderr

__all__ = [
    "apply_patch",
    "cap",
    "changed_files",
    "diff",
    "diff_stat",
    "diff_text",
    "paths_patch",
]

# Untracked files are diffed one `git diff --no-index` process each; bound how many run at once.
_UNTRACKED_DIFF_CONCURRENCY = 8


def cap(text: str, limit: int, what: str) -> str:
    """`text` cut at `limit` characters, with a line that says how much of `what` was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {what} truncated: {len(text) - limit} more characters]\n"


async def _empty_tree(repo: Where) -> str:
    # The empty tree's id depends on the repository's hash (SHA-1 or SHA-256); ask git.
    result = await run(repo, "hash-object", "-t", "tree", "--stdin", stdin=b"")
    return result.stdout.strip()


async def diff(worktree: Where, base: str | None = None) -> str:
    """The working tree's changes against `base` (default HEAD), untracked files included.

    Tracked changes come from `git diff <base>`; untracked (not ignored) files follow as
    new-file patches from `git diff --no-index /dev/null <file>`, so the index of the checkout is
    never touched. In a repository with no commits, the diff is against the empty tree. A
    `GitLocation` is used as it is; a directory is first taken to the top of its working tree.
    """
    if base is not None:
        check_rev(base)
    top = worktree if isinstance(worktree, GitLocation) else await toplevel(worktree)
    if base is None:
        base = "HEAD" if await head_commit(top) is not None else await _empty_tree(top)
    tracked = await run(top, "diff", *DIFF_OPTIONS, "--end-of-options", base, "--")
    listed = await run(top, "ls-files", "--others", "--exclude-standard", "-z")
    # A trailing `/` marks a nested repository, which has no content to diff as a file.
    untracked = [name for name in listed.stdout.split("\0") if name and not name.endswith("/")]

    limit = asyncio.Semaphore(_UNTRACKED_DIFF_CONCURRENCY)

    async def new_file_patch(name: str) -> str:
        async with limit:
            # Exit 1 means "there are differences", the expected outcome here.
            result = await run(top, "diff", "--no-index", *DIFF_OPTIONS, "--", os.devnull, name, ok=(0, 1))
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


async def changed_files(repo: Where, base: str, tip: str) -> list[str]:
    """The paths that differ between `base` and `tip`, sorted; a rename lists both its paths."""
    check_rev(base)
    check_rev(tip)
    result = await run(
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
    check_rev(base)
    check_rev(tip)
    result = await run(
        repo, "diff", "--stat=200", "--no-color", "--no-ext-diff", "--end-of-options", base, tip, "--"
    )
    return result.stdout


async def diff_text(repo: Where, base: str, tip: str, *, max_chars: int = 200_000) -> str:
    """The patch from `base` to `tip`; past `max_chars` it is cut and a marker line says so."""
    check_rev(base)
    check_rev(tip)
    result = await run(repo, "diff", *DIFF_OPTIONS, "--end-of-options", base, tip, "--")
    return cap(result.stdout, max_chars, "diff")


async def paths_patch(where: Where, paths: list[str]) -> bytes:
    """The binary patch of `paths` (taken literally: a `*` or `:` in a name matches nothing else)
    from HEAD to the working tree, staged and unstaged changes together, no renames."""
    patch = await run_raw(
        where,
        "--literal-pathspecs",
        "diff",
        "HEAD",
        "--binary",
        "--full-index",
        "--no-renames",
        *DIFF_OPTIONS,
        "--",
        *paths,
    )
    return patch.stdout


async def apply_patch(worktree: GitLocation, patch: bytes) -> None:
    """Apply `patch` to `worktree`: a three-way apply first (it merges when the worktree's base
    is not the patch's), else a plain one (it works when the worktree has unstaged edits on those
    files, which `--3way` refuses). Either is checked first; a patch that would only apply with
    conflicts raises `GitError` and leaves the worktree as it was."""
    common = ("apply", "--whitespace=nowarn")
    three_way = await run_raw(worktree, *common, "--3way", "--check", ok=(0, 1, 128), stdin=patch)
    if three_way.returncode == 0 and "with conflicts" not in three_way.stderr:
        await run_raw(worktree, *common, "--3way", stdin=patch)
        return
    plain = await run_raw(worktree, *common, "--check", ok=(0, 1, 128), stdin=patch)
    if plain.returncode == 0:
        await run_raw(worktree, *common, stdin=patch)
        return
    reason = trim_stderr(three_way.stderr) or trim_stderr(plain.stderr)
    raise GitError(
        f"The escaped edits do not apply to the worktree {worktree.work_tree} without conflicts; "
        f"the checkout was left as it was: {reason}"
    )
