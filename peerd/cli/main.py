"""`peerd`: the command line. Each command talks to the daemon over its local socket."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import click

from peerd import __version__
from peerd.cli.client import LocalClient
from peerd.cli.common import EXIT_USAGE, CliContext, cli_context, fail, json_option, with_client
from peerd.cli.doctor import doctor
from peerd.cli.links import client, environment, link, pair
from peerd.cli.orchestrate import orchestrate
from peerd.cli.output import emit_json, fields
from peerd.cli.projects import project
from peerd.cli.providers import config, provider
from peerd.cli.store import backup, restore
from peerd.cli.tasks import task
from peerd.cli.threads import thread
from peerd.errors import PeerdError
from peerd.logs import configure_logging
from peerd.paths import resolve_home


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="PEERD_HOME",
    help="Data directory (default: $PEERD_HOME, else $XDG_DATA_HOME/peerd).",
)
@click.version_option(__version__, prog_name="peerd")
@click.pass_context
def cli(ctx: click.Context, home: Path | None) -> None:
    """peerd links the machines your coding agents run on."""
    ctx.obj = CliContext(resolve_home(home))


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
    help="Config file (default: $XDG_CONFIG_HOME/peerd/config.toml). Flags win over it.",
)
@click.option(
    "--new-store",
    is_flag=True,
    help="Start with a new, empty store although this environment's identity exists (its store is "
    "missing). Never replaces an existing file.",
)
@click.option("--log-format", type=click.Choice(["json", "console"]), default="json", show_default=True)
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
    # Only `serve` needs the server stack; importing it here keeps every other command quick.
    from peerd import config as settings_file  # noqa: PLC0415
    from peerd.daemon import DEFAULT_LISTEN, DaemonConfig, parse_listen  # noqa: PLC0415
    from peerd.daemon import serve as run_daemon  # noqa: PLC0415

    configure_logging(json=log_format == "json", level=getattr(logging, log_level.upper()))
    try:
        settings = settings_file.load(config_path, required=config_path is not None)
    except PeerdError as exc:
        fail(f"{exc.code}: {exc.message}", EXIT_USAGE)
    tls = settings.tls and not no_tls
    from_file = DEFAULT_LISTEN if settings.listen is None else (settings.listen or None)
    effective_listen = None if no_listen else (listen or from_file)
    if effective_listen:
        try:
            parse_listen(effective_listen, tls=tls)
        except PeerdError as exc:
            fail(f"{exc.code}: {exc.message}", EXIT_USAGE)
    config = DaemonConfig(
        home=cli_context(ctx).home,
        label=label or settings.label or socket.gethostname(),
        listen=effective_listen or None,
        tls=tls,
        advertise=tuple(a.rstrip("/") for a in (advertise or settings.advertise)),
        settings=settings,
        new_store=new_store,
    )
    try:
        asyncio.run(run_daemon(config))
    except PeerdError as exc:
        if exc.code == "store_refused":  # a damaged, foreign or missing store: the sentence says why
            fail(exc.message, EXIT_USAGE)
        fail(f"{exc.code}: {exc.message}")


@cli.command()
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning")
@click.pass_context
def mcp(ctx: click.Context, log_level: str) -> None:
    """Serve peerd's agent tools over MCP on stdin/stdout (an agent CLI starts this).

    Tools: delegate_task, task_status, task_cancel, thread_launch, thread_read, thread_wait,
    thread_send, thread_interrupt, project_list, environment_list. Started by peerd for a run, the
    tools act as that run; otherwise as this user. Logs go to stderr.
    """
    import os  # noqa: PLC0415

    from peerd.mcp_proxy import ProxyConfig, serve_stdio  # noqa: PLC0415

    configure_logging(json=True, level=getattr(logging, log_level.upper()))
    env = dict(os.environ)
    env.setdefault("PEERD_HOME", str(cli_context(ctx).home))
    asyncio.run(serve_stdio(ProxyConfig.from_env(env)))


@cli.command()
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show this environment: id, label, listeners, certificate fingerprint, counts."""

    async def go(client: LocalClient) -> Any:
        return await client.call("GET", "/v1/status")

    data = with_client(ctx, go)
    if as_json:
        emit_json(data)
        return
    counts = data["counts"]
    fields(
        [
            ("environment", data["envId"]),
            ("label", data["label"]),
            ("version", data["version"]),
            ("fingerprint", data["fingerprint"]),
            ("home", data["home"]),
            *[
                ("listener", f"{x['address']} ({x['kind']}{', tls' if x['tls'] else ''})")
                for x in data["listeners"]
            ],
            ("projects", counts["projects"]),
            ("threads", counts["threads"]),
            ("live runs", counts["liveRuns"]),
        ]
    )


cli.add_command(project)
cli.add_command(thread)
cli.add_command(pair)
cli.add_command(link)
cli.add_command(environment)
cli.add_command(client)
cli.add_command(task)
cli.add_command(provider)
cli.add_command(config)
cli.add_command(doctor)
cli.add_command(orchestrate)
cli.add_command(backup)
cli.add_command(restore)


def main() -> None:
    cli(prog_name="peerd")
