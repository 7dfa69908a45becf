"""An async driver for one provider CLI process: spawn, read JSON lines, interrupt the whole group.

Every provider CLI (the scripted coder, Codex, Claude Code, Gemini) runs the same way:

- in its own session and process group (`start_new_session=True`), so signals go to the group
  (`os.killpg`) and reach the helpers a CLI spawns (Gemini's launcher ignores INT/TERM and runs
  the real CLI as a child);
- stdout is the event stream, one JSON object per line; a line that is not a JSON object is kept
  as a raw diagnostic string;
- stderr is logs: it is drained all the time (a full pipe would block the child) and only its
  last 64 KiB are kept, for error messages;
- stdin gets the prompt and is closed, or is /dev/null, or (`duplex`) stays open for a CLI
  that is talked to while it runs (JSON lines both ways: `write_line`, `close_stdin`).

A daemon that was started with SIGINT or SIGQUIT ignored (`peerd serve &` from a script, `nohup`,
a program that embeds it) would pass that on: an ignored signal stays ignored across exec. Each
run is then started through a two-line shim (`with_default_signals`) that restores them first, so
an interrupt reaches the CLI at once instead of waiting for the SIGTERM fallback.

Interrupting escalates SIGINT -> SIGTERM -> SIGKILL on the group, and once the leader is gone
SIGKILLs whatever is left in the group. When the leader exits by itself but members of its group
still hold our stdout/stderr after `straggler_grace` seconds, they are orphans of the run and are
killed too, so reading never hangs on a forgotten background process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from peerd.errors import ProviderError

LINE_LIMIT = 16 * 1024 * 1024
STDERR_TAIL_BYTES = 64 * 1024
STDERR_HEAD_BYTES = 4 * 1024
_CHUNK = 64 * 1024
_T = TypeVar("_T")


def _required(value: _T | None, what: str) -> _T:
    if value is None:
        raise RuntimeError(f"the provider process has no {what}")
    return value


class _Reader(asyncio.StreamReaderProtocol):
    """One output pipe read into a StreamReader; `on_closed` runs once the pipe is closed."""

    def __init__(self, reader: asyncio.StreamReader, on_closed: Callable[[], None]) -> None:
        super().__init__(reader)
        self._on_closed = on_closed

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._on_closed()


class _Writer(asyncio.streams.FlowControlMixin):
    """The stdin pipe, for an `asyncio.StreamWriter` (drain, close, wait_closed)."""

    def __init__(self) -> None:
        super().__init__()
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


class _Child:
    """The child's pipes and exit, driven by the loop without a child watcher: its pipes are
    ordinary pipe transports, and its exit is seen on a pidfd (Linux; elsewhere a thread waits)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.stdout = asyncio.StreamReader(limit=LINE_LIMIT)
        self.stderr = asyncio.StreamReader(limit=LINE_LIMIT)
        self.stdin: asyncio.StreamWriter | None = None
        self.pipes_closed = asyncio.Event()
        self.exited = asyncio.Event()
        self._open = 2
        self._transports: list[asyncio.BaseTransport] = []
        self._pidfd: int | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for pipe, reader in ((self.popen.stdout, self.stdout), (self.popen.stderr, self.stderr)):
            transport, _ = await loop.connect_read_pipe(
                lambda reader=reader: _Reader(reader, self._pipe_closed),  # type: ignore[misc]
                _required(pipe, "output pipe"),
            )
            self._transports.append(transport)
        if self.popen.stdin is not None:
            writing, protocol = await loop.connect_write_pipe(_Writer, self.popen.stdin)
            self.stdin = asyncio.StreamWriter(writing, protocol, None, loop)
        self._watch_exit(loop)

    def _pipe_closed(self) -> None:
        self._open -= 1
        if self._open == 0:
            self.pipes_closed.set()

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._pidfd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):  # no pidfd here: a thread waits instead
            task = loop.run_in_executor(_SPAWNER, self.popen.wait)
            task.add_done_callback(lambda _f: self.exited.set())
            return
        loop.add_reader(self._pidfd, self._reaped, loop)
        self._reaped(loop)  # it may have exited already

    def _reaped(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.popen.poll() is None or self._pidfd is None:
            return
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        self.exited.set()

    def close_pipes(self) -> None:
        for transport in self._transports:
            transport.close()


# Restores the dispositions named in argv[1] (signal numbers), then becomes argv[2:]: stdlib only,
# no site packages (`-I -S`), so it costs a bare interpreter's start.
_RESET_SIGNALS = (
    "import os, signal, sys\n"
    "for n in sys.argv[1].split(','): signal.signal(int(n), signal.SIG_DFL)\n"
    "try: os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e: sys.stderr.write(f'cannot start {sys.argv[2]}: {e.strerror}\\n'); os._exit(127)"
)
RESET_ON_START = (signal.SIGINT, signal.SIGQUIT)


def with_default_signals(argv: list[str]) -> list[str]:
    """`argv`, started through a shim that restores SIGINT and SIGQUIT when this process ignores
    them (an ignored disposition survives exec; a handled one does not); else `argv` itself."""
    ignored = [sig for sig in RESET_ON_START if signal.getsignal(sig) is signal.SIG_IGN]
    if not ignored:
        return argv
    return [sys.executable, "-I", "-S", "-c", _RESET_SIGNALS, ",".join(str(int(s)) for s in ignored), *argv]


def _kill_started(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if started.cancelled() or started.exception() is not None:
        return
    popen = started.result()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    _SPAWNER.submit(popen.communicate)  # reaped, its pipes closed, off the loop


# Spawns run here, not on the event loop: fork/exec (and, with asyncio's own subprocesses, a
# child-watcher thread started per process) would block the loop thread for their duration.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="peerd-spawn")


class ProviderProcess:
    """One running provider CLI in its own process group. Create it with `spawn`."""

    def __init__(self, child: _Child, straggler_grace: float) -> None:
        self._child = child
        self._pid = child.popen.pid
        self._straggler_grace = straggler_grace
        self._stderr = bytearray()
        self._stderr_head = bytearray()
        self._stderr_cut = False  # the tail no longer starts where stderr started
        self._lines_taken = False
        # Set once a probe after the leader's exit found the group empty: from then on its id may
        # belong to someone else, so it is never signalled again.
        self._group_gone = False
        self._interrupt_task: asyncio.Task[None] | None = None
        self._exit_task = asyncio.create_task(self._wait_exit())
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._reaper_task = asyncio.create_task(self._reap_stragglers())
        self._stdin_task: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdin_data: bytes | None,
        straggler_grace: float = 2.0,
        duplex: bool = False,
    ) -> ProviderProcess:
        """Start `argv` in a new process group; raise `ProviderError` if it cannot start. The
        fork/exec happens in a worker thread (`_SPAWNER`), never on the event loop."""
        if not argv:
            raise ProviderError("cannot start a provider: empty command")
        loop = asyncio.get_running_loop()
        named, argv = argv[0], with_default_signals(argv)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(  # an argument list, never a shell
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.PIPE if stdin_data is not None or duplex else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )

        started = loop.run_in_executor(_SPAWNER, start)
        try:
            popen: subprocess.Popen[bytes] = await asyncio.shield(started)
        except OSError as exc:
            raise ProviderError(f"cannot start {named}: {exc}") from exc
        except asyncio.CancelledError:
            started.add_done_callback(_kill_started)  # cancelled mid-spawn: no orphan left behind
            raise
        child = _Child(popen)
        try:
            await child.connect()
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            raise
        process = cls(child, straggler_grace)
        if stdin_data is not None and not duplex:
            process._stdin_task = asyncio.create_task(process._feed_stdin(stdin_data))
        return process

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def pgid(self) -> int:
        # start_new_session makes the child a session and group leader: its pgid is its pid.
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._child.popen.returncode

    async def lines(self) -> AsyncIterator[dict[str, Any] | str]:
        """Each stdout line as a JSON object, or the raw text when it is not one; ends at EOF."""
        if self._lines_taken:
            raise RuntimeError("ProviderProcess.lines() can be consumed only once")
        self._lines_taken = True
        stdout = self._child.stdout
        while True:
            try:
                raw = await stdout.readline()
            except ValueError:
                # Over LINE_LIMIT: the reader dropped what it had; report it instead of failing.
                yield f"<stdout line over {LINE_LIMIT} bytes dropped>"
                continue
            if not raw:
                return
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except ValueError:
                yield text
                continue
            yield value if isinstance(value, dict) else text

    def stderr_tail(self) -> str:
        """What the process wrote to stderr: all of it up to ~64 KiB, else its first
        STDERR_HEAD_BYTES (where a CLI says what it refused) and its last ~64 KiB."""
        tail = self._stderr.decode("utf-8", errors="replace")
        if not self._stderr_cut:
            return tail
        head = self._stderr_head.decode("utf-8", errors="replace")
        return f"{head}\n...\n{tail}"

    async def wait(self) -> int:
        """Wait for the leader to exit and its output to be collected; return its returncode."""
        rc = await asyncio.shield(self._exit_task)
        await asyncio.shield(self._reaper_task)
        await asyncio.shield(self._stderr_task)
        if self._stdin_task is not None:
            await asyncio.shield(self._stdin_task)
        return rc

    def send_signal(self, sig: int) -> None:
        """Signal the whole group now; a group that is already gone is fine."""
        if self._group_gone:
            return
        try:
            os.killpg(self._pid, sig)
        except ProcessLookupError:
            if self._child.popen.returncode is not None:
                self._group_gone = True
        except PermissionError:
            # Only possible once the id was reused by someone else's group: ours is gone.
            self._group_gone = True

    async def interrupt(
        self, *, grace_int: float = 2.0, grace_term: float = 3.0, skip_sigint: bool = False
    ) -> None:
        """SIGINT, then SIGTERM, then SIGKILL the group, each after a grace; idempotent.

        `skip_sigint` starts at SIGTERM, for a CLI that ignores SIGINT without a terminal."""
        if self._interrupt_task is None:
            grace_int = 0.0 if skip_sigint else grace_int
            self._interrupt_task = asyncio.create_task(self._escalate(grace_int, grace_term, skip_sigint))
        await asyncio.shield(self._interrupt_task)

    async def kill_group(self) -> None:
        """SIGKILL the group at once (shutdown) and wait for the leader."""
        self.send_signal(signal.SIGKILL)
        await asyncio.shield(self._exit_task)
        self.send_signal(signal.SIGKILL)

    async def _escalate(self, grace_int: float, grace_term: float, skip_sigint: bool) -> None:
        for sig, grace in ((signal.SIGINT, grace_int), (signal.SIGTERM, grace_term)):
            if sig == signal.SIGINT and skip_sigint:
                continue
            if self._exit_task.done():
                break
            self.send_signal(sig)
            await asyncio.wait({self._exit_task}, timeout=grace)
        else:
            if not self._exit_task.done():
                self.send_signal(signal.SIGKILL)
        await asyncio.shield(self._exit_task)
        # A child that ignored the signals (or outlived the leader) must not survive the run.
        self.send_signal(signal.SIGKILL)

    async def _wait_exit(self) -> int:
        await self._child.exited.wait()
        returncode: int = _required(self._child.popen.returncode, "returncode after exit")
        return returncode

    async def _reap_stragglers(self) -> None:
        await asyncio.shield(self._exit_task)
        pipes_closed = self._child.pipes_closed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pipes_closed.wait(), self._straggler_grace)
            self._probe_group()
            return
        self.send_signal(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pipes_closed.wait(), 1.0)
            return
        # Something outside the group (it called setsid) still holds our pipes: stop reading.
        self._child.close_pipes()

    def _probe_group(self) -> None:
        try:
            os.killpg(self._pid, 0)
        except (ProcessLookupError, PermissionError):
            self._group_gone = True

    async def _drain_stderr(self) -> None:
        stderr = self._child.stderr
        while chunk := await stderr.read(_CHUNK):
            if len(self._stderr_head) < STDERR_HEAD_BYTES:
                self._stderr_head += chunk[: STDERR_HEAD_BYTES - len(self._stderr_head)]
            self._stderr += chunk
            if len(self._stderr) > STDERR_TAIL_BYTES:
                self._stderr_cut = True
                del self._stderr[:-STDERR_TAIL_BYTES]

    async def write_line(self, message: Mapping[str, Any]) -> bool:
        """Send one JSON object as a line on a duplex process's stdin; False once the child no
        longer reads it (exited, or closed its end)."""
        stdin = self._child.stdin
        if stdin is None or stdin.is_closing():
            return False
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"
        try:
            stdin.write(data)
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    async def close_stdin(self) -> None:
        """End a duplex process's input (many CLIs exit when it ends); idempotent."""
        stdin = self._child.stdin
        if stdin is None or stdin.is_closing():
            return
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()

    async def _feed_stdin(self, data: bytes) -> None:
        stdin = _required(self._child.stdin, "stdin pipe")
        # The child may exit without reading its input; that is its business, not an error here.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(data)
            await stdin.drain()
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()
