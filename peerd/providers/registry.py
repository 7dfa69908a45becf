"""Which providers a daemon has: the built-in script coder, the three coder CLIs, and the custom
commands of the config file; and what `peerd provider list` says about each.

Each is a `LazyProvider`: what it is (name, kind, binary, command) is known from the config file,
and its driver (`script.py`, `coders.py` with the three CLIs' event parsers and protocols,
`command.py`) loads, in a thread, when a run of it starts (issue 33: an idle daemon does not pay
for them). `describe` and `available`, hence `peerd provider list`, the capacity report and
orchestration's coder choice, need no driver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType

from peerd import contracts as c
from peerd.config import BUILTIN_KINDS, Config, ProviderConfig
from peerd.errors import ProviderError
from peerd.providers.cli import TOOL_ENV_KEYS, resolve_binary
from peerd.runtime.background import import_in_thread
from peerd.runtime.provider import Provider, ProviderRun, RunSpec

VERSION_TIMEOUT_S = 15.0
LOAD_TIMEOUT_S = 60.0  # a run's start waits this long for its driver's first import (well under a second)
Approved = Callable[[str, str], Awaitable[bool]]
# Each kind's driver module: imported when the first run of that kind starts.
DRIVERS = {
    "script": "peerd.providers.script",
    "codex": "peerd.providers.coders",
    "claude": "peerd.providers.coders",
    "gemini": "peerd.providers.coders",
    "command": "peerd.providers.command",
}


class LazyProvider:
    """A configured provider; its driver is built on first need (`driver`)."""

    def __init__(self, name: str, kind: str, config: ProviderConfig | None, approved: Approved) -> None:
        self.name = name
        self.kind = kind
        self.config = config or ProviderConfig()
        self._approved = approved
        self.command: str | None = None
        if kind == "command":
            if not self.config.command:
                raise ValueError("a command provider needs a command")
            self.command = self.config.command
            self.binary = shlex.split(self.command)[0] if self.command.strip() else ""
        else:
            self.binary = "" if kind == "script" else (self.config.binary or kind)
        self._driver: Provider | None = None
        self._loading: asyncio.Future[ModuleType] | None = None

    @property
    def loaded(self) -> bool:
        return self._driver is not None

    async def start(self, spec: RunSpec) -> ProviderRun:
        return await (await self.driver()).start(spec)

    async def driver(self) -> Provider:
        """The real provider, its module imported first (in a thread, unless it is already)."""
        if self._driver is not None:
            return self._driver
        module = sys.modules.get(DRIVERS[self.kind])
        if module is None:
            if self._loading is None:
                self._loading = import_in_thread(DRIVERS[self.kind])
            try:
                module = await asyncio.wait_for(asyncio.shield(self._loading), LOAD_TIMEOUT_S)
            except TimeoutError:
                raise ProviderError(
                    f"Provider {self.name!r}: its driver is still loading; send the message again."
                ) from None
        if self._driver is None:
            self._driver = self._make(module)
        return self._driver

    def _make(self, module: ModuleType) -> Provider:
        if self.kind == "script":
            driver: Provider = module.ScriptProvider()
        elif self.kind == "command":
            driver = module.CommandProvider(self.name, self.config, self._approved)
        else:
            driver = module.CoderProvider(self.name, self.kind, self.config)
        return driver


def build(config: Config, approved: Approved) -> dict[str, LazyProvider]:
    providers = {"script": LazyProvider("script", "script", None, approved)}
    for kind in BUILTIN_KINDS:
        providers[kind] = LazyProvider(kind, kind, config.providers.get(kind, ProviderConfig()), approved)
    for name, entry in config.providers.items():
        providers[name] = LazyProvider(name, config.provider_kind(name), entry, approved)
    return providers


def _env(config: ProviderConfig) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in TOOL_ENV_KEYS}
    env.update(config.env)
    return env


async def version_of(path: str, env: Mapping[str, str]) -> str | None:
    """The first line `<binary> --version` prints, or None when it does not answer in time."""
    try:
        proc = await asyncio.create_subprocess_exec(
            path,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), VERSION_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        return None
    lines = [line.strip() for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[0][:200] if lines else None


async def describe(name: str, provider: LazyProvider, approved: Approved) -> c.ProviderInfo:
    if provider.kind == "script":
        return c.ProviderInfo(
            name=name, kind="script", binary=None, path=None, found=True, version="built in", model=None
        )
    if provider.kind in BUILTIN_KINDS:
        env = _env(provider.config)
        path = resolve_binary(provider.binary, env)
        return c.ProviderInfo(
            name=name,
            kind=provider.kind,
            binary=provider.binary,
            path=path,
            found=path is not None,
            version=await version_of(path, env) if path else None,
            model=provider.config.model,
            problem=None if path else f"{provider.binary!r} not found on PATH (set providers.{name}.binary)",
        )
    if provider.command is not None:
        env = _env(provider.config)
        path = resolve_binary(provider.binary, env) if provider.binary else None
        is_approved = await approved(name, provider.command)
        problem = None
        if path is None:
            problem = f"{provider.binary!r} not found on PATH"
        elif not is_approved:
            problem = f"not approved: `peerd provider approve {name}`"
        return c.ProviderInfo(
            name=name,
            kind="command",
            binary=provider.binary,
            path=path,
            found=path is not None,
            version=None,
            model=provider.config.model,
            command=provider.command,
            approved=is_approved,
            problem=problem,
        )
    return c.ProviderInfo(
        name=name, kind="command", binary=None, path=None, found=False, version=None, model=None
    )


def available(providers: Mapping[str, LazyProvider]) -> dict[str, bool]:
    """Which providers can run here now: the built-in one always, the others when their binary is
    found (cheap: no `--version` run)."""
    found: dict[str, bool] = {}
    for name, provider in providers.items():
        if provider.kind in BUILTIN_KINDS:
            found[name] = resolve_binary(provider.binary, _env(provider.config)) is not None
        elif provider.command is not None:
            found[name] = (
                bool(provider.binary) and resolve_binary(provider.binary, _env(provider.config)) is not None
            )
        else:
            found[name] = True
    return found
