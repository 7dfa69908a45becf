"""Commits between a laptop and a linked box as git bundles (the box's result one way, a base commit
the other)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from peerd.errors import GitError, InvalidRequest, NotFound
from peerd.orchestrate.gitbase import (
    _check_sha,
    _resolve_commit,
)
from peerd.orchestrate.merging import _protected_branches
from peerd.runtime.git import (
    _commit_exists,
)
from peerd.runtime.gitrun import (
    _git,
    _trim,
)

# --- bundles (box <-> laptop) -------------------------------------------------------------------


async def has_commit(repo: Path, sha: str) -> bool:
    """Whether `repo` holds the commit `sha`."""
    return await _commit_exists(repo, _check_sha(sha))


async def ref_tips(repo: Path) -> list[str]:
    """The distinct commits that `repo`'s branches, remote-tracking branches, tags (peeled) and
    peerd's own refs (`refs/peerd/...`, e.g. fetched base commits) point at: what the other side
    may exclude from a bundle for this repository. Sorted."""
    result = await _git(
        repo,
        "for-each-ref",
        "--format=%(objectname) %(objecttype) %(*objectname) %(*objecttype)",
        "refs/heads",
        "refs/remotes",
        "refs/tags",
        "refs/peerd",
    )
    tips: set[str] = set()
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "commit":
            tips.add(fields[0])
        elif len(fields) >= 4 and fields[3] == "commit":
            tips.add(fields[2])
    return sorted(tips)


async def _known_objects(repo: Path, shas: Sequence[str]) -> list[str]:
    """The full ids of those of `shas` that are commits or tags in `repo` (one `cat-file` run)."""
    if not shas:
        return []
    stdin = "".join(f"{sha}\n" for sha in shas).encode()
    result = await _git(repo, "cat-file", "--batch-check=%(objectname) %(objecttype)", stdin=stdin)
    known: set[str] = set()
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] in ("commit", "tag"):
            known.add(fields[0])
    return sorted(known)


async def create_bundle(repo: Path, out: Path, tip: str, *, exclude: list[str]) -> bool:
    """Write to `out` a bundle holding `tip` and its history minus what `exclude` (the other
    side's `ref_tips`) reaches; ids in `exclude` unknown here are ignored. Returns False, and
    writes nothing, when `exclude` already reaches `tip`."""
    sha = await _resolve_commit(repo, tip)
    excluded = await _known_objects(repo, [_check_sha(entry) for entry in exclude])
    negative = "".join(f"^{entry}\n" for entry in excluded)
    count = await _git(repo, "rev-list", "--count", "--stdin", stdin=f"{sha}\n{negative}".encode())
    if int(count.stdout.strip() or "0") == 0:
        return False
    # `git bundle create` records ref names; a bare commit id would give the bundle no head.
    ref = f"refs/peerd/bundle/{secrets.token_hex(8)}"
    await _git(repo, "update-ref", "--no-deref", ref, sha, "")
    try:
        await _git(
            repo,
            "bundle",
            "create",
            "--quiet",
            str(out.absolute()),
            "--stdin",
            stdin=f"{ref}\n{negative}".encode(),
        )
    finally:
        await _git(repo, "update-ref", "--no-deref", "-d", ref, sha)
    return True


async def fetch_bundle(repo: Path, bundle: Path, into_ref: str) -> str:
    """Verify `bundle` against `repo` (its prerequisite commits must be here), fetch its single
    head into `into_ref` (a full ref name such as `refs/heads/orchestrate/r1/p1` or
    `refs/peerd/base/<sha>`) and return the fetched commit id. An existing `into_ref` is only
    fast-forwarded, never rewound or replaced; the main branch (see `merge_into`) is refused."""
    if not into_ref.startswith("refs/"):
        raise InvalidRequest(f"Invalid ref {into_ref!r}: expected a full name starting with refs/.")
    valid = await _git(repo, "check-ref-format", into_ref, ok=(0, 1))
    if valid.returncode != 0:
        raise InvalidRequest(f"Invalid ref name: {into_ref!r}.")
    if into_ref.removeprefix("refs/heads/") in await _protected_branches(repo):
        raise InvalidRequest(f"Refusing to fetch into {into_ref}: orchestrate never moves the main branch.")
    path = str(bundle.absolute())
    if not bundle.is_file():
        raise NotFound(f"No bundle file at {path}.")

    verified = await _git(repo, "bundle", "verify", path, ok=range(256))
    if verified.returncode != 0:
        raise GitError(f"The bundle {path} cannot be fetched into {repo}: {_trim(verified.stderr)}")
    listed = await _git(repo, "bundle", "list-heads", path)
    heads: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        sha, _, name = line.strip().partition(" ")
        if sha and name:
            heads[name] = sha
    if len(set(heads.values())) != 1:
        raise GitError(
            f"The bundle {path} must hold exactly one head, it holds {len(heads)}: {sorted(heads)}."
        )
    name = next((n for n in heads if n != "HEAD"), "HEAD")
    sha = heads[name]
    await _git(
        repo,
        "fetch",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        path,
        f"{name}:{into_ref}",
    )
    fetched = await _git(repo, "rev-parse", "--verify", "--end-of-options", f"{into_ref}^{{commit}}")
    if fetched.stdout.strip() != sha:
        raise GitError(f"Fetching {path} left {into_ref} at {fetched.stdout.strip()}, not {sha}.")
    return sha
