"""Shared CLI plumbing: the home, the client, and the exit codes.

Exit codes: 0 ok, 1 an error the daemon reported (printed as `code: message`), 2 usage,
3 the daemon is not running, 4 a wait timed out.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from peerd.cli.client import DaemonNotRunning, LocalClient
from peerd.errors import PeerdError
from peerd.paths import Paths, resolve_home

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_TIMED_OUT = 4

T = TypeVar("T")


@dataclass(frozen=True)
class CliContext:
    home: Path

    @property
    def paths(self) -> Paths:
        return Paths(self.home)


def cli_context(ctx: click.Context) -> CliContext:
    obj = ctx.find_object(CliContext)
    if obj is None:
        obj = CliContext(resolve_home(None))
    return obj


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def with_client(ctx: click.Context, fn: Callable[[LocalClient], Awaitable[T]]) -> T:
    """Run `fn` against the local daemon, turning failures into exit codes and one-line errors."""

    async def go() -> T:
        env = ctx.meta.get(ENV_META)
        async with LocalClient(cli_context(ctx).paths.socket, environment_id=env) as client:
            return await fn(client)

    try:
        return asyncio.run(go())
    except DaemonNotRunning as exc:
        fail(str(exc), EXIT_NOT_RUNNING)
    except PeerdError as exc:
        fail(f"{exc.code}: {exc.message}", EXIT_ERROR)
    except KeyboardInterrupt:
        fail("interrupted", 130)


ENV_META = "peerd.environment_id"


def _remember_env(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[ENV_META] = value


def env_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--env ID|LABEL`: run the command in a linked environment, through its link."""
    return click.option(
        "--env",
        "environment",
        metavar="ENV",
        default=None,
        expose_value=False,
        callback=_remember_env,
        help="Act in this linked environment (id or label) instead of here.",
    )(fn)


def yes_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--yes", "-y", "yes", is_flag=True, help="Do it without asking first.")(fn)


def on_terminal() -> bool:
    return sys.stdin.isatty()


def confirm(yes: bool, question: str) -> None:
    """Before a step that deletes or ends something: ask on a terminal (`--yes` does not ask);
    a script (no terminal on stdin) is not asked."""
    if yes or not on_terminal():
        return
    if not click.confirm(question, default=False):
        fail("cancelled; nothing was changed.", EXIT_ERROR)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for programs.")(fn)
