"""`peerd project ...`: register git checkouts with this environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import confirm, env_option, json_option, json_option_for, with_client, yes_option
from peerd.cli.output import JsonOutput, PeerdGroup, emit_ids, emit_json, fields, quiet_option, table
from peerd.core.text import path_segment
from peerd.present import when


@click.group(cls=PeerdGroup)
def project() -> None:
    """Projects: git checkouts agents work in."""


def _show(data: dict[str, Any]) -> None:
    fields(
        [
            ("id", data["id"]),
            ("name", data["name"]),
            ("path", data["path"]),
            ("repository", data["repositoryKey"] or "(no origin remote)"),
            ("added", when(data["createdAt"])),
        ]
    )


@project.command("add")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", default=None, help="A short name (default: the checkout's folder name).")
@json_option_for("POST /v1/projects")
@click.pass_context
def project_add(ctx: click.Context, path: Path, name: str | None, as_json: JsonOutput | None) -> None:
    """Register the git checkout at PATH."""

    def go(client: LocalClient) -> Any:
        return client.call("POST", "/v1/projects", body={"path": str(path.resolve()), "name": name})

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else _show(data)


@project.command("list")
@env_option
@json_option
@quiet_option
@click.pass_context
def project_list(ctx: click.Context, as_json: JsonOutput | None, quiet: bool) -> None:
    """List projects (all pages)."""

    def go(client: LocalClient) -> list[Any]:
        items: list[Any] = []
        cursor = None
        while True:
            page = client.call("GET", "/v1/projects", params={"cursor": cursor, "limit": 100})
            items.extend(page["items"])
            cursor = page["nextCursor"]
            if cursor is None:
                return items

    items = with_client(ctx, go)
    if quiet:
        emit_ids(items, "id")
        return
    if as_json:
        emit_json(items, as_json)
        return
    table(
        ["id", "name", "repository", "path"],
        [[p["id"], p["name"], p["repositoryKey"] or "(no origin remote)", p["path"]] for p in items],
    )


@project.command("show")
@click.argument("project_id")
@json_option
@click.pass_context
def project_show(ctx: click.Context, project_id: str, as_json: JsonOutput | None) -> None:
    """Show one project (by id or name)."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", f"/v1/projects/{path_segment(project_id)}")

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else _show(data)


@project.command("remove")
@click.argument("project_id")
@yes_option
@json_option_for("DELETE /v1/projects/{id}")
@click.pass_context
def project_remove(ctx: click.Context, project_id: str, yes: bool, as_json: JsonOutput | None) -> None:
    """Forget a project (its threads must be archived first). The checkout is left untouched."""
    confirm(yes, f"Forget project {project_id}?")

    def go(client: LocalClient) -> Any:
        return client.call("DELETE", f"/v1/projects/{path_segment(project_id)}")

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else click.echo(f"removed project {data['id']} ({data['name']})")
