"""`peerd pair`, `peerd link`, `peerd environment ...`, `peerd client ...`: pairing and links."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import confirm, json_option, json_option_for, on_terminal, with_client, yes_option
from peerd.cli.output import (
    JsonCommand,
    JsonOutput,
    PeerdGroup,
    emit_ids,
    emit_json,
    fields,
    quiet_option,
    table,
)
from peerd.core.constants import RUNTIME_MODES
from peerd.core.text import path_segment
from peerd.present import ago, one_line, when

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 10m, 12h or 30d.")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} is no time at all; give a duration like 90s, 10m, 12h or 30d.")
    return seconds


class Duration(click.ParamType[float]):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        return value if isinstance(value, float) else parse_duration(str(value))


DURATION = Duration()


@click.group(cls=PeerdGroup, invoke_without_command=True)
@click.option(
    "--access",
    type=click.Choice(RUNTIME_MODES),
    default="approval-required",
    show_default=True,
    help="The most a laptop linking with this code may ask for.",
)
@click.option("--ttl", type=DURATION, default="10m", show_default=True, help="How long the code stays valid.")
@click.option("--label-hint", default=None, help="Who the code is for (shown in `peerd pair list`).")
@click.option(
    "--max-age", type=DURATION, default=None, help="End the link this long after linking, used or not."
)
@click.option("--url", "urls", multiple=True, help="Address the laptop should use (repeatable).")
@click.option(
    "--for",
    "purpose",
    type=click.Choice(["link", "agent"]),
    default="link",
    show_default=True,
    help="link: for `peerd link` on another machine; agent: for an outside agent's OAuth sign-in "
    "page (Claude Code, Codex, any MCP client); the sign-in lasts at most 30 days.",
)
@json_option_for("POST /v1/pair")
@click.pass_context
def pair(
    ctx: click.Context,
    access: str,
    ttl: float,
    label_hint: str | None,
    max_age: float | None,
    urls: tuple[str, ...],
    purpose: str,
    as_json: JsonOutput | None,
) -> None:
    """Print a one-time pairing code for another machine to link here (`peerd link -` there, then
    paste it: a code on a command line stays in the shell's history)."""
    if ctx.invoked_subcommand is not None:
        return
    body: dict[str, Any] = {"access": access, "ttlS": ttl, "urls": list(urls), "purpose": purpose}
    if label_hint:
        body["labelHint"] = label_hint
    if max_age:
        body["maxAgeS"] = max_age

    def go(client: LocalClient) -> Any:
        return client.call("POST", "/v1/pair", body=body)

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
        return
    info = data["info"]
    click.echo(data["code"])
    if purpose == "agent":
        mcp = ", ".join(f"{u.rstrip('/')}/mcp" for u in data["urls"])
        where = (
            f"Point the agent at {mcp}"
            if mcp
            else "Serve a listener first (peerd serve --listen HOST:PORT) and point the agent at its /mcp"
        )
        click.echo(
            f"\nSingle use, valid until {when(info['expiresAt'])}, access up to {info['access']}. {where}; "
            "type this code into the sign-in page it opens.",
            err=True,
        )
        return
    click.echo(
        f"\nSingle use, valid until {when(info['expiresAt'])}, access up to {info['access']}; reaches this "
        f"machine at {', '.join(data['urls'])}.\nOn the other machine: peerd link - (then paste the code)",
        err=True,
    )


@pair.command("list")
@click.option("--all", "include_done", is_flag=True, help="Include used, expired, burnt and cancelled codes.")
@json_option
@quiet_option
@click.pass_context
def pair_list(ctx: click.Context, include_done: bool, as_json: JsonOutput | None, quiet: bool) -> None:
    """List pairing codes (never their secrets)."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/pair", params={"all": include_done})

    items = with_client(ctx, go)["items"]
    if quiet:
        emit_ids(items, "id")
        return
    if as_json:
        emit_json(items, as_json)
        return
    table(
        ["id", "access", "state", "kind", "expires", "failed", "for"],
        [
            [
                x["id"],
                x["access"],
                x["state"],
                x.get("purpose", "link"),  # link (peerd link) or agent (an agent's sign-in page)
                ago(x["expiresAt"]),
                x["failedAttempts"],
                x["labelHint"],
            ]
            for x in items
        ],
    )


@pair.command("cancel")
@click.argument("code_id")
@yes_option
@json_option_for("POST /v1/pair/{id}/cancel")
@click.pass_context
def pair_cancel(ctx: click.Context, code_id: str, yes: bool, as_json: JsonOutput | None) -> None:
    """Cancel an unused pairing code."""
    confirm(yes, f"Cancel pairing code {code_id}?")

    def go(client: LocalClient) -> Any:
        return client.call("POST", f"/v1/pair/{path_segment(code_id)}/cancel")

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else click.echo(f"cancelled pairing code {data['id']}")


@click.command(cls=JsonCommand)
@click.argument("code")
@click.option(
    "--access",
    type=click.Choice(RUNTIME_MODES),
    default="approval-required",
    show_default=True,
    help="What this machine may do there (at most what the code allows).",
)
@click.option("--label", default=None, help="How the other machine lists this one (default: this label).")
@click.option("--url", "urls", multiple=True, help="Another address of the other machine to try first.")
@click.option("--max-age", type=DURATION, default=None, help="End the link this long after linking.")
@json_option_for("POST /v1/links")
@click.pass_context
def link(
    ctx: click.Context,
    code: str,
    access: str,
    label: str | None,
    urls: tuple[str, ...],
    max_age: float | None,
    as_json: JsonOutput | None,
) -> None:
    """Link to another machine with the pairing code it printed (`-` reads the code from stdin)."""
    if code == "-":
        if on_terminal():
            code = click.prompt("Pairing code (peerd-pair:...)", hide_input=True).strip()
        else:
            code = sys.stdin.read().strip()
    if not code:
        raise click.UsageError("No pairing code given: paste the peerd-pair:... line `peerd pair` printed.")
    body: dict[str, Any] = {"code": code, "access": access, "urls": list(urls)}
    if label:
        body["label"] = label
    if max_age:
        body["maxAgeS"] = max_age

    def go(client: LocalClient) -> Any:
        return client.call("POST", "/v1/links", body=body)

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
    else:
        at = ", ".join(data["urls"])
        click.echo(
            one_line(f"linked {data['label']} ({data['environmentId']}) with {data['access']} access at {at}")
        )
        if before := data.get("replacedAccess"):
            change = "" if before == data["access"] else f", was {before}"
            click.echo(
                one_line(
                    f"this replaces the earlier link to {data['label']}{change} (its session there is revoked)"
                )
            )


def _link_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            x["environmentId"],
            x["label"],
            ", ".join(x["urls"]),
            x["access"],
            _status(x),
            ago(x["lastReachedAt"]),
            x["lastError"] or "",
        ]
        for x in items
    ]


@click.group(cls=PeerdGroup)
def environment() -> None:
    """Linked environments (the machines this one may act on)."""


def _status(x: dict[str, Any]) -> str:
    """A status the box just confirmed as is; one it did not (`--offline`, or too late), said so."""
    if x.get("live") or x["status"] in ("revoked", "expired"):
        return str(x["status"])
    return f"{x['status']} (last known)"


OFFLINE_HELP = "Do not ask the boxes (they are asked, as the link, within 2 s); show the stored status."


@environment.command("list")
@click.option("--offline", "--no-probe", "offline", is_flag=True, help=OFFLINE_HELP)
@json_option
@quiet_option
@click.pass_context
def environment_list(ctx: click.Context, offline: bool, as_json: JsonOutput | None, quiet: bool) -> None:
    """List links with their access, status (asked of each box now) and last error."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/environments", params={"probe": not offline})

    items = with_client(ctx, go)["items"]
    if quiet:
        emit_ids(items, "environmentId")
        return
    if as_json:
        emit_json(items, as_json)
        return
    table(["id", "label", "addresses", "access", "status", "last reached", "last error"], _link_rows(items))


@environment.command("show")
@click.argument("env_id")
@click.option("--offline", is_flag=True, help=OFFLINE_HELP)
@json_option
@click.pass_context
def environment_show(ctx: click.Context, env_id: str, offline: bool, as_json: JsonOutput | None) -> None:
    """Show one link (by environment id or label), its status asked of the box now."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", f"/v1/environments/{path_segment(env_id)}", params={"probe": not offline})

    x = with_client(ctx, go)
    if as_json:
        emit_json(x, as_json)
        return
    fields(
        [
            ("environment", x["environmentId"]),
            ("label", x["label"]),
            ("access", x["access"]),
            ("status", _status(x)),
            ("addresses", ", ".join(x["urls"])),
            ("fingerprint", x["fingerprint"]),
            ("linked", when(x["linkedAt"])),
            ("last reached", when(x["lastReachedAt"])),
            ("expires if unused", when(x["expiresAt"])),
            ("last error", x["lastError"]),
        ]
    )


@environment.command("unlink")
@click.argument("env_id")
@yes_option
@json_option_for("DELETE /v1/environments/{id}")
@click.pass_context
def environment_unlink(ctx: click.Context, env_id: str, yes: bool, as_json: JsonOutput | None) -> None:
    """Revoke the link there (when reachable) and forget it here."""
    confirm(yes, f"Unlink {env_id}? Its tasks from here fail, and linking again needs a new code.")

    def go(client: LocalClient) -> Any:
        return client.call("DELETE", f"/v1/environments/{path_segment(env_id)}")

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else click.echo(one_line(data["message"]))


@click.group(cls=PeerdGroup)
def client() -> None:
    """Clients: machines linked to this one."""


@client.command("list")
@json_option
@quiet_option
@click.pass_context
def client_list(ctx: click.Context, as_json: JsonOutput | None, quiet: bool) -> None:
    """List linked machines: who, access, linked at, last seen and from where."""

    def go(c: LocalClient) -> Any:
        return c.call("GET", "/v1/clients")

    items = with_client(ctx, go)["items"]
    if quiet:
        emit_ids(items, "id")
        return
    if as_json:
        emit_json(items, as_json)
        return
    table(
        ["id", "label", "access", "status", "kind", "linked", "last seen", "lapses", "from"],
        [
            [
                x["id"],
                (x.get("agentName") or x["label"]) if x.get("kind") == "agent" else x["label"],
                x["access"],
                x["status"],
                x.get("kind", "link"),  # a link, or an outside agent signed in over OAuth
                ago(x["createdAt"]),
                ago(x["lastSeenAt"]),
                _lapses(x),
                x["lastAddress"],
            ]
            for x in items
        ],
    )


def _lapses(client: dict[str, Any]) -> str:
    """When a live client lapses unless it is used again: the same moment its machine's link shows
    as `expires if unused` (`lapsesAt`); nothing for a revoked or expired one."""
    if client["status"] != "active":
        return ""
    return ago(client.get("lapsesAt")) or "never"


@client.command("revoke")
@click.argument("client_id")
@click.option(
    "--keep-runs", is_flag=True, help="Let the runs this link started finish (by default they are stopped)."
)
@yes_option
@json_option_for("POST /v1/clients/{id}/revoke")
@click.pass_context
def client_revoke(
    ctx: click.Context, client_id: str, keep_runs: bool, yes: bool, as_json: JsonOutput | None
) -> None:
    """Revoke a linked machine: its next request is refused, and the runs it started here stop."""
    if not yes and on_terminal():  # name the machine, not only its id
        listed = with_client(ctx, lambda c: c.call("GET", "/v1/clients"))
        label = next((x["label"] for x in listed["items"] if x["id"] == client_id), None)
        named = f"{label} ({client_id})" if label else client_id
        confirm(yes, f"Revoke {named}?" + ("" if keep_runs else " The runs it started here stop."))

    def go(c: LocalClient) -> Any:
        return c.call("POST", f"/v1/clients/{path_segment(client_id)}/revoke", body={"keepRuns": keep_runs})

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
        return
    click.echo(one_line(f"revoked {data['id']} ({data['label']})"))
    stopped = data.get("stoppedThreads") or []
    if stopped:
        click.echo(f"stopped the runs of {len(stopped)} thread(s) it started: {', '.join(stopped)}")
