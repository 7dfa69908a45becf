"""Verification commands: a packet's check in its own process group, with a timeout and the tail of
its output; and the tool caches a fresh checkout for a check starts with (`seed_caches`).

Where a check's time goes (bench/checks.py, docs/internals/orchestrate.md#verification): running
it the way peerd does costs nothing over running it by hand (the same shell, the daemon's own
environment and CPU priority, no sandbox); a fresh checkout does. Tools keep their caches in the
checkout (`.mypy_cache`, `.ruff_cache`, `.pytest_cache`, ...), and a check in a new worktree
started them cold: mypy over 30 modules took 8.0 s there against 0.5 s in the project's checkout.
So a fresh checkout gets a copy of the project checkout's cache directories first: the top-level
ones that say they are caches (a `CACHEDIR.TAG`, https://bford.info/cachedir/), up to
`SEED_MAX_BYTES` in all. A cache checks itself against the files (mypy by content hash, the others
by time stamps, which a new checkout changes), so a copy makes a check faster, never wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import InvalidRequest
from peerd.runtime.git import REPO_LOCATION_VARS

CHECK_OUTPUT_MAX_CHARS = 20_000
# A UTF-8 character is at most 4 bytes: this many bytes always hold the last 20,000 characters.
_CHECK_TAIL_BYTES = 4 * CHECK_OUTPUT_MAX_CHARS
# After SIGTERM on timeout, how long the group gets before SIGKILL.
_CHECK_TERM_GRACE_S = 2.0
# After the command exits (and its group is killed), how long to wait for the output pipe to close.
_CHECK_EOF_GRACE_S = 2.0

# The most a fresh checkout is seeded with (a cache bigger than this is a build tree: cargo's
# `target/` is tagged too; copying it would cost more than it saves).
SEED_MAX_BYTES = 256 * 2**20
CACHE_TAG = "CACHEDIR.TAG"
# A Python virtual environment says it is one with this file. uv tags its `.venv` as a cache too,
# but an editable install in it points at the person's checkout: a check run with a copy would
# import their code, not the commit's. Never copied.
VENV_MARK = "pyvenv.cfg"
_TAG_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"

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
    child_env = {key: value for key, value in os.environ.items() if key not in REPO_LOCATION_VARS}
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


# --- warm caches for a fresh checkout -----------------------------------------------------------


def _tagged(path: Path) -> bool:
    try:
        with (path / CACHE_TAG).open("rb") as tag:
            return tag.read(len(_TAG_SIGNATURE)) == _TAG_SIGNATURE
    except OSError:
        return False


def _size(path: Path, limit: int) -> int:
    """The bytes of the files under `path`, counting only until past `limit`."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
            if total > limit:
                return total
    return total


def cache_dirs(checkout: Path, *, limit: int = SEED_MAX_BYTES) -> list[str]:
    """The names of `checkout`'s top-level cache directories (a `CACHEDIR.TAG` in each, not symbolic
    links, not virtual environments), in name order, as many as fit in `limit` bytes together."""
    try:
        entries = sorted(os.scandir(checkout), key=lambda e: e.name)
    except OSError:
        return []
    chosen: list[str] = []
    left = limit
    for entry in entries:
        if entry.name == ".git" or not entry.is_dir(follow_symlinks=False) or not _tagged(Path(entry.path)):
            continue
        if (Path(entry.path) / VENV_MARK).exists():
            continue  # a virtual environment (uv tags its .venv): a copy would run the checkout's code

        size = _size(Path(entry.path), left)
        if size <= left:
            chosen.append(entry.name)
            left -= size
    return chosen


def _copy(checkout: Path, target: Path, names: list[str]) -> list[str]:
    copied = []
    for name in names:
        if (target / name).exists():
            continue  # the commit has it (tracked), or it is there already
        with contextlib.suppress(OSError, shutil.Error):
            shutil.copytree(checkout / name, target / name, symlinks=True)
            copied.append(name)
    return copied


async def seed_caches(checkout: Path, target: Path) -> list[str]:
    """Copy the project checkout's cache directories (`cache_dirs`) into `target`, a fresh checkout
    a check is about to run in; returns the names copied. Best effort: a copy that fails is
    skipped (the check then starts that cache cold, as it would have)."""

    def work() -> list[str]:
        return _copy(checkout, target, cache_dirs(checkout))

    return await asyncio.to_thread(work)
