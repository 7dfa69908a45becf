"""`peerd task ...`: the tasks a thread delegated, here or to linked environments."""

from __future__ import annotations

from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import confirm, json_option, with_client, yes_option
from peerd.cli.output import ago, block, emit_json, fields, one_line, table
from peerd.core.text import path_segment


@click.group()
def task() -> None:
    """Delegated tasks (agents create them with the delegate_task tool)."""


def _where(t: dict[str, Any]) -> str:
    remote = t.get("remoteChild")
    if remote:
        return f"on {remote['label']}: {remote['threadId'] or '(launch pending)'}"
    return t.get("childThreadId") or "(launch pending)"


@task.command("list")
@click.argument("thread_id")
@json_option
@click.pass_context
def task_list(ctx: click.Context, thread_id: str, as_json: bool) -> None:
    """List the tasks THREAD_ID delegated."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", "/v1/tasks", params={"threadId": thread_id})

    items = with_client(ctx, go)["items"]
    if as_json:
        emit_json(items)
        return
    table(
        ["id", "status", "title", "child", "stop owed"],
        [
            [t["taskId"], t["status"], t["title"][:40], _where(t), "yes" if t["stopOwed"] else ""]
            for t in items
        ],
    )


@task.command("show")
@click.argument("task_id")
@json_option
@click.pass_context
def task_show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show a task and its result."""

    def go(client: LocalClient) -> Any:
        return client.call("GET", f"/v1/tasks/{path_segment(task_id)}")

    t = with_client(ctx, go)
    if as_json:
        emit_json(t)
        return
    fields(
        [
            ("task", t["taskId"]),
            ("status", t["status"]),
            ("title", t["title"]),
            ("parent thread", t["parentThreadId"]),
            ("child", _where(t)),
            ("stop owed", "yes" if t["stopOwed"] else "no"),
            ("last error", t["lastError"]),
            ("created", ago(t["createdAt"])),
            ("ended", ago(t["endedAt"])),
        ]
    )
    if t["result"] is not None:
        click.echo(f"\n{block(t['result'])}")


@task.command("cancel")
@click.argument("task_id")
@click.option("--reason", default=None, help="Why (becomes part of the task's result).")
@yes_option
@json_option
@click.pass_context
def task_cancel(ctx: click.Context, task_id: str, reason: str | None, yes: bool, as_json: bool) -> None:
    """Cancel a task: stop its child (there too; a stop that cannot land yet is retried)."""
    confirm(yes, f"Cancel task {task_id} and stop its child?")

    def go(client: LocalClient) -> Any:
        return client.call(
            "POST", f"/v1/tasks/{path_segment(task_id)}/cancel", body={"reason": reason} if reason else {}
        )

    t = with_client(ctx, go)
    if as_json:
        emit_json(t)
    else:
        owed = " (the stop is owed and will be retried)" if t["stopOwed"] else ""
        click.echo(f"{t['taskId']} {t['status']}: {one_line(t['result'])}{owed}")
