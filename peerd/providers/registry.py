"""Which providers a daemon has: the built-in script coder, the three coder CLIs, and the custom
commands of the config file; and what `peerd provider list` says about each."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping

from peerd import contracts as c
from peerd.config import BUILTIN_KINDS, Config, ProviderConfig
from peerd.providers.cli import TOOL_ENV_KEYS, resolve_binary
from peerd.providers.coders import CoderProvider
from peerd.providers.command import Approved, CommandProvider
from peerd.providers.script import ScriptProvider
from peerd.runtime.provider import Provider

VERSION_TIMEOUT_S = 15.0


def build(config: Config, approved: Approved) -> dict[str, Provider]:
    providers: dict[str, Provider] = {"script": ScriptProvider()}
    for kind in BUILTIN_KINDS:
        providers[kind] = CoderProvider(kind, kind, config.providers.get(kind, ProviderConfig()))
    for name, entry in config.providers.items():
        kind = config.provider_kind(name)
        if kind == "command":
            providers[name] = CommandProvider(name, entry, approved)
        else:
            providers[name] = CoderProvider(name, kind, entry)
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


async def describe(name: str, provider: Provider, approved: Approved) -> c.ProviderInfo:
    if isinstance(provider, ScriptProvider):
        return c.ProviderInfo(
            name=name, kind="script", binary=None, path=None, found=True, version="built in", model=None
        )
    if isinstance(provider, CoderProvider):
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
    if isinstance(provider, CommandProvider):
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


def available(providers: Mapping[str, Provider]) -> dict[str, bool]:
    """Which providers can run here now: the built-in one always, the others when their binary is
    found (cheap: no `--version` run)."""
    found: dict[str, bool] = {}
    for name, provider in providers.items():
        if isinstance(provider, CoderProvider):
            found[name] = resolve_binary(provider.binary, _env(provider.config)) is not None
        elif isinstance(provider, CommandProvider):
            found[name] = (
                bool(provider.binary) and resolve_binary(provider.binary, _env(provider.config)) is not None
            )
        else:
            found[name] = True
    return found
