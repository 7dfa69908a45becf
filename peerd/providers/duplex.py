"""A coder CLI that is talked to while it runs: JSON lines both ways on stdin/stdout.

Claude Code (`--input-format stream-json` with `--permission-prompt-tool stdio`), `codex
app-server` (JSON-RPC 2.0) and Gemini CLI's ACP mode (JSON-RPC 2.0) all ask their host before a
guarded action and wait for the answer on stdin. Each has a pure driver (a `DuplexDriver`: lines
in, events and messages out, no I/O, no clock), and `DuplexRun` is the one shell around all of
them:

- the driver's `opening()` messages are written first (initialize, the prompt);
- each stdout line goes through `feed`; its outputs are run events (yielded to the run manager),
  `Send` (a line written to stdin), `AskPerson` (the gate is asked, in its own task, so the CLI's
  other output keeps flowing while a person decides) and `EndInput` (stdin closed);
- a decision comes back through `answered`, whose outputs are handled the same way;
- the driver alone is touched from the events loop, so it needs no locks; writes are serialised.

No answer means no action: a question still open when the run ends is simply dropped (the gate
records what became of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from peerd.providers.cli import BoundedRetries, CliRun, Launch, sandboxed
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk, ApprovalGate
from peerd.runtime.process import ProviderProcess
from peerd.runtime.provider import (
    ItemProduced,
    ProviderEvent,
    RunFinished,
    SessionStarted,
    UsageReported,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Send:
    """One JSON object to write to the CLI's stdin, as one line."""

    message: Mapping[str, Any]


@dataclass(frozen=True)
class AskPerson:
    """The CLI asks before a guarded action: the gate decides; `answered(ask.key, ...)` follows."""

    ask: ApprovalAsk


@dataclass(frozen=True)
class EndInput:
    """Close the CLI's stdin (the CLI ends once its input ends and its work is done).

    `linger_s`: a CLI that may stay up after its input ends (Gemini CLI with an MCP server
    connected) is ended with signals if it is still running that many seconds later."""

    linger_s: float | None = None


DuplexOutput = SessionStarted | ItemProduced | UsageReported | Send | AskPerson | EndInput


class DuplexDriver(Protocol):
    """A pure translator between peerd and one CLI's stdio protocol."""

    def opening(self) -> Sequence[DuplexOutput]:
        """What to send as soon as the CLI is up (initialize, the prompt)."""
        ...

    def feed(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        """One JSON line the CLI wrote."""
        ...

    def answered(self, key: str, answer: ApprovalAnswer) -> Sequence[DuplexOutput]:
        """The decision on the question `key` (an `AskPerson` this driver emitted)."""
        ...

    def interrupting(self) -> Sequence[DuplexOutput]:
        """Ask the CLI to stop politely, before signals (may be nothing)."""
        ...

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished: ...


_EOF = object()
POLITE_GRACE_S = 3.0  # how long a CLI asked to stop in its own protocol has before signals


class DuplexRun(CliRun):
    """A `CliRun` whose stdin stays open: the driver talks to the CLI, the gate to a person."""

    def __init__(
        self,
        process: ProviderProcess,
        driver: DuplexDriver,
        launch: Launch,
        gate: ApprovalGate,
        *,
        cli: str,
        grace_int: float = 5.0,
        grace_term: float = 5.0,
    ) -> None:
        super().__init__(process, _NoParser(), launch, cli=cli, grace_int=grace_int, grace_term=grace_term)
        self._driver = driver
        self._gate = gate
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._write_lock = asyncio.Lock()
        self._linger: asyncio.Task[None] | None = None

    async def interrupt(self) -> None:
        self._interrupted = True
        polite = False
        for output in self._driver.interrupting():
            if isinstance(output, Send):
                await self._write(output.message)
                polite = True
        if polite:
            # The CLI was asked in its own protocol: it ends its turn and exits once its input
            # ends; signals follow only if it has not within the grace.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._process.wait()), POLITE_GRACE_S)
        await super().interrupt()

    async def _write(self, message: Mapping[str, Any]) -> None:
        async with self._write_lock:
            if not await self._process.write_line(message):
                log.debug("cli stdin closed; message dropped", cli=self._cli)

    async def _read(self) -> None:
        try:
            async for line in self._process.lines():
                await self._inbox.put(line)
        finally:
            await self._inbox.put(_EOF)

    async def _end_lingering(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self._stop_given_up()

    async def _ask(self, ask: ApprovalAsk) -> None:
        answer = await self._gate.ask(ask)
        await self._inbox.put((ask.key, answer))

    async def _handle(self, outputs: Sequence[DuplexOutput]) -> AsyncIterator[ProviderEvent]:
        for output in outputs:
            if isinstance(output, Send):
                await self._write(output.message)
            elif isinstance(output, EndInput):
                async with self._write_lock:
                    await self._process.close_stdin()
                if output.linger_s is not None and self._linger is None:
                    self._linger = asyncio.create_task(self._end_lingering(output.linger_s))
            elif isinstance(output, AskPerson):
                key = output.ask.key
                if key not in self._asking:
                    self._asking[key] = asyncio.create_task(self._ask(output.ask))
            else:
                yield output

    async def events(self) -> AsyncIterator[ProviderEvent]:
        if self._events_taken:
            raise RuntimeError("DuplexRun.events() can be consumed only once")
        self._events_taken = True
        limit = None
        if self._launch.timeout_s is not None:
            limit = asyncio.create_task(self._time_limit(self._launch.timeout_s))
        reader = asyncio.create_task(self._read())
        finished = False
        stopper: asyncio.Task[None] | None = None
        try:
            for notice in self._launch.notices:
                yield ItemProduced("notice", notice)
            async for event in self._handle(self._driver.opening()):
                yield event
            while (entry := await self._inbox.get()) is not _EOF:
                if isinstance(entry, tuple):
                    key, answer = entry
                    self._asking.pop(key, None)
                    outputs = self._driver.answered(key, answer)
                elif isinstance(entry, Mapping):
                    outputs = self._driver.feed(entry)
                else:
                    log.debug("provider diagnostic line", cli=self._cli, line=str(entry)[:500])
                    continue
                async for event in self._handle(outputs):
                    yield event
                if (
                    stopper is None
                    and isinstance(self._driver, BoundedRetries)
                    and self._driver.give_up_reason
                ):
                    stopper = asyncio.create_task(self._stop_given_up())
            exit_code = await self._process.wait()
            finished = True
            yield self._outcome(exit_code, self._driver.finish)
        finally:
            self._end([*self._asking.values(), reader, limit, stopper, self._linger], finished=finished)


class _NoParser:
    """CliRun's parser slot, unused by a duplex run (its driver reads every line)."""

    def feed(self, line: Mapping[str, Any]) -> Sequence[SessionStarted | ItemProduced | UsageReported]:
        return []

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        return RunFinished("failed", error="no driver", exit_code=exit_code)


async def start_duplex(launch: Launch, driver: DuplexDriver, gate: ApprovalGate, *, cli: str) -> DuplexRun:
    """Spawn the CLI with stdin kept open; a failure to start removes the scratch dir."""
    try:
        argv, env = sandboxed(launch)
        process = await ProviderProcess.spawn(argv, cwd=launch.cwd, env=env, stdin_data=None, duplex=True)
    except BaseException:
        shutil.rmtree(launch.scratch, ignore_errors=True)
        raise
    log.debug("duplex cli run started", cli=cli, pid=process.pid)
    return DuplexRun(process, driver, launch, gate, cli=cli)
