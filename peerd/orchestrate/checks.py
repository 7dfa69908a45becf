"""Verification commands: a packet's check in its own process group, with a timeout and the tail of
its output."""

from __future__ import annotations

import asyncio
import contextlib
import os
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
