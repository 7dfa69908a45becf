"""The one runner every git process peerd starts goes through: `run` (text out) and `run_raw`
(bytes out). Nothing outside `peerd/runtime/git/` spawns git (tests/unit/test_git_boundary.py).

Every call runs `git ...` with an argument list (never a shell), in a worker thread of a bounded
pool (`GIT_THREADS`; never on the event loop), stdin closed unless peerd passes bytes, and two
layers that keep repository content from steering git:

- **A fixed environment** (`_env`): every inherited `GIT_*` variable is dropped (location
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
explicitly (`GitLocation`, found by `locations.locate_worktree` from the project checkout's own
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
import subprocess
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from peerd.errors import GitError, InvalidRequest

__all__ = [
    "DIFF_OPTIONS",
    "GIT_THREADS",
    "IGNORE_NESTED",
    "REPO_LOCATION_VARS",
    "SAFE_CONFIG",
    "GitLocation",
    "RawResult",
    "Result",
    "Where",
    "dir_of",
    "raise_for",
    "run",
    "run_raw",
    "trim_stderr",
]

# Variables that would point git at another repository, index or object store than the `-C`
# directory (they are set, e.g., when peerd is started from inside a git hook). git itself drops
# every `GIT_*` variable (see `_env`); verification commands drop these (orchestrate/checks.py).
REPO_LOCATION_VARS = frozenset(
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
DIFF_OPTIONS = (
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
class Result:
    """What a git process answered, its stdout as text (`run`)."""

    returncode: int
    stdout: str
    stderr: str


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") and k not in REPO_LOCATION_VARS and k not in _DROPPED_VARS
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


def dir_of(where: Where) -> Path:
    """The directory a command at `where` runs in (its work tree, for a `GitLocation`)."""
    return where.work_tree if isinstance(where, GitLocation) else where


def _scrub(text: str) -> str:
    """Drop `user:password@` from any URL in `text`, so tokens never reach a message or log."""
    return _CREDENTIALS.sub(r"\g<scheme>", text)


def trim_stderr(stderr: str) -> str:
    """git's stderr for a message: stripped, and past 2,000 characters only its end."""
    text = stderr.strip()
    if len(text) > _MAX_STDERR_CHARS:
        # The end of git's stderr holds the `fatal:` line that explains the failure.
        text = "..." + text[-_MAX_STDERR_CHARS:]
    return text


@dataclass(frozen=True)
class RawResult:
    """What a git process answered, its stdout as bytes (`run_raw`)."""

    returncode: int
    stdout: bytes
    stderr: str


async def run(
    where: Where,
    *args: str,
    ok: Collection[int] = (0,),
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> Result:
    """Run git with `args` at `where`; raise unless the exit code is in `ok`."""
    raw = await run_raw(where, *args, ok=ok, stdin=stdin, env=env)
    # `replace`: file contents in a diff need not be UTF-8, and a message must still be built.
    return Result(raw.returncode, raw.stdout.decode("utf-8", "replace"), raw.stderr)


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


async def run_raw(
    where: Where,
    *args: str,
    ok: Collection[int] = (0,),
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> RawResult:
    """Like `run`, but stdout stays bytes (patches and file names need not be UTF-8). `env` adds
    variables peerd chooses (an object quarantine) over the fixed environment. The process is
    spawned and waited for in a worker thread (`_EXECUTOR`); a cancelled caller kills it."""
    running = _Running()
    done = asyncio.get_running_loop().run_in_executor(
        _EXECUTOR, running.run, _argv(where, args), stdin, _env(env)
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
    result = RawResult(returncode, out, raw_err.decode("utf-8", "replace"))
    if returncode not in ok:
        raise_for(where, args, Result(returncode, "", result.stderr))
    return result


def raise_for(where: Where, args: tuple[str, ...], result: Result) -> NoReturn:
    """The error of a git command that failed: `InvalidRequest` when `where` is not a repository
    (or not a directory, or bare), else `GitError` with git's own stderr, credentials scrubbed."""
    cwd = dir_of(where)
    stderr = trim_stderr(result.stderr)
    if "fatal: not a git repository" in stderr:
        raise InvalidRequest(f"{cwd} is not inside a git repository.")
    if "fatal: cannot change to" in stderr:
        raise InvalidRequest(f"{cwd} does not exist or is not a directory.")
    if "fatal: this operation must be run in a work tree" in stderr:
        raise InvalidRequest(f"{cwd} is not inside a git working tree (is it a bare repository?).")
    command = " ".join(["git", *args])
    detail = f": {stderr}" if stderr else ""
    raise GitError(_scrub(f"`{command}` in {cwd} failed (exit {result.returncode}){detail}"))
