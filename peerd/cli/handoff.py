"""`peerd thread move ID --to ENV`: move a thread to a linked environment (peerd/handoff/).

Registered as the `thread move` subcommand by `peerd/cli/threads.py`; click and the standard
library only, like every CLI module (start-up stays light)."""

from __future__ import annotations

import time
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import EXIT_TIMED_OUT, complete_thread, exit_code_of_end, json_option_for, with_client
from peerd.cli.output import JsonOutput, emit_json, fields, table
from peerd.core.constants import LONG_POLL_MAX_S
from peerd.core.text import path_segment
from peerd.present import one_line

_OPEN = ("waiting", "moving")


@click.command("move")
@click.argument("thread_id", shell_complete=complete_thread)
@click.option("--to", "to", default=None, help="The linked environment (id or label) to move it to.")
@click.option("--message", default=None, help="What the thread there is told to do next.")
@click.option("--interrupt", is_flag=True, help="Stop the thread's live run first (else a live run refuses).")
@click.option("--dry-run", is_flag=True, help="List the linked environments that can take it, and why not.")
@click.option("--client-request-id", default=None, help="Idempotency key: a retry is the same move.")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds to wait for the move to end (0: print it as started).",
)
@json_option_for("POST /v1/threads/{id}/move")
@click.pass_context
def thread_move(
    ctx: click.Context,
    thread_id: str,
    to: str | None,
    message: str | None,
    interrupt: bool,
    dry_run: bool,
    client_request_id: str | None,
    wait_s: float,
    as_json: JsonOutput | None,
) -> None:
    """Move a thread to a linked environment: its branch's commits, uncommitted edits and new files,
    and the last messages of its conversation; it continues there and ends `moved` here."""
    if not dry_run and to is None:
        raise click.UsageError("Name the environment with --to ENV (or list who can take it with --dry-run).")
    body: dict[str, Any] = {"to": to, "message": message, "clientRequestId": client_request_id}
    body = {k: v for k, v in body.items() if v is not None}
    body.update({"interrupt": interrupt, "dryRun": dry_run})

    def go(client: LocalClient) -> dict[str, Any]:
        answer: dict[str, Any] = client.call("POST", f"/v1/threads/{path_segment(thread_id)}/move", body=body)
        move = answer.get("move")
        deadline = time.monotonic() + wait_s
        while move is not None and move["state"] in _OPEN and time.monotonic() < deadline:
            chunk = min(LONG_POLL_MAX_S, max(0.0, deadline - time.monotonic()))
            move = client.call("GET", f"/v1/moves/{path_segment(move['moveId'])}", params={"wait": chunk})
        return {**answer, "move": move}

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
    elif data.get("candidates") is not None:
        rows = [
            [c["label"], c["environmentId"], "yes" if c["fits"] else "no", c["reason"]]
            for c in data["candidates"]
        ]
        table(["environment", "id", "can take it", "reason"], rows) if rows else click.echo(
            "no linked environments"
        )
    else:
        _print_move(data["move"])
    move = data.get("move")
    if move is not None and move["state"] in ("failed", "cancelled"):
        ctx.exit(exit_code_of_end(move["state"]))  # 5 failed, 6 cancelled
    if move is not None and move["state"] in _OPEN and wait_s > 0:
        ctx.exit(EXIT_TIMED_OUT)


def _print_move(move: dict[str, Any]) -> None:
    there = move.get("movedTo") or {}
    fields(
        [
            ("move", move["moveId"]),
            ("state", move["state"]),
            ("to", move["environmentId"]),
            ("thread there", there.get("threadId")),
            ("branch there", move.get("branchThere")),
            ("kept ref", move.get("keptRef")),
            ("snapshot", move.get("snapshot")),
            ("error", move.get("error")),
        ]
    )
    if move["state"] in _OPEN:
        click.echo(
            one_line("the move goes on in the daemon; run the same command again to wait for it (same move)")
        )


def lineage(t: dict[str, Any]) -> list[tuple[str, Any]]:
    """`thread show`'s lines for a moved thread, both ways (the copy there, or where it came from:
    the moving machine's claim, shown as such)."""
    shown: list[tuple[str, Any]] = []
    if t.get("movedTo"):
        to = t["movedTo"]
        shown.append(("moved to", f"thread {to['threadId']} on {to['environmentId']}"))
    if t.get("movedFrom"):
        origin = t["movedFrom"]
        claimant = t.get("linkLabel") or "its launcher, unverified"
        shown.append(
            (
                "moved from",
                f"thread {origin['threadId']} on {origin['environmentId']} (claimed by {claimant})",
            )
        )
    return shown
