"""The scripted provider: runs `peerd.providers.script_agent` as a real subprocess.

It goes through the same `ProviderProcess` driver as the real coder CLIs (own process group,
JSON lines on stdout, stderr kept for errors, group interrupt), so the demo and the tests exercise
the real process handling without a model. The wire format is documented in `script_agent`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, get_args

import structlog

import peerd
from peerd.core.usage import Usage
from peerd.providers.asking import asks_person
from peerd.providers.cli import TOOL_ENV_KEYS, Launch
from peerd.providers.duplex import AskPerson, DuplexOutput, DuplexRun, EndInput, Send
from peerd.providers.stream_common import as_count, as_float
from peerd.runtime import sandbox, sandbox_profile
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk, AskKind
from peerd.runtime.process import ProviderProcess
from peerd.runtime.provider import (
    FinishStatus,
    ItemKind,
    ItemProduced,
    ProviderEvent,
    ProviderRun,
    RunFinished,
    RunSpec,
    SessionStarted,
    UsageReported,
)
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
        return _finish(
            result, exit_code, interrupted=self._interrupted, stderr_tail=self._process.stderr_tail()
        )


def _finish(
    result: Mapping[str, Any] | None, exit_code: int, *, interrupted: bool, stderr_tail: str
) -> RunFinished:
    if result is not None:
        status = result["status"]
        if status == "failed":
            error = str(result.get("error") or "the scripted coder reported a failure")
            return RunFinished("failed", error=error, exit_code=exit_code)
        # A run that completed before the interrupt took effect did complete.
        return RunFinished(status, exit_code=exit_code)
    if interrupted:
        return RunFinished("interrupted", exit_code=exit_code)
    tail = stderr_tail.strip()[-ERROR_TAIL_CHARS:]
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
                # The script's usage is text the prompt's author wrote, not a model's count.
                claimed=True,
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


class ScriptDriver:
    """The scripted coder's asking mode (`--ask`) as a pure duplex driver: the prompt as the first
    line, each `ask` line to the gate, each answer back as a line."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.result: Mapping[str, Any] | None = None
        self.interrupted = False

    def opening(self) -> list[DuplexOutput]:
        return [Send({"type": "prompt", "text": self.prompt})]

    def feed(self, line: Mapping[str, Any]) -> list[DuplexOutput]:
        if self.result is not None:
            return []
        kind = line.get("type")
        if kind == "result" and line.get("status") in _FINISH_STATUSES:
            self.result = line
            return [EndInput()]
        if kind == "ask" and isinstance(line.get("key"), str):
            detail = line.get("detail")
            ask_kind: AskKind = "command" if line.get("kind") == "command" else "tool"
            if line.get("kind") == "file_change":
                ask_kind = "file_change"
            return [
                AskPerson(
                    ApprovalAsk(
                        key=line["key"],
                        kind=ask_kind,
                        tool=str(line.get("tool") or "step"),
                        summary=str(line.get("summary") or line.get("tool") or "a step"),
                        detail=detail if isinstance(detail, dict) else {},
                    )
                )
            ]
        event = _map_event(line)
        return [] if event is None else [event]

    def answered(self, key: str, answer: ApprovalAnswer) -> list[DuplexOutput]:
        return [Send({"type": "answer", "key": key, "allow": answer.allow, "message": answer.message})]

    def interrupting(self) -> list[DuplexOutput]:
        self.interrupted = True
        return []

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        return _finish(self.result, exit_code, interrupted=interrupted, stderr_tail=stderr_tail)


SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # what script_agent.load_session takes


def adopt_session(root: Path, state_dir: Path, thread_id: str, session_id: str) -> Path | None:
    """Move a thread's session to where this run reads it, if an earlier run left it elsewhere;
    the path it is at now (None: nowhere). Done before each resume, so it is lazy and idempotent.

    Where sessions are: the previous release (ee09e6e, tests/compat/PREVIOUS_RELEASE) kept every
    one at `<root>/<session>.json`; this one keeps a confined run's at
    `<root>/threads/<thread>/<session>.json` (the only directory the run may write) and an
    unconfined run's at `<root>/<session>.json`. A thread's session follows it between the two."""
    if not SESSION_ID.fullmatch(session_id) or not SESSION_ID.fullmatch(thread_id):
        return None  # not one plain path segment: script_agent refuses it anyway
    name = f"{session_id}.json"
    target = state_dir / name
    if target.exists():
        return target
    for old in (root / name, root / "threads" / thread_id / name):
        if old == target or not old.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            old.replace(target)  # one copy: the session moves with the thread
        except FileNotFoundError:  # another run of the thread moved it first
            continue
        log.info("script.session_moved", thread_id=thread_id, session=session_id, to=str(target))
        return target
    return target if target.exists() else None


# The agent is started as `python -I -S` with peerd's own directory on its path: it needs the
# standard library and peerd.errors only, and site's .pth files and an editable install's finder
# were 45 ms of every scripted run's start here. (-I: no PYTHON* variables, no user site.)
_AGENT_MAIN = (
    f"import sys; sys.path.insert(0, {str(Path(peerd.__file__).resolve().parent.parent)!r}); "
    "from peerd.providers.script_agent import run; run()"
)


class ScriptProvider:
    """The built-in scripted coder (`peerd.providers.script_agent`), run as a subprocess."""

    name = "script"

    def __init__(
        self, *, python: str = sys.executable, grace_int: float = 2.0, grace_term: float = 3.0
    ) -> None:
        self._python = python
        self._grace_int = grace_int
        self._grace_term = grace_term

    async def start(self, spec: RunSpec) -> ProviderRun:
        state_dir = spec.state_dir
        if spec.confinement is not None:
            # Confined, a run may write only its own thread's sessions (and has no network: it
            # needs only the agent socket, a Unix socket file).
            state_dir = spec.state_dir / "threads" / spec.thread_id
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if spec.resume_session:
            adopt_session(spec.state_dir, state_dir, spec.thread_id, spec.resume_session)
        argv = [self._python, "-I", "-S", "-c", _AGENT_MAIN, "--state-dir", str(state_dir)]
        argv += ["--runtime-mode", spec.runtime_mode, "--interaction-mode", spec.interaction_mode]
        if spec.model:
            argv += ["--model", spec.model]
        if spec.resume_session:
            argv += ["--resume", spec.resume_session]
        asking = asks_person(spec) and spec.approvals is not None
        if asking:
            argv.append("--ask")
        env = {key: value for key, value in os.environ.items() if key not in TOOL_ENV_KEYS}
        env.update(spec.tool_env)
        if spec.confinement is not None:
            base = spec.confinement
            if asking:  # each write and command passes a person first
                base = dataclasses.replace(base, worktree_writable=True)
            confinement = base.plus(Mount(sandbox_profile.real(state_dir), writable=True), share_net=False)
            argv, env = sandbox.wrap(confinement, argv, env)
        if asking and spec.approvals is not None:
            scratch = spec.state_dir / "runs" / spec.run_id
            scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
            launch = Launch(argv, env, spec.cwd, None, scratch)
            process = await ProviderProcess.spawn(argv, cwd=spec.cwd, env=env, stdin_data=None, duplex=True)
            log.debug("script run started (asking)", run_id=spec.run_id, pid=process.pid)
            return DuplexRun(
                process,
                ScriptDriver(spec.prompt),
                launch,
                spec.approvals,
                cli="script",
                grace_int=self._grace_int,
                grace_term=self._grace_term,
            )
        process = await ProviderProcess.spawn(
            argv, cwd=spec.cwd, env=env, stdin_data=spec.prompt.encode("utf-8")
        )
        log.debug("script run started", run_id=spec.run_id, pid=process.pid)
        return ScriptRun(process, grace_int=self._grace_int, grace_term=self._grace_term)
