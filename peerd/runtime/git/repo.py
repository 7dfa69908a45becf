"""Questions about a repository and its refs, and the ref moves peerd makes: the top of a working
tree, the origin's repository key, HEAD, whether a branch or commit exists, which commit a name
resolves to, ancestry, and `update-ref` (created only if absent, or moved only from the value
peerd saw: atomic against a concurrent writer).

Revisions and branch names a caller passes are checked first (`check_rev`, `valid_branch_name`,
`check_sha`): none is ever read by git as an option."""

from __future__ import annotations

import re
from pathlib import Path

from peerd.core.repo_identity import canonical_repo_key
from peerd.errors import GitError, InvalidRequest, NotFound
from peerd.runtime.git.runner import Where, dir_of, raise_for, run

__all__ = [
    "branch_exists",
    "check_rev",
    "check_sha",
    "checked_out",
    "commit_exists",
    "current_branch",
    "delete_ref",
    "head",
    "head_commit",
    "is_ancestor",
    "merge_base",
    "origin_url",
    "remotes",
    "repository_key",
    "require_branch_name",
    "resolve_commit",
    "toplevel",
    "update_ref",
    "valid_branch_name",
    "verify",
]

_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")
_REF_FORBIDDEN = frozenset(" ~^:?*[\\\x7f")


def check_rev(rev: str) -> None:
    """Refuse a revision that starts with `-` (it would be read as an option) or holds whitespace or
    a control character (never a revision peerd was given; it would end a line `cat-file --batch`
    reads)."""
    if not rev or rev.startswith("-") or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in rev):
        raise InvalidRequest(f"Invalid git revision: {rev!r}.")


def check_sha(sha: str) -> str:
    """`sha` lower-cased, when it is a hexadecimal object name (4 to 64 digits); else `InvalidRequest`."""
    if not _HEX.match(sha):
        raise InvalidRequest(f"Invalid commit id: {sha!r} (expected a hexadecimal object name).")
    return sha.lower()


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


def require_branch_name(branch: str) -> None:
    """`InvalidRequest` unless `valid_branch_name(branch)`."""
    if not valid_branch_name(branch):
        raise InvalidRequest(f"Invalid branch name: {branch!r}.")


async def toplevel(path: Path) -> Path:
    """The top directory of the working tree that contains `path`."""
    result = await run(path, "rev-parse", "--show-toplevel")
    return Path(result.stdout.strip())


async def origin_url(repo: Path) -> str | None:  # noqa: RET503  # raise_for never returns
    """The URL of the `origin` remote (after `insteadOf` rewriting), or None without one."""
    result = await run(repo, "remote", "get-url", "origin", ok=(0, 2, 128))
    if result.returncode == 0:
        return result.stdout.strip() or None
    if "No such remote" in result.stderr:
        return None
    raise_for(repo, ("remote", "get-url", "origin"), result)


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


async def remotes(repo: Path) -> dict[str, str]:
    """The checkout's configured remotes: name -> push URL."""
    names = (await run(repo, "remote")).stdout.split()
    found: dict[str, str] = {}
    for name in names:
        url = await run(repo, "remote", "get-url", "--push", "--", name, ok=(0, 2, 128))
        found[name] = url.stdout.strip()
    return found


async def head_commit(repo: Where) -> str | None:
    """The commit id HEAD points at, or None in a repository with no commits yet."""
    result = await run(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", "HEAD^{commit}", ok=(0, 1)
    )
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


async def head(repo: Where) -> str:
    """The full id of the commit HEAD points at (`GitError` in a repository with no commits)."""
    sha = await head_commit(repo)
    if sha is None:
        raise GitError(f"{repo} has no commits yet.")
    return sha


async def commit_exists(repo: Where, rev: str) -> bool:
    """Whether `rev` (a checked revision) names a commit in `repo`."""
    result = await run(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    return result.returncode == 0


async def resolve_commit(repo: Where, rev: str) -> str:
    """The full id of the commit `rev` names (`NotFound` when it names none)."""
    check_rev(rev)
    result = await run(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    sha = result.stdout.strip()
    if result.returncode != 0 or not sha:
        raise NotFound(f"{rev!r} is not a commit in {repo}.")
    return sha


async def verify(repo: Where, name: str) -> str | None:
    """`git rev-parse --verify --quiet <name>`: the object id `name` resolves to, or None. `name`
    is peerd's own (a full ref, optionally with `^{commit}`)."""
    found = await run(repo, "rev-parse", "--verify", "--quiet", name, ok=(0, 1))
    return found.stdout.strip() or None if found.returncode == 0 else None


async def branch_exists(repo: Where, branch: str) -> bool:
    """Whether `refs/heads/<branch>` exists in `repo` (a launch may not take an existing branch)."""
    require_branch_name(branch)
    return await _branch_exists(repo, branch)


async def _branch_exists(repo: Where, branch: str) -> bool:
    result = await run(repo, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", ok=(0, 1))
    return result.returncode == 0


async def current_branch(worktree: Where) -> str | None:
    """The branch HEAD is on (short name), None when detached."""
    result = await run(worktree, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


async def resolve(repo: Where, *names: str) -> list[str | None]:
    """The object id each of `names` resolves to, or None where it does not: one process for any
    number of names (`git cat-file --batch-check`). Each name is a full ref or a checked revision."""
    result = await run(
        repo, "cat-file", "--batch-check=%(objectname)", stdin="".join(f"{n}\n" for n in names).encode()
    )
    lines = result.stdout.splitlines()
    if len(lines) != len(names):
        raise GitError(
            f"`git cat-file --batch-check` in {dir_of(repo)} answered {len(lines)} lines for {len(names)} names."
        )
    # A name that does not resolve is answered `<name> missing` (or `ambiguous`): never a bare id.
    return [None if " " in line else line for line in lines]


async def merge_base(repo: Where, one: str, other: str) -> str | None:
    """The best common ancestor of two commits, or None when they share none."""
    check_rev(one)
    check_rev(other)
    result = await run(repo, "merge-base", "--end-of-options", one, other, ok=(0, 1))
    found = result.stdout.strip()
    return found if result.returncode == 0 and found else None


async def is_ancestor(repo: Where, ancestor: str, of: str) -> bool:
    """Whether the commit `ancestor` is `of` or an ancestor of it."""
    result = await run(repo, "merge-base", "--is-ancestor", ancestor, of, ok=(0, 1))
    return result.returncode == 0


async def checked_out(repo: Where, ref: str) -> bool:
    """Whether the branch `ref` (a full ref) is checked out in any worktree of `repo`."""
    where = await run(repo, "for-each-ref", "--format=%(worktreepath)", ref)
    return bool(where.stdout.strip())


async def update_ref(repo: Where, ref: str, new: str, old: str | None = None, *, message: str) -> None:
    """Point `ref` at `new`, with a reflog `message`. With `old`, only if `ref` is still at `old`
    (the empty string: only if `ref` does not exist yet); a ref that moved meanwhile raises."""
    await run(repo, "update-ref", "-m", message, ref, new, *(() if old is None else (old,)))


async def delete_ref(repo: Where, ref: str) -> None:
    """Delete `ref`; one that does not exist is fine."""
    await run(repo, "update-ref", "-d", ref, ok=(0, 1))
