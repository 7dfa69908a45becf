"""The scripted provider: runs `peerd.providers.script_agent` as a real subprocess.

It goes through the same `ProviderProcess` driver as the real coder CLIs (own process group,
JSON lines on stdout, stderr kept for errors, group interrupt), so the demo and the tests exercise
the real process handling without a model. The wire format is documented in `script_agent`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any, get_args

import structlog

from peerd.core.usage import Usage
from peerd.providers.base import (
    FinishStatus,
    ItemKind,
    ItemProduced,
    ProviderEvent,
    RunFinished,
    RunSpec,
    SessionStarted,
    UsageReported,
)
from peerd.providers.cli import TOOL_ENV_KEYS
from peerd.providers.stream_common import as_count, as_float
from peerd.runtime import sandbox, sandbox_profile
from peerd.runtime.process import ProviderProcess
from peerd.runtime.sandbox import Mount

log = structlog.get_logger(__name__)

ERROR_TAIL_CHARS = 2000
_ITEM_KINDS: frozenset[str] = frozenset(get_args(ItemKind)) - {"user_message"}
_FINISH_STATUSES: frozenset[str] = frozenset(get_args(FinishStatus))


class ScriptRun:
    """One run of a provider CLI that speaks the "script" wire format."""

    def __init__(self, process: ProviderProcess, *, grace_int: float = 2.0, grace_term: float = 3.0) -> None:
        self._process = process
        self._grace_int = grace_int
        self._grace_term = grace_term
        self._interrupted = False
        self._events_taken = False

    @property
    def pgid(self) -> int | None:
        return self._process.pgid

    @property
    def process(self) -> ProviderProcess:
        return self._process

    async def interrupt(self) -> None:
        self._interrupted = True
        await self._process.interrupt(grace_int=self._grace_int, grace_term=self._grace_term)

    async def events(self) -> AsyncIterator[ProviderEvent]:
        if self._events_taken:
            raise RuntimeError("ScriptRun.events() can be consumed only once")
        self._events_taken = True
        result: Mapping[str, Any] | None = None
        finished = False
        try:
            async for line in self._process.lines():
                if isinstance(line, str):
                    log.debug("provider diagnostic line", line=line[:500])
                    continue
                if result is not None:
                    continue  # the result is terminal; anything after it is noise
                kind = line.get("type")
                if kind == "result" and line.get("status") in _FINISH_STATUSES:
                    result = line
                elif (event := _map_event(line)) is not None:
                    yield event
                else:
                    log.debug("ignored provider event", event_type=kind)
            exit_code = await self._process.wait()
            finished = True
            yield self._finish(result, exit_code)
        finally:
            if not finished:
                # The consumer gave up on the run: it must not keep running unobserved.
                self._process.send_signal(signal.SIGKILL)

    def _finish(self, result: Mapping[str, Any] | None, exit_code: int) -> RunFinished:
        if result is not None:
            status = result["status"]
            if status == "failed":
                error = str(result.get("error") or "the scripted coder reported a failure")
                return RunFinished("failed", error=error, exit_code=exit_code)
            # A run that completed before the interrupt took effect did complete.
            return RunFinished(status, exit_code=exit_code)
        if self._interrupted:
            return RunFinished("interrupted", exit_code=exit_code)
        tail = self._process.stderr_tail().strip()[-ERROR_TAIL_CHARS:]
        return RunFinished("failed", error=tail or f"exited with code {exit_code}", exit_code=exit_code)


def _map_event(line: Mapping[str, Any]) -> SessionStarted | ItemProduced | UsageReported | None:
    kind = line.get("type")
    if kind == "usage":
        return UsageReported(
            Usage(
                input_tokens=as_count(line.get("input_tokens")) or 0,
                output_tokens=as_count(line.get("output_tokens")) or 0,
                cached_tokens=as_count(line.get("cached_tokens")) or 0,
                reasoning_tokens=as_count(line.get("reasoning_tokens")) or 0,
                cost_usd=as_float(line.get("cost_usd")),
            )
        )
    if kind == "session" and isinstance(line.get("session_id"), str) and line["session_id"]:
        return SessionStarted(line["session_id"])
    if kind == "item" and line.get("kind") in _ITEM_KINDS:
        data = line.get("data")
        return ItemProduced(
            kind=line["kind"],
            text=str(line.get("text") or ""),
            data=data if isinstance(data, dict) else {},
        )
    return None


class ScriptProvider:
    """The built-in scripted coder (`peerd.providers.script_agent`), run as a subprocess."""

    name = "script"

    def __init__(
        self, *, python: str = sys.executable, grace_int: float = 2.0, grace_term: float = 3.0
    ) -> None:
        self._python = python
        self._grace_int = grace_int
        self._grace_term = grace_term

    async def start(self, spec: RunSpec) -> ScriptRun:
        state_dir = spec.state_dir
        if spec.confinement is not None:
            # Confined, a run may write only its own thread's sessions (and has no network: it
            # needs only the agent socket, a Unix socket file).
            state_dir = spec.state_dir / "threads" / spec.thread_id
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        argv = [self._python, "-m", "peerd.providers.script_agent", "--state-dir", str(state_dir)]
        argv += ["--runtime-mode", spec.runtime_mode, "--interaction-mode", spec.interaction_mode]
        if spec.model:
            argv += ["--model", spec.model]
        if spec.resume_session:
            argv += ["--resume", spec.resume_session]
        env = {key: value for key, value in os.environ.items() if key not in TOOL_ENV_KEYS}
        env.update(spec.tool_env)
        if spec.confinement is not None:
            confinement = spec.confinement.plus(
                Mount(sandbox_profile.real(state_dir), writable=True), share_net=False
            )
            argv, env = sandbox.wrap(confinement, argv, env)
        process = await ProviderProcess.spawn(
            argv, cwd=spec.cwd, env=env, stdin_data=spec.prompt.encode("utf-8")
        )
        log.debug("script run started", run_id=spec.run_id, pid=process.pid)
        return ScriptRun(process, grace_int=self._grace_int, grace_term=self._grace_term)
