"""`peerd`: the command line. Each command talks to the daemon over its local socket.

Start-up is part of the interface (issue 13: `peerd --help`, `status`, `thread list`, ... within
120 ms, kept by bench/cli_start.py): the command modules load lazily, only the one a command line
names (`LazyGroup`; `peerd --help` prints the summaries kept in `COMMANDS` and loads none), and no
`peerd.cli` module imports asyncio, aiohttp, pydantic, cryptography, aiosqlite, mcp or structlog at
load (tests/integration/test_cli_startup.py). `serve`, `mcp` and `doctor` import them when they run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from peerd import __version__
from peerd.cli.client import LocalClient
from peerd.cli.common import (
    HOME_HELP,
    accept_home_everywhere,
    cli_context,
    context_for,
    fail,
    json_option,
    with_client,
)
from peerd.cli.output import emit_json, fields
from peerd.errors import ConfigInvalid, DaemonNotRunning, HomeNewer, PeerdError, StoreRefused


@dataclass(frozen=True)
class Lazy:
    """A command loaded when it is used: `module:attribute`, and the one line `peerd --help` shows
    for it (the command's own short help; tests/integration/test_cli_startup.py keeps them equal)."""

    target: str
    summary: str


COMMANDS: dict[str, Lazy] = {
    "approval": Lazy(
        "peerd.cli.approvals:approval",
        "Approvals: actions of runs at approval-required that wait for a person's yes or no.",
    ),
    "backup": Lazy(
        "peerd.cli.store:backup",
        "Write a consistent copy of this environment's store to FILE (a new file, mode 0600).",
    ),
    "client": Lazy("peerd.cli.links:client", "Clients: machines linked to this one."),
    "completion": Lazy(
        "peerd.cli.completion:completion",
        "Print the completion script for SHELL (bash, zsh or fish); the user guide says where it goes.",
    ),
    "config": Lazy("peerd.cli.providers:config", "The daemon's configuration."),
    "console": Lazy(
        "peerd.cli.console:console", "Print the URL of the browser console with a one-time login token."
    ),
    "doctor": Lazy("peerd.cli.doctor:doctor", "Check this machine's peerd and print a fix for each problem."),
    "environment": Lazy(
        "peerd.cli.links:environment", "Linked environments (the machines this one may act on)."
    ),
    "fleet": Lazy(
        "peerd.cli.fleet:fleet",
        "Every environment with its status, runs, load, memory, providers, projects and preference.",
    ),
    "link": Lazy(
        "peerd.cli.links:link",
        "Link to another machine with the pairing code it printed (`-` reads the code from stdin).",
    ),
    "orchestrate": Lazy(
        "peerd.cli.orchestrate:orchestrate",
        "Plan, implement, verify, review and integrate a change with several coders and machines.",
    ),
    "pair": Lazy(
        "peerd.cli.links:pair",
        "Print a one-time pairing code for another machine to link here (`peerd link -` there, then "
        "paste it: a code on a command line stays in the shell's history).",
    ),
    "project": Lazy("peerd.cli.projects:project", "Projects: git checkouts agents work in."),
    "provider": Lazy(
        "peerd.cli.providers:provider",
        "Coder providers: script, codex, claude, gemini, and custom commands from the config file.",
    ),
    "restore": Lazy(
        "peerd.cli.store:restore",
        "Replace this environment's store with the backup FILE; the daemon must be stopped.",
    ),
    "task": Lazy("peerd.cli.tasks:task", "Delegated tasks (agents create them with the delegate_task tool)."),
    "thread": Lazy("peerd.cli.threads:thread", "Threads: agent conversations, each in its own git worktree."),
    "wait": Lazy(
        "peerd.cli.waits:wait", "Waits on pull requests (agents record them with the wait_for_github tool)."
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (click's "Lazily Loading Subcommands").

    Every command it hands out, loaded or defined here, takes `--home` after the subcommand too
    (`common.accept_home_everywhere`)."""

    def __init__(self, *args: Any, lazy: Mapping[str, Lazy], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.lazy:
            module, _, attribute = self.lazy[cmd_name].target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self.lazy[cmd_name].target} is not a click command")
            self.add_command(command, cmd_name)
        return None if command is None else accept_home_everywhere(command)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, but a command not loaded yet is described by its summary, not imported."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows: list[tuple[str, str]] = []
        for name in names:
            loaded = self.commands.get(name)
            if loaded is not None:
                if not loaded.hidden:
                    rows.append((name, loaded.get_short_help_str(limit)))
            else:
                # The short help click would make from the command's own help (same rules).
                stand_in = click.Command(name, help=self.lazy[name].summary)
                rows.append((name, stand_in.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="PEERD_HOME",
    help=HOME_HELP,
)
@click.version_option(__version__, prog_name="peerd")
@click.pass_context
def cli(ctx: click.Context, home: Path | None) -> None:
    """peerd links the machines your coding agents run on."""
    from_flag = ctx.get_parameter_source("home") is click.core.ParameterSource.COMMANDLINE
    ctx.obj = context_for(home, from_flag=from_flag)


@cli.command()
@click.option("--label", default=None, help="A name people know this machine by (default: the host name).")
@click.option(
    "--listen",
    default=None,
    help="HOST:PORT of the network listener (TLS; default 127.0.0.1:7433). --no-listen: only the local socket.",
)
@click.option("--no-listen", is_flag=True, help="Serve only the local Unix socket.")
@click.option("--no-tls", is_flag=True, help="Plain HTTP on the listener; allowed on loopback only.")
@click.option(
    "--advertise",
    multiple=True,
    help="Address pairing codes give out (repeatable), e.g. https://box.tailnet.ts.net:7433.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PEERD_CONFIG",
    help="Config file (default: <home>/config.toml for a --home or PEERD_HOME, else "
    "$XDG_CONFIG_HOME/peerd/config.toml). Flags win over it.",
)
@click.option(
    "--new-store",
    is_flag=True,
    help="Start with a new, empty store although this environment's identity exists (its store is "
    "missing). Never replaces an existing file.",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    show_default=True,
    help="auto: readable on a terminal, JSON lines otherwise (a file, a pipe, journald).",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@click.pass_context
def serve(
    ctx: click.Context,
    label: str | None,
    listen: str | None,
    no_listen: bool,
    no_tls: bool,
    advertise: tuple[str, ...],
    config_path: Path | None,
    new_store: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    # Only `serve` needs the server stack, and only after the owner socket answers `status`
    # (peerd/boot.py): until then the standard library only. The config file is validated and
    # logging set up by `settle`, in the thread that imports the daemon.
    import asyncio  # noqa: PLC0415  # serve only: CLI start-up
    import socket  # noqa: PLC0415  # serve only (the client needs only _socket)

    from peerd import boot  # noqa: PLC0415  # serve only: CLI start-up

    try:
        home = cli_context(ctx)
    except PeerdError as exc:
        fail(exc)
    named = None if home.given_by == "default" else home.home  # its own config.toml

    def settle() -> boot.DaemonConfig:
        import logging  # noqa: PLC0415  # boot's early start: after `status` answers

        from peerd import config as settings_file  # noqa: PLC0415  # pydantic: boot's early start
        from peerd.logs import configure_logging  # noqa: PLC0415  # structlog: boot's early start

        configure_logging(json=log_as_json(log_format), level=getattr(logging, log_level.upper()))
        try:
            settings = settings_file.load(config_path, required=config_path is not None, home=named)
            tls = settings.tls and not no_tls
            from_file = boot.DEFAULT_LISTEN if settings.listen is None else (settings.listen or None)
            effective_listen = None if no_listen else (listen or from_file)
            if effective_listen:
                boot.parse_listen(effective_listen, tls=tls)
        except PeerdError as exc:  # a wrong file or flag: what is wrong, and where
            raise ConfigInvalid(f"{exc.code}: {exc.message}") from None
        return boot.DaemonConfig(
            home=home.home,
            label=label or settings.label or socket.gethostname(),
            listen=effective_listen or None,
            tls=tls,
            advertise=tuple(a.rstrip("/") for a in (advertise or settings.advertise)),
            settings=settings,
            new_store=new_store,
        )

    early = boot.EarlyConfig(
        home=home.home,
        label=label or boot.light_label(config_path, home=named) or socket.gethostname(),
        new_store=new_store,
    )
    try:
        asyncio.run(boot.serve(early, settle=settle))
    except PeerdError as exc:
        # The config file or a flag (what is wrong, and where); a damaged, foreign, missing or newer store.
        fail(exc, bare=isinstance(exc, (ConfigInvalid, StoreRefused, HomeNewer)))
    exit_now()


def exit_now() -> NoReturn:
    """The daemon stopped: its store, sockets, runs and links are closed, and what must last is
    synced. Exit without the interpreter's own teardown of the heap (every module and object freed
    one by one), which took 0.5 s of CPU after `daemon.stopped` with the console's streams served,
    half a stop's second; only the logs are flushed first."""
    import logging  # noqa: PLC0415  # loaded already: the daemon logged through it

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def log_as_json(log_format: str) -> bool:
    """JSON lines unless asked for the readable form, or `auto` on a person's terminal (journald's
    stream, `JOURNAL_STREAM`, keeps JSON although systemd may hand it a tty)."""
    if log_format != "auto":
        return log_format == "json"
    return not (sys.stderr.isatty() and "JOURNAL_STREAM" not in os.environ)


@cli.command()
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning")
@click.pass_context
def mcp(ctx: click.Context, log_level: str) -> None:
    """Serve peerd's agent tools over MCP on stdin/stdout (an agent CLI starts this).

    Tools: delegate_task, task_status, task_cancel, wait_for_github, list_waits, cancel_wait,
    thread_launch, thread_read, thread_wait, thread_send, thread_interrupt, project_list,
    environment_list. Started by peerd for a run, the
    tools act as that run; otherwise as this user. Logs go to stderr.
    """
    # The bridge is synchronous and standard-library only: no asyncio or logging set-up here,
    # which would cost more than the bridge itself. It writes its few diagnostics to stderr
    # (`--log-level` is kept for compatibility).
    from peerd.mcp_proxy import ProxyConfig, run_stdio  # noqa: PLC0415  # `peerd mcp` only

    del log_level
    env = dict(os.environ)
    env.setdefault("PEERD_HOME", str(cli_context(ctx).home))
    with contextlib.suppress(KeyboardInterrupt):
        run_stdio(ProxyConfig.from_env(env))


WAIT_POLL_S = 0.05  # a socket that does not exist yet has no event to wait for: poll it


def status_within(client: LocalClient, seconds: float) -> Any:
    """`GET /v1/status` once the daemon has started, trying every 50 ms for up to `seconds`. A
    daemon that answers but is still starting (`"state": "starting"`: only the owner socket is up,
    not yet its network listener) is waited for too; at the deadline its answer is shown as is."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            answer = client.call("GET", "/v1/status")
            if answer.get("state") != "starting" or time.monotonic() >= deadline:
                return answer
        except DaemonNotRunning:
            if time.monotonic() >= deadline:
                raise
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


@cli.command()
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Wait up to SECONDS for the daemon to have started (e.g. right after `peerd serve &`); exit 3 "
    "if it never answers.",
)
@json_option
@click.pass_context
def status(ctx: click.Context, wait_s: float | None, as_json: bool) -> None:
    """Show this environment: id, label, listeners, certificate fingerprint, counts."""

    def go(client: LocalClient) -> Any:
        if wait_s is None:
            return client.call("GET", "/v1/status")
        return status_within(client, wait_s)

    data = with_client(ctx, go)
    if as_json:
        emit_json(data)
        return
    counts = data["counts"]
    fields(
        [
            ("environment", data["environmentId"]),
            ("label", data["label"]),
            ("version", data["version"]),
            ("fingerprint", data["fingerprint"]),
            ("web certificate", data.get("webFingerprint")),
            ("home", data["home"]),
            *[
                ("listener", f"{x['address']} ({x['kind']}{', tls' if x['tls'] else ''})")
                for x in data["listeners"]
            ],
            *console_fields(data.get("console")),
            ("projects", counts["projects"]),
            ("threads", counts["threads"]),
            ("live runs", counts["liveRuns"]),
            *pushes_fields(data.get("a2aPushes")),
        ]
    )


def pushes_fields(pushes: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """A warning line when A2A push notifications were given up lately (`peerd doctor` says more)."""
    if not pushes or not pushes.get("givenUp"):
        return []
    days = f"{pushes['windowS'] / 86_400:g} days"
    line = f"{pushes['givenUp']} given up in the last {days}"
    if pushes.get("latest"):
        latest = pushes["latest"][0]
        line += f"; the latest, to {latest['webhook']} for task {latest['taskId']}: {latest['reason']}"
    return [("a2a pushes", line + " (`peerd doctor` says what to do)")]


def console_fields(console: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The console's line(s) of `peerd status`: its URL (`peerd console` prints a login link), and
    a note when its port was taken or it does not listen."""
    if console is None:
        return []
    shown: list[tuple[str, Any]] = [("console", console["url"] or "not listening")]
    if console.get("note"):
        shown.append(("console note", console["note"]))
    return shown


def main() -> None:
    cli(prog_name="peerd")
