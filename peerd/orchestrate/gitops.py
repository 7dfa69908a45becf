"""The git mechanics of `peerd orchestrate`: packet commits, containment recovery, integration
merges, bundles between machines, and verification commands.

Every work packet runs in its own worktree on a branch `orchestrate/<run>/<packet>` made from an
exact base commit. This module is what the engine calls around that:

- `commit_all` turns a coder's edits in its worktree into one commit (`head`, `changed_files`,
  `diff_stat` and `diff_text` describe it to the reviewer);
- `dirty_paths` and `recover_escaped` implement the containment check of the workflow's "Verify"
  step: a coder that wrote into the orchestrator's own checkout instead of its worktree has those
  edits moved into the worktree, scoped strictly to the packet's files;
- `create_branch` and `merge_into` implement "Integrate": `--no-ff` merges into a peerd-owned
  integration worktree, a conflicting merge is reported and aborted so the branch stays clean;
- `create_bundle`, `fetch_bundle`, `has_commit` and `ref_tips` move commits between a laptop and a
  linked box as git bundles (the box's result commits one way, a base commit the other);
- `run_check` runs a packet's verification command in its own process group with a timeout.

Git runs through `peerd.runtime.git`'s runner (argument lists, scrubbed environment, `GitError` with
git's own stderr). Commits and merges pass their identity and `commit.gpgSign=false` with `-c`, so
they work on a machine without a git identity and never wait on a signing agent; they skip the
repository's pre-commit/commit-msg hooks (`--no-verify`): the packet's verification command is the
gate, not a hook that may be interactive or rewrite the tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import filecmp
import os
import re
import secrets
import shutil
import signal
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import Conflict, GitError, InvalidRequest, NotFound
from peerd.runtime.git import (
    _DIFF_OPTIONS,
    _REPO_LOCATION_VARS,
    _branch_exists,
    _check_branch_name,
    _check_rev,
    _commit_exists,
    _git,
    _git_env,
    _raise_for,
    _Result,
    _same_path,
    _trim,
    _worktrees,
    head_commit,
    toplevel,
)

__all__ = [
    "DEFAULT_AUTHOR",
    "CheckResult",
    "MergeResult",
    "changed_files",
    "commit_all",
    "create_branch",
    "create_bundle",
    "diff_stat",
    "diff_text",
    "dirty_paths",
    "fetch_bundle",
    "has_commit",
    "head",
    "merge_into",
    "recover_escaped",
    "ref_tips",
    "run_check",
]

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


@dataclass(frozen=True, slots=True)
class _Raw:
    returncode: int
    stdout: bytes
    stderr: str


async def _git_raw(cwd: Path, *args: str, ok: Collection[int] = (0,), stdin: bytes | None = None) -> _Raw:
    """Like `_git`, but stdout stays bytes: patches and file names need not be UTF-8."""
    argv = ["git", "-C", str(cwd), *args]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_git_env(),
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed or not on PATH.") from exc
    try:
        out, err = await proc.communicate(stdin)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    returncode = proc.returncode if proc.returncode is not None else -1
    result = _Raw(returncode, out, err.decode("utf-8", "replace"))
    if returncode not in ok:
        _raise_for(cwd, args, _Result(returncode, "", result.stderr))
    return result


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


async def _resolve_commit(repo: Path, rev: str) -> str:
    _check_rev(rev)
    result = await _git(
        repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", ok=(0, 1)
    )
    sha = result.stdout.strip()
    if result.returncode != 0 or not sha:
        raise NotFound(f"{rev!r} is not a commit in {repo}.")
    return sha


async def _current_branch(worktree: Path) -> str | None:
    result = await _git(worktree, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


async def _common_dir(path: Path) -> Path:
    result = await _git(path, "rev-parse", "--git-common-dir")
    common = Path(result.stdout.strip())
    return (common if common.is_absolute() else path / common).resolve()


# --- commits and diffs --------------------------------------------------------------------------


async def head(repo: Path) -> str:
    """The full id of the commit HEAD points at."""
    sha = await head_commit(repo)
    if sha is None:
        raise GitError(f"{repo} has no commits yet.")
    return sha


async def commit_all(worktree: Path, message: str, *, author: str = DEFAULT_AUTHOR) -> str | None:
    """Stage every change in `worktree` (new, modified, deleted and untracked files; ignored ones
    stay out) and commit it as `author`; return the new commit's id, or None when there was
    nothing to commit."""
    if not message.strip():
        raise InvalidRequest("A commit message must not be empty.")
    config = _commit_config(author)
    await _git(worktree, "add", "--all")
    staged = await _git(worktree, "diff", "--cached", "--quiet", "--no-ext-diff", ok=(0, 1))
    if staged.returncode == 0:
        return None
    await _git(
        worktree,
        *config,
        "commit",
        "--quiet",
        "--no-verify",
        "--cleanup=verbatim",
        f"--author={author.strip()}",
        "-m",
        message,
    )
    return await head(worktree)


async def changed_files(repo: Path, base: str, tip: str) -> list[str]:
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


async def diff_stat(repo: Path, base: str, tip: str) -> str:
    """`git diff --stat` from `base` to `tip` (wide enough that paths are not shortened)."""
    _check_rev(base)
    _check_rev(tip)
    result = await _git(
        repo, "diff", "--stat=200", "--no-color", "--no-ext-diff", "--end-of-options", base, tip, "--"
    )
    return result.stdout


async def diff_text(repo: Path, base: str, tip: str, *, max_chars: int = 200_000) -> str:
    """The patch from `base` to `tip`; past `max_chars` it is cut and a marker line says so."""
    _check_rev(base)
    _check_rev(tip)
    result = await _git(repo, "diff", *_DIFF_OPTIONS, "--end-of-options", base, tip, "--")
    return _cap(result.stdout, max_chars, "diff")


# --- containment (workflow step 5) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Status:
    xy: str
    path: str
    orig: str | None  # the source of a rename or copy


async def _status(checkout: Path, *, renames: bool) -> list[_Status]:
    """`git status --porcelain -z` of the whole working tree, every untracked file listed; paths
    are relative to its top directory. Read only: no index refresh (`GIT_OPTIONAL_LOCKS=0`)."""
    args = ["status", "--porcelain=v1", "-z", "--untracked-files=all"]
    args.append("--find-renames" if renames else "--no-renames")
    raw = await _git_raw(checkout, *args)
    fields = [os.fsdecode(field) for field in raw.stdout.split(b"\0")]
    entries: list[_Status] = []
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if len(field) < 4:
            continue
        xy, path = field[:2], field[3:]
        orig: str | None = None
        if "R" in xy or "C" in xy:
            orig = fields[i] if i < len(fields) else None
            i += 1
        entries.append(_Status(xy, path, orig))
    return entries


async def dirty_paths(checkout: Path) -> list[str]:
    """Every path `git status --porcelain` reports in `checkout`, untracked files included (each
    file, not its directory), a rename by its new path; relative to the top, sorted."""
    return sorted({entry.path for entry in await _status(checkout, renames=True)})


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


def _move_untracked(checkout: Path, worktree: Path, paths: Sequence[str], scope: Sequence[str]) -> None:
    for relative in paths:
        source, target = checkout / relative, worktree / relative
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


async def _apply_patch(worktree: Path, patch: bytes) -> None:
    """Apply `patch` to `worktree`: a three-way apply first (it merges when the worktree's base
    is not the checkout's HEAD), else a plain one (it works when the worktree has unstaged edits
    on those files, which `--3way` refuses). Either is checked first; a patch that would only
    apply with conflicts raises and leaves the worktree as it was."""
    common = ("apply", "--whitespace=nowarn")
    three_way = await _git_raw(worktree, *common, "--3way", "--check", ok=(0, 1, 128), stdin=patch)
    if three_way.returncode == 0 and "with conflicts" not in three_way.stderr:
        await _git_raw(worktree, *common, "--3way", stdin=patch)
        return
    plain = await _git_raw(worktree, *common, "--check", ok=(0, 1, 128), stdin=patch)
    if plain.returncode == 0:
        await _git_raw(worktree, *common, stdin=patch)
        return
    reason = _trim(three_way.stderr) or _trim(plain.stderr)
    raise GitError(
        f"The escaped edits do not apply to the worktree {worktree} without conflicts; "
        f"the checkout was left as it was: {reason}"
    )


async def recover_escaped(checkout: Path, worktree: Path, packet_files: list[str]) -> list[str]:
    """Move a packet's edits that landed in the orchestrator's `checkout` into its `worktree`.

    Only dirty paths in the packet's scope are considered: a path equal to an entry of
    `packet_files` or under one (an entry may be a directory). Tracked changes, staged and
    unstaged, travel as `git diff HEAD` applied in the worktree; untracked files are moved to the
    same relative path; then the tracked paths are restored to HEAD in the checkout (index and
    files). Nothing outside the scope is read into a patch, moved or restored: it may be the
    user's own uncommitted work. Everything that could fail (a patch that does not apply, an
    untracked file whose destination already holds something else) is checked before anything
    changes, and then the checkout is left untouched. Returns the recovered paths, sorted.
    """
    scope = _scope(packet_files)
    checkout_top = await toplevel(checkout)
    worktree_top = await toplevel(worktree)
    if _same_path(checkout_top, worktree_top):
        raise InvalidRequest(f"The checkout and the worktree are the same directory: {checkout_top}.")

    async with _lock("checkout", checkout_top):
        tracked: list[str] = []
        untracked: list[str] = []
        for entry in await _status(checkout_top, renames=False):
            if not _in_scope(entry.path, scope):
                continue
            if entry.xy == "??":
                # A trailing `/` is a nested repository: not a file to move.
                if not entry.path.endswith("/"):
                    untracked.append(entry.path)
            elif entry.xy != "!!":
                tracked.append(entry.path)
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
            patch = await _git_raw(
                checkout_top,
                "--literal-pathspecs",
                "diff",
                "HEAD",
                "--binary",
                "--full-index",
                "--no-renames",
                *_DIFF_OPTIONS,
                "--",
                *tracked,
            )
            if patch.stdout:
                await _apply_patch(worktree_top, patch.stdout)

        if untracked:
            try:
                await asyncio.to_thread(_move_untracked, checkout_top, worktree_top, untracked, scope)
            except OSError as exc:
                raise GitError(
                    f"Moving untracked packet files from {checkout_top} to {worktree_top} failed "
                    f"part way: {exc}"
                ) from exc

        if tracked:
            await _git(
                checkout_top,
                "--literal-pathspecs",
                "restore",
                "--staged",
                "--worktree",
                "--source=HEAD",
                "--",
                *tracked,
            )
        return sorted(tracked + untracked)


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


async def _protected_branches(repo: Path) -> set[str]:
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


async def _unmerged_paths(worktree: Path) -> list[str]:
    result = await _git_raw(worktree, "ls-files", "--unmerged", "-z")
    paths = set()
    for record in result.stdout.split(b"\0"):
        _, tab, path = record.partition(b"\t")
        if tab:
            paths.add(os.fsdecode(path))
    return sorted(paths)


async def _merge_in_progress(worktree: Path) -> bool:
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
    top = await toplevel(integration_worktree)
    if await _common_dir(top) != await _common_dir(repo):
        raise InvalidRequest(f"{top} is not a worktree of the repository {repo}.")
    worktrees = await _worktrees(repo)
    if worktrees and _same_path(worktrees[0].path, top):
        raise InvalidRequest(
            f"{top} is the repository's own checkout; integrate in a separate worktree instead."
        )
    target = await _current_branch(top)
    if target is None:
        raise InvalidRequest(f"{top} is not on a branch (detached HEAD); nothing to merge into.")
    if target in await _protected_branches(repo):
        raise InvalidRequest(
            f"Refusing to merge into {target}: orchestrate never commits to the main branch."
        )
    if target == branch:
        raise InvalidRequest(f"Cannot merge {branch} into itself.")

    async with _lock("merge", top):
        if await _merge_in_progress(top):
            raise Conflict(f"A merge is already in progress in {top}.")
        dirty = await _git(top, "status", "--porcelain=v1", "--untracked-files=no")
        if dirty.stdout.strip():
            raise Conflict(f"The integration worktree {top} has uncommitted changes:\n{dirty.stdout}")
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
            shown = await _git(top, "diff", *_DIFF_OPTIONS)
            conflict_text = _cap(shown.stdout, CONFLICT_TEXT_MAX_CHARS, "conflict diff")
        await _git(top, "merge", "--abort")
        after = await head(top)
        if after != before:
            raise GitError(f"Aborting the merge of {branch} in {top} left HEAD at {after}, not {before}.")
        if not conflicts:
            raise GitError(f"Merging {branch} into {target} in {top} failed and was aborted:\n{output}")
        return MergeResult(
            merged=False,
            commit=None,
            conflicts=conflicts,
            output=f"{output}\n\n{conflict_text}" if conflict_text else output,
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


# --- verification commands ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    """A verification command's outcome: `exit_code` is None when it timed out (its process group
    was killed), else its exit status (negative: killed by that signal); `output` is the last
    20,000 characters of its combined stdout and stderr."""

    exit_code: int | None
    output: str
    timed_out: bool
    seconds: float

    @property
    def passed(self) -> bool:
        return not self.timed_out and self.exit_code == 0


class _CheckProtocol(asyncio.SubprocessProtocol):
    """Keeps the tail of the output; events for "the shell exited" and "the output pipe closed"
    (a background process the command left behind may hold the pipe long after the shell)."""

    def __init__(self) -> None:
        self.tail = bytearray()
        self.exited = asyncio.Event()
        self.eof = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.tail += data
        if len(self.tail) > _CHECK_TAIL_BYTES:
            del self.tail[:-_CHECK_TAIL_BYTES]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.eof.set()

    def process_exited(self) -> None:
        self.exited.set()


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def run_check(
    cwd: Path,
    command: str,
    *,
    timeout_s: float = 900.0,
    env: Mapping[str, str] | None = None,
) -> CheckResult:
    """Run `command` with `/bin/sh -c` in `cwd`, in its own process group, stdin from /dev/null.

    The environment is peerd's own (minus variables that would point git at another repository)
    with `env` laid over it. After `timeout_s` the group gets SIGTERM, then SIGKILL; processes the
    command leaves running in its group are killed when it exits."""
    loop = asyncio.get_running_loop()
    child_env = {key: value for key, value in os.environ.items() if key not in _REPO_LOCATION_VARS}
    if env is not None:
        child_env.update(env)
    started = loop.time()
    try:
        transport, protocol = await loop.subprocess_exec(
            _CheckProtocol,
            "/bin/sh",
            "-c",
            command,
            cwd=cwd,
            env=child_env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise InvalidRequest(f"Cannot run the check {command!r} in {cwd}: {exc}") from exc
    pgid = transport.get_pid()  # a session leader's group id is its pid
    timed_out = False
    try:
        try:
            await asyncio.wait_for(protocol.exited.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            _kill_group(pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(protocol.exited.wait(), _CHECK_TERM_GRACE_S)
            except TimeoutError:
                _kill_group(pgid, signal.SIGKILL)
                await protocol.exited.wait()
        # Whatever the command started in its group and left behind goes with it.
        _kill_group(pgid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            # Something that left the group (setsid) may still hold the pipe: stop waiting then.
            await asyncio.wait_for(protocol.eof.wait(), _CHECK_EOF_GRACE_S)
    except BaseException:
        _kill_group(pgid, signal.SIGKILL)
        raise
    finally:
        transport.close()
    seconds = loop.time() - started
    output = protocol.tail.decode("utf-8", "replace")[-CHECK_OUTPUT_MAX_CHARS:]
    return CheckResult(
        exit_code=None if timed_out else transport.get_returncode(),
        output=output,
        timed_out=timed_out,
        seconds=seconds,
    )
