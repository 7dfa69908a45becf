"""What every coder CLI provider shares: the per-run scratch dir, the tool binding, the run driver.

A provider (codex, claude, gemini, command) only decides argv, environment and which stream
parser reads the CLI's stdout; `CliRun` does the rest the same way for all of them:

- notices first (an access level the CLI cannot honour exactly, said in the run's items);
- each stdout JSON line through the parser (a pure translator, see `*_events.py`);
- the outcome from the parser's `finish`, which sees the exit code, stderr's tail and whether
  the run was interrupted;
- the scratch dir (run token file, MCP config) removed when the run ends, so a leftover agent
  process cannot act with an ended run's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

from peerd.config import ProviderConfig
from peerd.errors import ProviderPathUnreachable
from peerd.providers import reach
from peerd.runtime import sandbox, sandbox_profile
from peerd.runtime.process import ProviderProcess
from peerd.runtime.provider import (
    ItemProduced,
    ProviderEvent,
    RunFinished,
    RunSpec,
    SessionStarted,
    UsageReported,
)
from peerd.runtime.sandbox import Confinement, Mount

log = structlog.get_logger(__name__)

MCP_SERVER_NAME = "peerd"  # no "_" in it: Gemini's policy parser splits tool names on "_"
MCP_TOOL_TIMEOUT_S = 120
# Run-binding variables the daemon's own environment must never pass on to a CLI (a daemon
# started inside an agent run would otherwise leak that run's identity).
TOOL_ENV_KEYS = (
    "PEERD_SOCKET",
    "PEERD_RUN_TOKEN",
    "PEERD_RUN_TOKEN_FILE",
    "PEERD_THREAD_ID",
    "PEERD_RUN_ID",
    "PEERD_MCP_URL",
)
# The variable Codex reads the run token from for its HTTP bearer header (`bearer_token_env_var`).
TOKEN_ENV = "PEERD_RUN_TOKEN"  # noqa: S105  # a variable name


class StreamParser(Protocol):
    def feed(self, line: Mapping[str, Any]) -> Sequence[SessionStarted | ItemProduced | UsageReported]: ...

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished: ...


@runtime_checkable
class BoundedRetries(Protocol):
    """A parser that can tell the model keeps failing past the run's retry bound (`model_retries`)."""

    @property
    def give_up_reason(self) -> str | None: ...


@runtime_checkable
class TextParser(Protocol):
    """A parser for coders whose stdout is plain text: it sees every line, and its items (the
    reply) are known only when the output ends."""

    def feed_text(self, line: str) -> list[SessionStarted | ItemProduced]: ...

    def final_items(self) -> list[ItemProduced]: ...


@dataclass(frozen=True)
class ToolBinding:
    """How the CLI reaches peerd's tools for this run.

    `url` is the daemon's own MCP endpoint on loopback (`peerd.api.mcp_http`), which the CLI calls
    with `Authorization: Bearer <token>`: the token goes into the CLI's 0600 config file or its
    environment (`TOKEN_ENV`), never into argv. `command`/`args`/`env` start `peerd mcp` (stdio)
    instead, for a CLI that cannot send HTTP, and are given to every CLI's environment so a custom
    coder can start `peerd mcp` itself; its token stays in a 0600 file (`PEERD_RUN_TOKEN_FILE`)."""

    command: str
    args: list[str]
    env: dict[str, str]
    url: str | None = None
    token: str = field(default="", repr=False)

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def scratch_dir(spec: RunSpec) -> Path:
    path = spec.state_dir / "runs" / spec.run_id
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def write_private(path: Path, text: str) -> Path:
    """Create a file only this user can read, with no window where it is wider."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def bind_tools(spec: RunSpec, scratch: Path) -> ToolBinding | None:
    token = spec.tool_env.get("PEERD_RUN_TOKEN")
    socket = spec.tool_env.get("PEERD_SOCKET")
    if not token or not socket:
        return None
    token_file = write_private(scratch / "run-token", token)
    env = {"PEERD_SOCKET": socket, "PEERD_RUN_TOKEN_FILE": str(token_file)}
    url = spec.tool_env.get("PEERD_MCP_URL") or None
    # `python -m peerd.mcp_proxy` is `peerd mcp` without the CLI around it (its start-up is ~40 ms).
    args = ["-m", "peerd.mcp_proxy"]
    return ToolBinding(command=sys.executable, args=args, env=env, url=url, token=token)


def base_env(config: ProviderConfig, spec: RunSpec, binding: ToolBinding | None) -> dict[str, str]:
    """The daemon's environment minus run bindings, plus the provider's configured env.

    The CLI itself gets the binding's variables too (not the raw token): a custom coder can then
    start `peerd mcp` on its own and act as this run."""
    env = {key: value for key, value in os.environ.items() if key not in TOOL_ENV_KEYS}
    env.update(config.env)
    if binding is not None:
        env.update(binding.env)
        env["PEERD_THREAD_ID"] = spec.thread_id
        env["PEERD_RUN_ID"] = spec.run_id
    return env


def resolve_binary(binary: str, env: Mapping[str, str]) -> str | None:
    if os.sep in binary:
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary, path=env.get("PATH"))


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    stdin: bytes | None
    scratch: Path
    notices: list[str] = field(default_factory=list)
    skip_sigint: bool = False  # the CLI ignores SIGINT without a terminal: start at SIGTERM
    timeout_s: float | None = None
    confinement: Confinement | None = None  # run inside peerd's sandbox (see `confine`)
    reach: reach.Reach | None = None  # what the CLI must reach there, checked before it starts


def home_mounts(config: ProviderConfig, env: Mapping[str, str]) -> list[Mount]:
    """A provider whose configured `env` sets HOME may write that whole directory."""
    if "HOME" in config.env and env.get("HOME"):
        return [Mount(sandbox_profile.real(env["HOME"]), writable=True)]
    return []


def confine(
    launch: Launch,
    base: Confinement | None,
    binary: str,
    *extra: Mount,
    notices: tuple[str, ...] = (),
    config: ProviderConfig | None = None,
    name: str = "",
) -> None:
    """Confine a coder CLI's launch: its install dir read-only, `extra` (its state dirs) writable,
    what its config entry names read-only (wherever it lives, /tmp included; see
    `peerd.providers.reach`), and the network shared (it must reach its model's API). Missing state
    dirs are created first. A path peerd hides on purpose is not mapped: `sandboxed` then fails the
    run before the CLI starts, naming it."""
    if base is None:
        return
    provider = name or Path(binary).name
    user_home = sandbox_profile.real(Path.home()) if base.by_link else None
    installed = [Mount(path) for path in sandbox_profile.install_dirs(binary, launch.env)]
    conf = base.plus(*installed, share_net=True)
    for mount in extra:  # a state dir peerd hides on purpose is not made either
        state = reach.need(mount.path, "", writable=True, own=True)
        if not mount.optional and reach.conflict(conf, state, state.target, user_home) is None:
            mount.path.mkdir(parents=True, exist_ok=True, mode=0o700)
    wanted = reach.needs(
        provider=provider, config=config, binary=binary, env=launch.env, state=extra, scratch=launch.scratch
    )
    conf, checked = reach.plan(conf, wanted, user_home)
    launch.confinement = conf
    launch.reach = reach.Reach(provider, checked, user_home)
    launch.notices = [
        *launch.notices,
        *notices,
        "The network is shared with this machine inside peerd's sandbox: the coder must reach its model's API.",
    ]


def sandboxed(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start `launch`: inside its sandbox, once every path the CLI
    needs is known to be reachable there; else `ProviderPathUnreachable` (nothing is started)."""
    if launch.confinement is None:
        return launch.argv, launch.env
    if launch.reach is not None and (why := reach.check(launch.confinement, launch.reach)) is not None:
        raise ProviderPathUnreachable(why)
    return sandbox.wrap(launch.confinement, launch.argv, launch.env)


class CliRun:
    """One run of a coder CLI: events from its stdout, interrupt by process group."""

    def __init__(
        self,
        process: ProviderProcess,
        parser: StreamParser,
        launch: Launch,
        *,
        cli: str,
        grace_int: float = 5.0,
        grace_term: float = 5.0,
    ) -> None:
        self._process = process
        self._parser = parser
        self._launch = launch
        self._cli = cli
        self._grace_int = grace_int
        self._grace_term = grace_term
        self._interrupted = False
        self._timed_out = False
        self._events_taken = False

    @property
    def pgid(self) -> int | None:
        return self._process.pgid

    async def interrupt(self) -> None:
        self._interrupted = True
        await self._process.interrupt(
            grace_int=self._grace_int, grace_term=self._grace_term, skip_sigint=self._launch.skip_sigint
        )

    async def _time_limit(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._timed_out = True
        await self._process.interrupt(
            grace_int=self._grace_int, grace_term=self._grace_term, skip_sigint=self._launch.skip_sigint
        )

    async def _stop_given_up(self) -> None:
        await self._process.interrupt(
            grace_int=self._grace_int, grace_term=self._grace_term, skip_sigint=self._launch.skip_sigint
        )

    async def events(self) -> AsyncIterator[ProviderEvent]:
        if self._events_taken:
            raise RuntimeError("CliRun.events() can be consumed only once")
        self._events_taken = True
        limit = None
        if self._launch.timeout_s is not None:
            limit = asyncio.create_task(self._time_limit(self._launch.timeout_s))
        finished = False
        stopper: asyncio.Task[None] | None = None
        try:
            for notice in self._launch.notices:
                yield ItemProduced("notice", notice)
            async for line in self._process.lines():
                if isinstance(line, str):
                    for event in self._feed_text(line):
                        yield event
                    continue
                for parsed in self._parser.feed(line):
                    yield parsed
                if (
                    stopper is None
                    and isinstance(self._parser, BoundedRetries)
                    and self._parser.give_up_reason
                ):
                    # The parser saw the model fail past its retry bound: stop the CLI now; the
                    # parser's finish() gives the reason.
                    stopper = asyncio.create_task(self._stop_given_up())
            exit_code = await self._process.wait()
            finished = True
            if isinstance(self._parser, TextParser):
                for item in self._parser.final_items():
                    yield item
            yield self._outcome(exit_code, self._parser.finish)
        finally:
            self._end([limit, stopper], finished=finished)

    def _outcome(self, exit_code: int, finish: Callable[..., RunFinished]) -> RunFinished:
        """How the run ended: past its time limit, else as its parser (or driver) reads it."""
        if self._timed_out:
            return RunFinished(
                "failed",
                error=f"{self._cli} ran past its {self._launch.timeout_s:g} s limit and was stopped.",
                exit_code=exit_code,
            )
        return finish(
            exit_code=exit_code, stderr_tail=self._process.stderr_tail(), interrupted=self._interrupted
        )

    def _end(self, tasks: Sequence[asyncio.Task[None] | None], *, finished: bool) -> None:
        """The run's helpers stopped, the process gone, the scratch dir (its token) removed."""
        for task in tasks:
            if task is not None:
                task.cancel()
        if not finished:
            # The consumer gave up on the run: it must not keep running unobserved.
            self._process.send_signal(signal.SIGKILL)
        with contextlib.suppress(OSError):
            shutil.rmtree(self._launch.scratch)

    def _feed_text(self, line: str) -> list[SessionStarted | ItemProduced]:
        if isinstance(self._parser, TextParser):
            return self._parser.feed_text(line)
        log.debug("provider diagnostic line", cli=self._cli, line=line[:500])
        return []


async def start_cli(launch: Launch, parser: StreamParser, *, cli: str) -> CliRun:
    """Spawn the CLI in its own process group; a failure to start removes the scratch dir."""
    try:
        argv, env = sandboxed(launch)
        process = await ProviderProcess.spawn(argv, cwd=launch.cwd, env=env, stdin_data=launch.stdin)
    except BaseException:
        shutil.rmtree(launch.scratch, ignore_errors=True)
        raise
    log.debug("cli run started", cli=cli, pid=process.pid)
    return CliRun(process, parser, launch, cli=cli)
