"""Commits between two machines as git bundles (an orchestration's result from a box, a base commit
or a move's snapshot to it): what one side has (`ref_tips`), a bundle of the rest (`create_bundle`),
and a bundle received from another machine, checked and quarantined before anything changes
(`fetch_bundle`)."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from peerd.errors import Conflict, InvalidRequest, NotFound
from peerd.runtime.git.merges import protected_branches
from peerd.runtime.git.repo import check_sha, commit_exists, resolve_commit
from peerd.runtime.git.runner import Where, dir_of, run, trim_stderr

__all__ = ["create_bundle", "fetch_bundle", "has_commit", "ref_tips"]

# --- bundles (box <-> laptop) -------------------------------------------------------------------


async def has_commit(repo: Where, sha: str) -> bool:
    """Whether `repo` holds the commit `sha`."""
    return await commit_exists(repo, check_sha(sha))


async def ref_tips(repo: Where) -> list[str]:
    """The distinct commits that `repo`'s branches, remote-tracking branches, tags (peeled) and
    peerd's own refs (`refs/peerd/...`, e.g. fetched base commits) point at: what the other side
    may exclude from a bundle for this repository. Sorted."""
    result = await run(
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


async def _known_objects(repo: Where, shas: Sequence[str]) -> list[str]:
    """The full ids of those of `shas` that are commits or tags in `repo` (one `cat-file` run)."""
    if not shas:
        return []
    stdin = "".join(f"{sha}\n" for sha in shas).encode()
    result = await run(repo, "cat-file", "--batch-check=%(objectname) %(objecttype)", stdin=stdin)
    known: set[str] = set()
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] in ("commit", "tag"):
            known.add(fields[0])
    return sorted(known)


async def create_bundle(repo: Where, out: Path, tip: str, *, exclude: list[str]) -> bool:
    """Write to `out` a bundle holding `tip` and its history minus what `exclude` (the other
    side's `ref_tips`) reaches; ids in `exclude` unknown here are ignored. Returns False, and
    writes nothing, when `exclude` already reaches `tip`."""
    sha = await resolve_commit(repo, tip)
    excluded = await _known_objects(repo, [check_sha(entry) for entry in exclude])
    negative = "".join(f"^{entry}\n" for entry in excluded)
    count = await run(repo, "rev-list", "--count", "--stdin", stdin=f"{sha}\n{negative}".encode())
    if int(count.stdout.strip() or "0") == 0:
        return False
    # `git bundle create` records ref names; a bare commit id would give the bundle no head.
    ref = f"refs/peerd/bundle/{secrets.token_hex(8)}"
    await run(repo, "update-ref", "--no-deref", ref, sha, "")
    try:
        await run(
            repo,
            "bundle",
            "create",
            "--quiet",
            str(out.absolute()),
            "--stdin",
            stdin=f"{ref}\n{negative}".encode(),
        )
    finally:
        await run(repo, "update-ref", "--no-deref", "-d", ref, sha)
    return True


async def _bundle_heads(repo: Where, path: str) -> dict[str, str]:
    listed = await run(repo, "bundle", "list-heads", path, ok=range(256))
    if listed.returncode != 0:
        raise InvalidRequest(f"The upload is not a git bundle ({trim_stderr(listed.stderr) or 'no header'}).")
    heads: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        sha, _, name = line.strip().partition(" ")
        if sha and name:
            heads[name] = sha
    return heads


async def _objects_dir(repo: Where) -> Path:
    result = await run(repo, "rev-parse", "--git-path", "objects")
    objects = Path(result.stdout.strip())
    return (objects if objects.is_absolute() else dir_of(repo) / objects).resolve()


def _migrate(incoming: Path, objects: Path) -> None:
    """Move quarantined objects into the object store: packs before their indexes (git finds a
    pack by its `.idx`), and nothing that is already there."""
    files = [p for p in incoming.rglob("*") if p.is_file()]
    for source in sorted(files, key=lambda p: (p.suffix == ".idx", str(p))):
        target = objects / source.relative_to(incoming)
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            source.rename(target)


async def _unbundle_quarantined(repo: Where, path: str, sha: str) -> None:
    """Index the bundle's objects into a quarantine directory inside the object store (as git's
    own receive-pack does) and move them in only once they are complete: a damaged bundle leaves
    neither objects nor a temporary pack behind."""
    objects = await _objects_dir(repo)
    incoming = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="tmp_objdir-peerd-", dir=objects))
    env = {
        "GIT_OBJECT_DIRECTORY": str(incoming),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(objects),
        "GIT_QUARANTINE_PATH": str(incoming),  # git refuses ref updates while it is set
    }
    try:
        (incoming / "pack").mkdir()
        unpacked = await run(repo, "bundle", "unbundle", path, env=env, ok=range(256))
        # Every object the head reaches must be here now (new ones or ones the repository had).
        walked = (
            unpacked.returncode == 0
            and (
                await run(
                    repo, "rev-list", "--objects", "--quiet", sha, "--not", "--all", env=env, ok=range(256)
                )
            ).returncode
            == 0
        )
        if not walked:
            why = trim_stderr(unpacked.stderr) or "objects are missing"
            raise InvalidRequest(f"The bundle is damaged and was not stored: {why}")
        peeled = await run(repo, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}", env=env, ok=(0, 1))
        if peeled.stdout.strip() != sha:
            raise InvalidRequest(f"The bundle's head {sha} is not a commit.")
        await asyncio.to_thread(_migrate, incoming, objects)
    finally:
        await asyncio.to_thread(shutil.rmtree, incoming, True)


async def fetch_bundle(repo: Where, bundle: Path, into_ref: str, *, expect: str | None = None) -> str:
    """Store `bundle`'s single head in `repo` under `into_ref` (a full ref name such as
    `refs/heads/orchestrate/r1/p1` or `refs/peerd/base/<sha>`) and return its commit id.

    The bundle comes from another machine and is checked before anything changes: it must be a
    bundle, hold exactly one head (`expect`, when given), and need only commits `repo` has. Its
    objects go through a quarantine (`_unbundle_quarantined`), so a bad bundle raises
    `InvalidRequest` and leaves no ref and no objects. An existing `into_ref` is only
    fast-forwarded, never rewound or replaced; the main branch (see `merge_into`) is refused."""
    if not into_ref.startswith("refs/"):
        raise InvalidRequest(f"Invalid ref {into_ref!r}: expected a full name starting with refs/.")
    valid = await run(repo, "check-ref-format", into_ref, ok=(0, 1))
    if valid.returncode != 0:
        raise InvalidRequest(f"Invalid ref name: {into_ref!r}.")
    if into_ref.removeprefix("refs/heads/") in await protected_branches(repo):
        raise InvalidRequest(f"Refusing to fetch into {into_ref}: orchestrate never moves the main branch.")
    path = str(bundle.absolute())
    if not bundle.is_file():
        raise NotFound(f"No bundle file at {path}.")

    heads = await _bundle_heads(repo, path)
    if len(set(heads.values())) != 1:
        raise InvalidRequest(
            f"The bundle must hold exactly one head, it holds {len(heads)}: {sorted(heads)}."
        )
    sha = next(iter(heads.values()))
    if expect is not None and sha != expect:
        raise InvalidRequest(f"The bundle's head is {sha}, not the announced {expect}.")
    verified = await run(repo, "bundle", "verify", path, ok=range(256))
    if verified.returncode != 0:
        raise InvalidRequest(
            f"The bundle cannot be fetched into {dir_of(repo)}: it needs commits this repository does not have "
            f"({trim_stderr(verified.stderr)}). Send a bundle built against this repository's tips."
        )
    found = await run(repo, "rev-parse", "--verify", "--quiet", f"{into_ref}^{{commit}}", ok=(0, 1))
    old = found.stdout.strip() if found.returncode == 0 else ""
    if old == sha:
        return sha
    await _unbundle_quarantined(repo, path, sha)
    if old:
        ancestor = await run(repo, "merge-base", "--is-ancestor", old, sha, ok=(0, 1))
        if ancestor.returncode != 0:
            raise Conflict(
                f"{into_ref} is at {old}; the bundle's {sha} does not build on it (not a fast-forward)."
            )
    # The old value (empty: must not exist) makes the move atomic against a concurrent writer.
    await run(repo, "update-ref", "-m", "peerd: bundle", into_ref, sha, old)
    return sha
