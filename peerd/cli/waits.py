"""`peerd wait ...`: the waits agents recorded on pull requests (the wait_for_github tool)."""

from __future__ import annotations

from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import confirm, json_option, json_option_for, with_client, yes_option
from peerd.cli.output import JsonOutput, PeerdGroup, emit_ids, emit_json, fields, quiet_option, table
from peerd.core.text import path_segment
from peerd.present import ago, block, one_line, when

WAIT_STATUSES = ("watching", "delivered", "cancelled")


@click.group(cls=PeerdGroup)
def wait() -> None:
    """Waits on pull requests (agents record them with the wait_for_github tool)."""


def _statuses(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    wanted = tuple(dict.fromkeys(s.strip() for v in values for s in v.split(",") if s.strip()))
    unknown = [s for s in wanted if s not in WAIT_STATUSES]
    if unknown:
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown))} is not a wait status; use {', '.join(WAIT_STATUSES)}.",
            ctx,
            param,
        )
    return wanted


def _ended(w: dict[str, Any]) -> str:
    if w["status"] == "watching":
        return f"{w['polls']} polls" + (f"; {w['lastError']}" if w.get("lastError") else "")
    return w.get("outcome") or w.get("detail") or ""


@wait.command("list")
@click.option("--thread", "thread_id", metavar="THREAD_ID", default=None, help="Only this thread's waits.")
@click.option(
    "--status",
    multiple=True,
    callback=_statuses,
    metavar="STATUS[,STATUS]",
    help=f"Only waits in these states (repeatable): {', '.join(WAIT_STATUSES)}.",
)
@click.option(
    "--limit", type=click.IntRange(min=1, max=100), default=100, show_default=True, help="At most this many."
)
@json_option
@quiet_option
@click.pass_context
def wait_list(
    ctx: click.Context,
    thread_id: str | None,
    status: tuple[str, ...],
    limit: int,
    as_json: JsonOutput | None,
    quiet: bool,
) -> None:
    """List the waits on pull requests here, newest first."""
    params = {"threadId": thread_id, "status": ",".join(status) or None, "limit": limit}
    page = with_client(ctx, lambda client: client.call("GET", "/v1/waits", params=params))
    items = page["items"]
    if quiet:
        emit_ids(items, "waitId")
    elif as_json:
        emit_json(items, as_json)
    else:
        table(
            ["id", "status", "pr", "until", "thread", "outcome", "created"],
            [
                [w["waitId"], w["status"], w.get("prUrl") or w["pr"], w["until"], w["threadId"], _ended(w),
                 ago(w["createdAt"])]
                for w in items
            ],
        )  # fmt: skip


@wait.command("show")
@click.argument("wait_id")
@json_option
@click.pass_context
def wait_show(ctx: click.Context, wait_id: str, as_json: JsonOutput | None) -> None:
    """Show a wait: the pull request, what GitHub said at its last poll, and how it ended."""
    w = with_client(ctx, lambda client: client.call("GET", f"/v1/waits/{path_segment(wait_id)}"))
    if as_json:
        emit_json(w, as_json)
        return
    fields(
        [
            ("wait", w["waitId"]),
            ("status", w["status"]),
            ("pull request", w.get("prUrl") or w["pr"]),
            ("until", w["until"]),
            ("thread", w["threadId"]),
            ("outcome", w.get("outcome")),
            ("pr state", w.get("prState")),
            ("review", w.get("reviewDecision")),
            ("polls", str(w["polls"])),
            ("last error", w.get("lastError")),
            ("next poll", when(w.get("nextPollAt"))),
            ("woken run", w.get("wokenRunId")),
            ("deadline", when(w["deadlineAt"])),
            ("created", when(w["createdAt"])),
            ("ended", when(w.get("endedAt"))),
        ]
    )
    if w["checks"]:
        click.echo("")
        table(["check", "state", "bucket"], [[c["name"], c["state"], c["bucket"]] for c in w["checks"]])
    if w.get("detail"):
        click.echo(f"\n{block(w['detail'])}")


@wait.command("cancel")
@click.argument("wait_id")
@click.option("--reason", default=None, help="Why (kept with the wait).")
@yes_option
@json_option_for("POST /v1/waits/{id}/cancel")
@click.pass_context
def wait_cancel(
    ctx: click.Context, wait_id: str, reason: str | None, yes: bool, as_json: JsonOutput | None
) -> None:
    """Cancel a wait: it ends cancelled and its thread is not woken for it."""
    confirm(yes, f"Cancel wait {wait_id}? Its agent will not be woken for it.")

    def go(client: LocalClient) -> Any:
        body = {"reason": reason} if reason else {}
        return client.call("POST", f"/v1/waits/{path_segment(wait_id)}/cancel", body=body)

    w = with_client(ctx, go)
    if as_json:
        emit_json(w, as_json)
    else:
        click.echo(f"{w['waitId']} {w['status']}: {one_line(w.get('detail') or w.get('outcome') or '')}")
