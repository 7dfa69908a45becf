"""`peerd provider ...` and `peerd config show`: which coders this daemon can run, and its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import (
    cli_context,
    fail,
    json_option,
    json_option_for,
    with_client,
)
from peerd.cli.output import JsonOutput, PeerdGroup, emit_ids, emit_json, fields, quiet_option, table
from peerd.clientwire import DaemonConnectionError
from peerd.core.text import path_segment
from peerd.errors import DaemonNotRunning, NotFound, PeerdError
from peerd.paths import config_file


@click.group(cls=PeerdGroup)
def provider() -> None:
    """Coder providers: script, codex, claude, gemini, and custom commands from the config file."""


def _state(p: dict[str, Any]) -> str:
    if p["kind"] == "command":
        if not p["found"]:
            return "not found"
        return "approved" if p["approved"] else "NOT APPROVED"
    return "found" if p["found"] else "not found"


@provider.command("list")
@json_option
@quiet_option
@click.pass_context
def provider_list(ctx: click.Context, as_json: JsonOutput | None, quiet: bool) -> None:
    """Each provider: its kind, whether its CLI was found (and where), its version and default model."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/providers")

    items = with_client(ctx, go)["items"]
    if quiet:
        emit_ids(items, "name")
        return
    if as_json:
        emit_json(items, as_json)
        return
    table(
        ["name", "kind", "state", "version", "model", "path"],
        [[p["name"], p["kind"], _state(p), p["version"], p["model"], p["path"]] for p in items],
    )
    for p in items:
        if p["kind"] == "command":
            click.echo(f"\n{p['name']} runs: {p['command']}")
        if p.get("problem") and p["kind"] != "script":
            click.echo(f"{p['name']}: {p['problem']}")


@provider.command("approve")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Approve without asking (you have read the command).")
@json_option_for("POST /v1/providers/{name}/approve")
@click.pass_context
def provider_approve(ctx: click.Context, name: str, yes: bool, as_json: JsonOutput | None) -> None:
    """Approve the custom command NAME, exactly as it is written now, to run as a coder.

    A custom command is untrusted until approved: the command is shown first. Editing it in the
    config file withdraws the approval.
    """

    def show(client: LocalClient) -> Any:
        return client.call("GET", "/v1/providers")

    items = {p["name"]: p for p in with_client(ctx, show)["items"]}
    info = items.get(name)
    if info is None or info["kind"] != "command":
        custom = ", ".join(n for n, p in items.items() if p["kind"] == "command") or "none configured"
        fail(NotFound(f"{name!r} is not a custom command provider (custom commands: {custom})."))
    command = info["command"]
    if not yes and not as_json:
        click.echo(f"{name} would run, in each run's worktree, with the task in {{SPEC}}:\n\n  {command}\n")
        if not click.confirm("Approve exactly this command?", default=False):
            fail("Not approved.")

    def approve(client: LocalClient) -> Any:
        return client.call("POST", f"/v1/providers/{path_segment(name)}/approve", body={"command": command})

    result = with_client(ctx, approve)
    if as_json:
        emit_json(result, as_json)
    else:
        click.echo(f"Approved {name}: {result['command']}")


@provider.command("revoke")
@click.argument("name")
@json_option_for("DELETE /v1/providers/{name}/approval")
@click.pass_context
def provider_revoke(ctx: click.Context, name: str, as_json: JsonOutput | None) -> None:
    """Withdraw the approval of the custom command NAME (the config file's allowlist still applies)."""

    def go(client: LocalClient) -> Any:
        return client.call("DELETE", f"/v1/providers/{path_segment(name)}/approval")

    result = with_client(ctx, go)
    if as_json:
        emit_json(result, as_json)
    elif result["approved"]:
        click.echo(f"{name} is still approved by approved_commands in the config file.")
    else:
        click.echo(f"{name} is no longer approved.")


@click.group(cls=PeerdGroup)
def config() -> None:
    """The daemon's configuration."""


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`providers.codex.model`-style keys for people; lists comma-separated."""
    pairs: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            pairs += _flat(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            pairs.append((f"{prefix}{key}", ", ".join(map(str, value)) or "(none)"))
        elif isinstance(value, bool):
            pairs.append((f"{prefix}{key}", "true" if value else "false"))
        elif value is not None and value != {}:
            pairs.append((f"{prefix}{key}", value))
    return pairs


@config.command("show")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PEERD_CONFIG",
    help="The file to read when the daemon is not running (default: <home>/config.toml for a --home or "
    "PEERD_HOME, else $XDG_CONFIG_HOME/peerd/config.toml).",
)
@json_option
@click.pass_context
def config_show(ctx: click.Context, config_path: Path | None, as_json: JsonOutput | None) -> None:
    """Show the effective config, secrets hidden, and the file it came from: the running daemon's
    (file + flags), or, when no daemon runs, what the config file says."""
    home = cli_context(ctx)
    looked_at = config_path or config_file(home=None if home.given_by == "default" else home.home)
    try:
        data = LocalClient(home.paths.socket).call("GET", "/v1/config")
    except DaemonNotRunning:
        data = None
    except DaemonConnectionError as exc:
        fail(str(exc))
    except PeerdError as exc:
        fail(exc)
    if data is None:
        from peerd import config as settings_file  # noqa: PLC0415  # pydantic: only without a daemon

        try:
            settings = settings_file.load(looked_at, required=config_path is not None)
        except PeerdError as exc:
            fail(exc)
        click.echo(
            "peerd is not running: showing the config file only (flags given to `peerd serve` win).", err=True
        )
        data = {**settings.shown(), "source": settings.source, "home": str(home.home)}
    if as_json:
        emit_json(data, as_json)
        return
    source = data.get("source")
    shown = {k: v for k, v in data.items() if k not in ("source", "home")}
    fields(
        [
            ("file", source or f"none (no {looked_at}: the defaults)"),
            ("home", data.get("home")),
            *_flat(shown),
        ]
    )
