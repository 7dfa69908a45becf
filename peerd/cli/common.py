"""Shared CLI plumbing: the home, the client, and the exit codes.

Exit codes: 0 ok; a failure exits with its error class's `exit_code` (peerd/errors.py, declared
once per class, 1 unless it says else): 1 an error the daemon reported (printed as `code: message`),
2 usage (`UsageError`, `ConfigInvalid`, `StoreRefused`, `HomeNewer`; click's own usage errors too),
3 the daemon is not running (`DaemonNotRunning`), 4 a wait timed out (`TimedOut`); 130 Ctrl-C.
A wait for a run (`thread launch --wait`, `thread wait`) exits 0 only for `completed`: 5 failed,
6 interrupted or cancelled, 7 still live because a question waits for a person, 4 still live.
The table of codes with their exit codes is in docs/reference/api.md.

Nothing here (nor in any `peerd.cli` module at import) may import asyncio, aiohttp, pydantic,
cryptography, aiosqlite, mcp or structlog: `peerd status` must start at once
(tests/integration/test_cli_startup.py). Import those inside the function that needs them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import click

from peerd.cli import output
from peerd.cli.client import LocalClient
from peerd.clientwire import DaemonConnectionError
from peerd.errors import DaemonNotRunning, PeerdError, TimedOut, UsageError, exit_code_of
from peerd.paths import Paths, resolve_home

# Each from the class that declares it (tests and `ctx.exit` name them).
EXIT_OK = 0
EXIT_ERROR = PeerdError.exit_code
EXIT_USAGE = UsageError.exit_code
EXIT_NOT_RUNNING = DaemonNotRunning.exit_code
EXIT_TIMED_OUT = TimedOut.exit_code
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention: not an error of peerd's
# How a waited-for run ended (`thread launch --wait`, `thread wait`), as `gh run watch
# --exit-status` and `kubectl wait` let a script tell: 0 only for `completed`.
EXIT_RUN_FAILED = 5
EXIT_RUN_STOPPED = 6  # interrupted or cancelled
EXIT_AWAITING_APPROVAL = 7  # still live at the timeout because a question waits for a person
RUN_EXIT_CODES = {
    "completed": EXIT_OK,
    "failed": EXIT_RUN_FAILED,
    "interrupted": EXIT_RUN_STOPPED,
    "cancelled": EXIT_RUN_STOPPED,
}


def exit_code_of_end(status: str) -> int:
    """The exit code of a run's, task's, move's or orchestration's final status (0 only when
    completed; `moved` is a move's completion)."""
    return EXIT_OK if status == "moved" else RUN_EXIT_CODES.get(status, EXIT_ERROR)


def exit_code_of_wait(wait: dict[str, Any]) -> int:
    """The exit code for a wait's answer: how the run ended, or why it is still live."""
    if wait.get("terminal"):
        return RUN_EXIT_CODES.get(str(wait.get("status")), EXIT_ERROR)
    return EXIT_AWAITING_APPROVAL if wait.get("awaitingApproval") else EXIT_TIMED_OUT


def waiting_field(waiting: dict[str, Any] | None) -> str | None:
    """The `waiting for` field of `thread show` and `task show`: the line without its first words."""
    return None if not waiting else approval_line(waiting).removeprefix("waiting for ")


def approval_line(waiting: dict[str, Any]) -> str:
    """`waiting for your approval [on BOX]: <question> (peerd approval show ap_...)`: the box's
    questions are shown and answered from here too (they come through the link)."""
    where = f" on {waiting['environmentId']}" if waiting.get("environmentId") else ""
    return f"waiting for your approval{where}: {waiting['summary']} (peerd approval show {waiting['approvalId']})"


PAGE = 100  # the daemon's page size (contracts.PAGE_LIMIT; pydantic is not imported here)

T = TypeVar("T")

HomeSource = Literal["flag", "env", "default"]


@dataclass(frozen=True)
class CliContext:
    home: Path
    # How the user named the home: `--home`, PEERD_HOME, or neither (the XDG default). Hints
    # that tell them a command to run repeat it the same way.
    given_by: HomeSource = "default"

    @property
    def paths(self) -> Paths:
        return Paths(self.home)

    def command(self, rest: str) -> str:
        """`peerd REST` as this user must type it to reach this home."""
        import shlex  # noqa: PLC0415  # only for a hint

        home = shlex.quote(str(self.home))
        if self.given_by == "flag":
            return f"peerd --home {home} {rest}"
        if self.given_by == "env":
            return f"PEERD_HOME={home} peerd {rest}"
        return f"peerd {rest}"

    def not_running(self, socket_path: Path) -> str:
        return (
            f"peerd is not running (no daemon answers at {socket_path}). "
            f"Start it with `{self.command('serve')}`."
        )


def context_for(home: Path | None, *, from_flag: bool) -> CliContext:
    """The home the user named: `home` from `--home` (`from_flag`), or from PEERD_HOME, or the
    default (`home` None)."""
    if home is not None:
        return CliContext(resolve_home(home), "flag" if from_flag else "env")
    return CliContext(resolve_home(None), "env" if os.environ.get("PEERD_HOME") else "default")


def cli_context(ctx: click.Context) -> CliContext:
    obj = ctx.find_object(CliContext)
    if obj is None:
        obj = context_for(None, from_flag=False)
    return obj


HOME_HELP = "Data directory (default: $PEERD_HOME, else $XDG_DATA_HOME/peerd)."


def _home_after_subcommand(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.obj = context_for(value, from_flag=True)  # this context and those below it see this home


def home_option() -> click.Option:
    """`--home DIR` on a subcommand (`peerd thread list --home X`): as `peerd --home X thread list`."""
    return click.Option(
        ["--home"],
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_home_after_subcommand,
        help="Data directory, as `peerd --home` (given here, it wins).",
    )


def accept_home_everywhere(command: click.Command) -> click.Command:
    """Give `command` and every command under it the subcommand `--home` option (once)."""
    if not any(p.name == "home" for p in command.params):
        command.params.append(home_option())
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            accept_home_everywhere(sub)
    return command


def fail(problem: PeerdError | str, *, bare: bool = False) -> NoReturn:
    """Print `error: code: message` (`bare`, or a `UsageError`: the message alone; a string: as
    is) and exit with the error's exit code (a string: 1)."""
    if isinstance(problem, str):
        text = problem
    elif bare or isinstance(problem, UsageError):
        text = problem.message
    else:
        text = f"{problem.code}: {problem.message}"
    click.echo(f"error: {text}", err=True)
    sys.exit(exit_code_of(problem) if isinstance(problem, PeerdError) else EXIT_ERROR)


def interrupted() -> NoReturn:
    click.echo("error: interrupted", err=True)
    sys.exit(EXIT_INTERRUPTED)


def with_client(ctx: click.Context, fn: Callable[[LocalClient], T]) -> T:
    """Run `fn` against the local daemon, turning failures into exit codes and one-line errors."""
    home = cli_context(ctx)
    client = LocalClient(home.paths.socket, environment_id=ctx.meta.get(ENV_META))
    try:
        return fn(client)
    except DaemonNotRunning as exc:
        socket_path = home.paths.socket if exc.socket_path is None else Path(exc.socket_path)
        fail(DaemonNotRunning(home.not_running(socket_path), socket_path=socket_path), bare=True)
    except DaemonConnectionError as exc:
        fail(str(exc))
    except PeerdError as exc:
        fail(exc)
    except KeyboardInterrupt:
        interrupted()


COMPLETE_TIMEOUT_S = 1.0  # a <TAB> that asks the daemon gives up this soon (no daemon: no ids)


def complete_from(
    path: str, *, params: dict[str, Any] | None = None, field: str = "id", about: str = "title"
) -> Any:
    """A `shell_complete` for an argument or option naming something the daemon lists at `path`:
    the ids (`field`) that start with what is typed, newest first, each with a word about it.
    Quietly none when the daemon is not running or slow: completion never prints an error."""

    def complete(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem  # noqa: PLC0415  # only when completing

        try:
            home = ctx.find_object(CliContext)  # `--home` after the subcommand (its callback ran)
            given = ctx.find_root().params.get("home")  # `peerd --home X`: parsed, its command not run
            if home is None and given is not None:
                home = context_for(given, from_flag=True)
            client = LocalClient(
                (home or cli_context(ctx)).paths.socket,
                connect_timeout=COMPLETE_TIMEOUT_S,
                read_timeout=COMPLETE_TIMEOUT_S,
            )
            items = client.call("GET", path, params={"limit": 100, **(params or {})})["items"]
        except Exception:  # a <TAB> must never fail loudly
            return []
        return [
            CompletionItem(str(x[field]), help=str(x.get(about) or "")[:60] or None)
            for x in items
            if str(x.get(field, "")).startswith(incomplete)
        ]

    return complete


complete_thread = complete_from("/v1/threads", params={"order": "newest"})
complete_task = complete_from("/v1/tasks")
complete_approval = complete_from("/v1/approvals", about="summary")
complete_env = complete_from("/v1/environments", field="label", about="environmentId")


ENV_META = "peerd.environment_id"
ALL_ENVS = "all"  # `--env all`: here and every linked environment (the lists that take it)


def fleet_of(client: LocalClient) -> list[tuple[str | None, str]]:
    """Here (None) and each linked environment that is not revoked or expired, with its label."""
    linked = client.call("GET", "/v1/environments")["items"]
    return [(None, "here")] + [
        (env["environmentId"], env["label"])
        for env in linked
        if env.get("status") not in ("revoked", "expired")
    ]


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
        shell_complete=complete_env,
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
        fail("cancelled; nothing was changed.")


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--json [FIELDS]`: `as_json` is an `output.JsonOutput` (every field, or those named) or None."""
    return output.json_option(fn)


json_option_for = output.json_option_for  # the same, checked against a route's answer before sending
