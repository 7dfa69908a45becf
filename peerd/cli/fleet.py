"""`peerd fleet`: every environment (this one first) with its status and capacity, in one table."""

from __future__ import annotations

from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import json_option, with_client
from peerd.cli.output import JsonOutput, emit_json, table
from peerd.present import one_line

HEADERS = ("environment", "status", "runs", "load", "free memory", "providers", "projects", "preference")
SHOWN = {"prefer": "prefers", "normal": "normal", "less": "less often", "manual-only": "manual only"}


def _gib(value: Any) -> str:
    return "" if value is None else f"{value / 2**30:.1f} GiB"


def _age(env: dict[str, Any]) -> str:
    """How old the capacity shown is: this machine's is read as you ask; a box's is its last report."""
    if env["here"]:
        return "live"
    age = env.get("ageS")
    if age is None:
        return "never"
    if age < 5:
        return "just now"
    return f"{int(age)} s ago" if age < 120 else f"{int(age // 60)} min ago"


def _runs(cap: dict[str, Any]) -> str:
    """`3/8`, with queued runs `3/8 +2 queued`."""
    if not cap:
        return ""
    queued = cap.get("queuedRuns") or 0
    return f"{cap['liveRuns']}/{cap['maxRuns']}" + (f" +{queued} queued" if queued else "")


def _row(env: dict[str, Any]) -> list[Any]:
    cap = env.get("capacity") or {}
    status = env["status"] + (" (older report)" if env.get("error") and cap else "")
    load = cap.get("load")
    return [
        env["label"],
        status,
        _runs(cap),
        "" if load is None else f"{load:.1f} ({cap.get('cpus', 1)} CPU)",
        _gib(cap.get("memAvailable")),
        ", ".join(cap.get("providers", [])),
        ", ".join(p.get("name") or p["id"] for p in cap.get("projects", [])),
        SHOWN.get(cap.get("preference", ""), ""),
        _age(env),
        one_line(env.get("error") or ""),
    ]


@click.command("fleet")
@click.option("--offline", is_flag=True, help="Show what is cached, without asking any box.")
@json_option
@click.pass_context
def fleet(ctx: click.Context, offline: bool, as_json: JsonOutput | None) -> None:
    """Every environment with its status, runs, load, memory, providers, projects and preference."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/fleet", params={"offline": offline})

    envs = with_client(ctx, go)["environments"]
    if as_json:
        emit_json(envs, as_json)
        return
    table([*HEADERS, "reported", "problem"], [_row(env) for env in envs])
