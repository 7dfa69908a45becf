"""`peerd task ...`: the tasks a thread delegated, here or to linked environments."""

from __future__ import annotations

import time
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import (
    ALL_ENVS,
    ENV_META,
    PAGE,
    cli_context,
    complete_task,
    complete_thread,
    confirm,
    exit_code_of_end,
    exit_code_of_wait,
    fleet_of,
    json_option,
    json_option_for,
    waiting_field,
    with_client,
    yes_option,
)
from peerd.cli.output import JsonOutput, PeerdGroup, emit_ids, emit_json, fields, quiet_option, table
from peerd.core.constants import LONG_POLL_MAX_S
from peerd.core.text import path_segment
from peerd.errors import DaemonNotRunning, PeerdError
from peerd.present import ago, block, one_line, when


@click.group(cls=PeerdGroup)
def task() -> None:
    """Delegated tasks (agents create them with the delegate_task tool)."""


def _where(t: dict[str, Any]) -> str:
    remote = t.get("remoteChild")
    if remote:
        return f"on {remote['label']}: {remote['threadId'] or '(launch pending)'}"
    return t.get("childThreadId") or "(launch pending)"


def _link_state(ctx: click.Context, t: dict[str, Any]) -> str | None:
    """An open remote task's link, when it is not plainly reachable (`version_skew`: the box runs
    a peerd too old to follow the task; `unreachable` ...), as stored: the box is not asked."""
    remote = t.get("remoteChild")
    if not remote or t["status"] not in ("pending", "running"):
        return None

    if ctx.meta.get(ENV_META):
        return None  # the task was read in another environment: its links are not ours
    client = LocalClient(cli_context(ctx).paths.socket)
    env = path_segment(remote["environmentId"])
    try:
        link = client.call("GET", f"/v1/environments/{env}", params={"probe": "false"})
    except (PeerdError, DaemonNotRunning, OSError):  # forgotten here meanwhile, say: the task says so itself
        return None
    status = str(link.get("status") or "")
    return None if status == "reachable" else f"{status}: {link.get('lastError') or ''}".rstrip(": ")


TASK_STATUSES = ("pending", "running", "completed", "failed", "cancelled", "interrupted")
TERMINAL_TASK = frozenset(TASK_STATUSES) - {"pending", "running"}


def _statuses(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """`--status running,pending --status failed`: checked here, before anything is sent."""
    wanted = tuple(dict.fromkeys(s.strip() for v in values for s in v.split(",") if s.strip()))
    unknown = [s for s in wanted if s not in TASK_STATUSES]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown))} is not a task status; use {', '.join(TASK_STATUSES)}.",
            ctx,
            param,
        )
    return wanted


def _list(client: LocalClient, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Up to `limit` tasks (0: all), newest first, a page at a time; and whether more are left."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        want = PAGE if limit == 0 else min(PAGE, limit - len(items))
        page = client.call("GET", "/v1/tasks", params={**params, "cursor": cursor, "limit": want})
        items += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return items, False
        if limit and len(items) >= limit:
            return items, True


@task.command("list")
@click.argument("thread_id", required=False, shell_complete=complete_thread)
@click.option(
    "--thread", "parent", metavar="THREAD_ID", default=None, help="Only the tasks this thread delegated."
)
@click.option(
    "--status",
    multiple=True,
    callback=_statuses,
    metavar="STATUS[,STATUS]",
    help=f"Only tasks in these states (repeatable): {', '.join(TASK_STATUSES)}.",
)
@click.option(
    "--env",
    "target",
    metavar="ENV",
    default=None,
    help="Only tasks whose child runs there: a link's label or id (this environment's own: run here);"
    " `all`: the tasks of every machine of the fleet, with an ON column.",
)
@click.option(
    "--limit", type=click.IntRange(min=0), default=100, show_default=True, help="At most this many (0: all)."
)
@json_option
@quiet_option
@click.pass_context
def task_list(
    ctx: click.Context,
    thread_id: str | None,
    parent: str | None,
    status: tuple[str, ...],
    target: str | None,
    limit: int,
    as_json: JsonOutput | None,
    quiet: bool,
) -> None:
    """List this machine's tasks, newest first (THREAD_ID or --thread: only those it delegated).
    `--env all`: here and on every linked machine, with an ON column (a machine that cannot answer
    is named on stderr)."""
    if thread_id and parent and thread_id != parent:
        raise click.UsageError("Give the parent thread once: as THREAD_ID or as --thread.")
    fleet = target == ALL_ENVS
    params = {
        "threadId": thread_id or parent,
        "status": ",".join(status) or None,
        "targetEnvironment": None if fleet else target,
    }

    def everywhere(client: LocalClient) -> tuple[list[dict[str, Any]], bool]:
        items: list[dict[str, Any]] = []
        more = False
        for env_id, label in fleet_of(client):
            client.environment_id = env_id
            try:
                listed, cut = _list(client, params, limit)
            except PeerdError as exc:
                if env_id is None:
                    raise
                click.echo(one_line(f"{label}: not listed ({exc.code}: {exc.message})"), err=True)
                continue
            items += [{**t, "on": label} for t in listed]
            more = more or cut
        items.sort(key=lambda t: (t["createdAt"], t["taskId"]), reverse=True)
        return (items[:limit], more or len(items) > limit) if limit else (items, more)

    items, more = with_client(ctx, everywhere if fleet else lambda client: _list(client, params, limit))
    if quiet:
        emit_ids(items, "taskId")
    elif as_json:
        emit_json(items, as_json)
    else:
        heads = ["id", "status", "title", "parent", "child", "created", "stop owed"]
        rows = []
        for t in items:
            row = [
                t["taskId"],
                t["status"],
                t["title"][:40],
                t["parentThreadId"],
                _where(t),
                ago(t["createdAt"]),
                "yes" if t["stopOwed"] else "",
            ]
            rows.append([*row[:1], t["on"], *row[1:]] if fleet else row)
        table([*heads[:1], "on", *heads[1:]] if fleet else heads, rows)
    if more:
        click.echo(f"(the newest {limit} shown; --limit 0 lists them all)", err=True)


@task.command("show")
@click.argument("task_id", shell_complete=complete_task)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Wait up to SECONDS for the task to end; the exit code says how it ended.",
)
@json_option
@click.pass_context
def task_show(ctx: click.Context, task_id: str, wait_s: float | None, as_json: JsonOutput | None) -> None:
    """Show a task and its result. With --wait, wait for it to end first: exits 0 only if it
    completed, 5 failed, 6 interrupted or cancelled, 7 still running and waiting for your approval,
    4 still running."""

    def go(client: LocalClient) -> Any:
        path = f"/v1/tasks/{path_segment(task_id)}"
        if wait_s is None:
            return client.call("GET", path)
        deadline = time.monotonic() + wait_s
        while True:
            chunk = min(LONG_POLL_MAX_S, max(0.0, deadline - time.monotonic()))
            t = client.call("GET", path, params={"wait": round(chunk, 3)})
            if t["status"] in TERMINAL_TASK or time.monotonic() >= deadline:
                return t

    t = with_client(ctx, go)
    if as_json:
        emit_json(t, as_json)
        return
    fields(
        [
            ("task", t["taskId"]),
            ("status", t["status"]),
            ("title", t["title"]),
            ("parent thread", t["parentThreadId"]),
            ("child", _where(t)),
            ("link", _link_state(ctx, t)),
            ("waiting for", waiting_field(t.get("awaitingApproval"))),
            ("stop owed", "yes" if t["stopOwed"] else "no"),
            ("last error", t["lastError"]),
            ("placement", t.get("placement")),
            ("usage", _usage(t.get("usage"))),
            ("created", when(t["createdAt"])),
            ("ended", when(t["endedAt"])),
        ]
    )
    if t["result"] is not None:
        click.echo(f"\n{block(t['result'])}")
    if wait_s is not None:
        ended = t["status"] in TERMINAL_TASK
        ctx.exit(
            exit_code_of_end(t["status"])
            if ended
            else exit_code_of_wait({"awaitingApproval": t.get("awaitingApproval")})
        )


@task.command("cancel")
@click.argument("task_id", shell_complete=complete_task)
@click.option("--reason", default=None, help="Why (becomes part of the task's result).")
@yes_option
@json_option_for("POST /v1/tasks/{id}/cancel")
@click.pass_context
def task_cancel(
    ctx: click.Context, task_id: str, reason: str | None, yes: bool, as_json: JsonOutput | None
) -> None:
    """Cancel a task: stop its child (there too; a stop that cannot land yet is retried)."""
    confirm(yes, f"Cancel task {task_id} and stop its child?")

    def go(client: LocalClient) -> Any:
        return client.call(
            "POST", f"/v1/tasks/{path_segment(task_id)}/cancel", body={"reason": reason} if reason else {}
        )

    t = with_client(ctx, go)
    if as_json:
        emit_json(t, as_json)
    else:
        owed = " (the stop is owed and will be retried)" if t["stopOwed"] else ""
        click.echo(f"{t['taskId']} {t['status']}: {one_line(t['result'])}{owed}")


def _usage(wire: dict[str, Any] | None) -> str:
    """A usage object of the API as one line (imported here: `task list` never shows one)."""
    from peerd.core.usage import Usage, describe  # noqa: PLC0415  # show only: CLI start-up

    return describe(None if wire is None else Usage.from_json(wire))
