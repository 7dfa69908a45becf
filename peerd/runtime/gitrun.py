"""The one runner every git command peerd runs goes through (`_git`/`_git_raw`), and the recorded
locations commands in agent-writable directories use.

Every call runs `git ...` with an argument list (never a shell), in a worker thread (never on the
event loop), stdin closed, and two layers that keep repository content from steering git:

- **A fixed environment** (`_git_env`): every inherited `GIT_*` variable is dropped (location
  variables such as `GIT_DIR`, `GIT_EXTERNAL_DIFF`, `GIT_SSH_COMMAND`, `GIT_CONFIG_PARAMETERS`,
  `GIT_EXEC_PATH`, ...), system and global config are off (`GIT_CONFIG_NOSYSTEM`,
  `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_ATTR_NOSYSTEM`), and nothing can prompt or page
  (`GIT_TERMINAL_PROMPT=0`, an empty `GIT_ASKPASS`, `GIT_EDITOR=true`, `GIT_PAGER=cat`).
- **`-c` overrides** before the subcommand (`SAFE_CONFIG`), which win over any repository config:
  no fsmonitor, no hooks (`core.hooksPath=/dev/null`), no pager, askpass, credential helper or
  external diff, no signing, no network transports (only local files: bundles), no untracked cache
  and no submodule recursion.

Filters, diff and merge drivers named by a `.gitattributes` file run only when a config defines
them; with system and global config off, that is only the repository's own config, which belongs to
the box owner (agents cannot write it: runs are confined). What an agent *can* write is its
worktree, so a command in a directory an agent could write names the git dir and work tree
explicitly (`GitLocation`, found by `locate_worktree` from the project checkout's own
`worktrees/<id>/gitdir` records), never from a `.git` file found there.

A failure raises `GitError` carrying git's own stderr, with any `//user:password@` credentials
scrubbed; a path that is not in a git repository raises `InvalidRequest`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from peerd.errors import GitError, InvalidRequest, NotFound

__all__ = [
    "SAFE_CONFIG",
    "GitLocation",
    "Where",
    "WorktreeRecord",
    "admin_root_of",
    "checkout_location",
    "common_dir",
    "find_record",
    "locate_worktree",
    "own_common_dir",
]

# Variables that would point git at another repository, index or object store than the `-C`
# directory (they are set, e.g., when peerd is started from inside a git hook). git itself drops
# every `GIT_*` variable (see `_git_env`); verification commands drop these (orchestrate/checks.py).
_REPO_LOCATION_VARS = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
        "GIT_CEILING_DIRECTORIES",
    }
)
# Not `GIT_*`, but read by git (or the ssh it would start) to run a program.
_DROPPED_VARS = frozenset({"SSH_ASKPASS", "PAGER", "EDITOR", "VISUAL"})

_ENV_OVERRIDES: Mapping[str, str] = {
    # Never wait for a password on a terminal nobody is watching, and run no askpass program
    # (an empty GIT_ASKPASS wins over `core.askPass` and SSH_ASKPASS).
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    # No system or global config, attributes or identity: only the repository's own config and
    # the `-c` options below.
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_SYSTEM": os.devnull,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    # Nothing interactive: an editor that accepts, a pager that copies.
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
    "GIT_PAGER": "cat",
    # English messages: the stderr checks below match git's wording.
    "LC_ALL": "C",
    # `git status`/`git diff` otherwise refresh and rewrite the index opportunistically, which
    # takes `index.lock` and can make the user's own git command fail while we look.
    "GIT_OPTIONAL_LOCKS": "0",
}

# `-c` options put before every subcommand: command-line config wins over the repository's config
# (and reaches the git processes a command starts, through GIT_CONFIG_PARAMETERS). Each one turns
# off a way config makes git run a program; where git would run the empty value, it refuses.
SAFE_CONFIG: tuple[str, ...] = tuple(
    arg
    for setting in (
        "core.fsmonitor=false",  # a command run by status, add, commit, diff, ...
        "core.hooksPath=/dev/null",  # no hook: pre-commit, post-commit, reference-transaction, ...
        "core.pager=cat",
        "core.askPass=",
        "credential.helper=",  # the empty value clears the list of helpers
        "diff.external=",  # our diffs pass --no-ext-diff too; an empty command is refused
        "commit.gpgSign=false",
        "tag.gpgSign=false",
        "merge.verifySignatures=false",
        "log.showSignature=false",
        "gpg.program=false",
        "gpg.ssh.program=false",
        "gpg.x509.program=false",
        # Transports: only local paths (bundle files); never ssh (core.sshCommand), git://
        # (core.gitProxy), http or a remote helper.
        "protocol.allow=never",
        "protocol.file.allow=always",
        "protocol.ext.allow=never",
        "protocol.ssh.allow=never",
        "protocol.git.allow=never",
        "protocol.http.allow=never",
        "protocol.https.allow=never",
        "core.untrackedCache=false",
        "submodule.recurse=false",
        "fetch.recurseSubmodules=false",
    )
    for arg in ("-c", setting)
)

# Stable, config-independent patch output: the user's color, external diff tool, `diff.relative`
# or `diff.noprefix` settings must not change what a peer receives. `--ignore-submodules=dirty`
# (on the command line, so a `.gitmodules` an agent wrote cannot undo it): a nested repository's
# commit still shows, but git never runs inside its work tree, where its own config would apply.
IGNORE_NESTED = "--ignore-submodules=dirty"
_DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-relative",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    IGNORE_NESTED,
)

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s]*@")
_MAX_STDERR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class GitLocation:
    """A repository named explicitly, from peerd's own records: git runs with
    `--git-dir=git_dir --work-tree=work_tree`, whatever `.git` file or directory the work tree
    holds. Both paths are absolute."""

    git_dir: Path
    work_tree: Path


# Where a git command runs: a directory (git finds its repository, for the owner's checkouts and
# peerd's own repositories) or an explicit location (anything an agent could write).
Where = Path | GitLocation


@dataclass(frozen=True, slots=True)
class _Result:
    returncode: int
    stdout: str
    stderr: str


def _git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") and k not in _REPO_LOCATION_VARS and k not in _DROPPED_VARS
    }
    env.update(_ENV_OVERRIDES)
    if extra:
        env.update(extra)
    return env


def _argv(where: Where, args: tuple[str, ...]) -> list[str]:
    if isinstance(where, GitLocation):
        top = str(where.work_tree)
        place = ["-C", top, f"--git-dir={where.git_dir}", f"--work-tree={top}"]
    else:
        place = ["-C", str(where)]
    return ["git", *place, *SAFE_CONFIG, *args]


def _dir_of(where: Where) -> Path:
    return where.work_tree if isinstance(where, GitLocation) else where


def _scrub(text: str) -> str:
    """Drop `user:password@` from any URL in `text`, so tokens never reach a message or log."""
    return _CREDENTIALS.sub(r"\g<scheme>", text)


def _trim(stderr: str) -> str:
    text = stderr.strip()
    if len(text) > _MAX_STDERR_CHARS:
        # The end of git's stderr holds the `fatal:` line that explains the failure.
        text = "..." + text[-_MAX_STDERR_CHARS:]
    return text


@dataclass(frozen=True)
class _Raw:
    returncode: int
    stdout: bytes
    stderr: str


async def _git(
    where: Where,
    *args: str,
    ok: Collection[int] = (0,),
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> _Result:
    """Run git with `args` at `where`; raise unless the exit code is in `ok`."""
    raw = await _git_raw(where, *args, ok=ok, stdin=stdin, env=env)
    # `replace`: file contents in a diff need not be UTF-8, and a message must still be built.
    return _Result(raw.returncode, raw.stdout.decode("utf-8", "replace"), raw.stderr)


class _Running:
    """One git process run by a worker thread; a cancelled caller kills it (`cancel`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cancelled = False

    def run(self, argv: list[str], stdin: bytes | None, env: dict[str, str]) -> tuple[int, bytes, bytes]:
        with self._lock:
            if self._cancelled:
                return -1, b"", b""
            self._proc = subprocess.Popen(  # an argument list: git, never a shell
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        out, err = self._proc.communicate(stdin)
        return self._proc.returncode, out, err

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None and self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()


# git runs in these threads, not on the event loop: a spawn (fork/exec, and asyncio's child watcher
# starting a thread per process) blocks the loop thread for its whole duration, and the daemon's
# loop is what answers every request. Bounded, so a burst of launches queues here, not in the kernel.
GIT_THREADS = 16
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(GIT_THREADS, thread_name_prefix="peerd-git")


async def _git_raw(
    where: Where,
    *args: str,
    ok: Collection[int] = (0,),
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> _Raw:
    """Like `_git`, but stdout stays bytes (patches and file names need not be UTF-8). `env` adds
    variables peerd chooses (an object quarantine) over the fixed environment. The process is
    spawned and waited for in a worker thread (`_EXECUTOR`); a cancelled caller kills it."""
    running = _Running()
    done = asyncio.get_running_loop().run_in_executor(
        _EXECUTOR, running.run, _argv(where, args), stdin, _git_env(env)
    )
    try:
        returncode, out, raw_err = await asyncio.shield(done)
    except FileNotFoundError as exc:
        raise GitError("git is not installed or not on PATH.") from exc
    except BaseException:
        # Cancelled (or failed) mid-run: do not leave a git process behind.
        running.cancel()
        with contextlib.suppress(Exception):
            await asyncio.shield(done)
        raise
    result = _Raw(returncode, out, raw_err.decode("utf-8", "replace"))
    if returncode not in ok:
        _raise_for(where, args, _Result(returncode, "", result.stderr))
    return result


def _raise_for(where: Where, args: tuple[str, ...], result: _Result) -> NoReturn:
    cwd = _dir_of(where)
    stderr = _trim(result.stderr)
    if "fatal: not a git repository" in stderr:
        raise InvalidRequest(f"{cwd} is not inside a git repository.")
    if "fatal: cannot change to" in stderr:
        raise InvalidRequest(f"{cwd} does not exist or is not a directory.")
    if "fatal: this operation must be run in a work tree" in stderr:
        raise InvalidRequest(f"{cwd} is not inside a git working tree (is it a bare repository?).")
    command = " ".join(["git", *args])
    detail = f": {stderr}" if stderr else ""
    raise GitError(_scrub(f"`{command}` in {cwd} failed (exit {result.returncode}){detail}"))


# --- recorded locations -------------------------------------------------------------------------


async def common_dir(where: Where) -> Path:
    """The repository's common git dir (where `objects`, `refs` and `worktrees/` live)."""
    result = await _git(where, "rev-parse", "--git-common-dir")
    common = Path(result.stdout.strip())
    return (common if common.is_absolute() else _dir_of(where) / common).resolve()


async def checkout_location(checkout: Path) -> GitLocation:
    """The explicit location of a project checkout (the owner's; an in-place thread's agent works
    in it): its `.git` directory. A checkout whose `.git` is a file (itself a linked worktree of
    another repository, registered so by its owner) is resolved by git, once, with the safe
    options: reading config runs nothing."""
    top = checkout.absolute()
    dotgit = top / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        return GitLocation(dotgit, top)
    result = await _git(top, "rev-parse", "--absolute-git-dir")
    return GitLocation(Path(result.stdout.strip()), top)


def _gitfile_target(admin: Path) -> Path | None:
    try:
        text = (admin / "gitdir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text:
        return None
    target = Path(text)
    # git >= 2.48 may record it relative to the admin directory (`worktree.useRelativePaths`).
    return target if target.is_absolute() else admin / target


def own_common_dir(location: GitLocation) -> Path | None:
    """The common git dir of a checkout's own git dir, read from its `commondir` file (present in a
    linked worktree's git dir) as git reads it, without running git; None if it cannot be read."""
    try:
        text = (location.git_dir / "commondir").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return location.git_dir.resolve()
    except (OSError, UnicodeDecodeError):
        return None
    common = Path(text)
    return (common if common.is_absolute() else location.git_dir / common).resolve()


@dataclass(frozen=True, slots=True)
class WorktreeRecord:
    """A linked worktree as the checkout's git dir records it: its admin directory
    `<common dir>/worktrees/<id>` and the branch its `HEAD` names (None when detached)."""

    admin: Path
    work_tree: Path
    branch: str | None


def _record_at(admin: Path, work_tree: Path) -> WorktreeRecord | None:
    target = _gitfile_target(admin)
    # Compare the directory holding `.git` (resolving links), never following `.git` itself.
    if target is None or target.name != ".git" or Path(os.path.realpath(target.parent)) != work_tree:
        return None
    try:
        head = (admin / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        head = ""
    branch = head.removeprefix("ref: refs/heads/") if head.startswith("ref: refs/heads/") else None
    return WorktreeRecord(admin.resolve(), work_tree, branch)


def find_record(admin_root: Path, worktree: Path, *, thorough: bool) -> WorktreeRecord | None:
    """The record of `worktree` under `admin_root` (`<common dir>/worktrees`), in O(1) for the
    worktrees peerd makes: git names the admin directory after the worktree's base name (with a
    number appended when that name is taken), so that name is looked at first, then names that
    start with it, and only with `thorough` every other record (a name git sanitised)."""
    work_tree = Path(os.path.realpath(worktree))
    name = worktree.name
    found = _record_at(admin_root / name, work_tree) if name else None
    if found is not None:
        return found
    try:
        names = sorted(entry.name for entry in os.scandir(admin_root) if entry.name != name)
    except OSError:
        return None
    near = [n for n in names if name and n.startswith(name)]
    rest = [n for n in names if not (name and n.startswith(name))] if thorough else []
    for candidate in near + rest:
        found = _record_at(admin_root / candidate, work_tree)
        if found is not None:
            return found
    return None


async def admin_root_of(repo: Path) -> Path:
    """`<common dir>/worktrees` of the project checkout `repo` (git runs only for a checkout whose
    `.git` is not a plain directory, or whose `commondir` cannot be read)."""
    common = own_common_dir(await checkout_location(repo))
    return (common if common is not None else await common_dir(repo)) / "worktrees"


async def locate_worktree(repo: Path, worktree: Path, *, restore: bool = True) -> GitLocation:
    """The recorded location of `worktree`, a linked worktree of the project checkout `repo`: its
    git dir is the admin directory `<repo's common dir>/worktrees/<id>` whose `gitdir` file names
    `<worktree>/.git` (`find_record`). The worktree's own `.git` (which its agent may have rewritten
    to point at a git dir it made, with hooks or an fsmonitor in its config) is never read; with
    `restore`, one that does not point at the record is put back as git wrote it."""
    admin_root = await admin_root_of(repo)
    record = find_record(admin_root, worktree, thorough=True)
    if record is None:
        raise NotFound(f"{worktree} is not a worktree of {repo} (no record of it in {admin_root}).")
    location = GitLocation(record.admin, record.work_tree)
    if restore:
        await asyncio.to_thread(_restore_gitfile, location)
    return location


def _restore_gitfile(location: GitLocation) -> None:
    if not location.work_tree.is_dir():
        return  # the worktree is gone: nothing to put back
    dotgit = location.work_tree / ".git"
    wanted = f"gitdir: {location.git_dir}\n"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if not dotgit.is_symlink() and dotgit.is_file() and dotgit.read_text(encoding="utf-8") == wanted:
            return
    if dotgit.is_dir() and not dotgit.is_symlink():
        shutil.rmtree(dotgit, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        dotgit.unlink()
    dotgit.write_text(wanted, encoding="utf-8")
