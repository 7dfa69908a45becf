"""`peerd approval ...`: the guarded actions runs at approval-required ask a person about, here and
on linked boxes (for the work this machine started there), and deciding them.

Everything an approval shows came from a run (the command line, a file's diff, a tool's
arguments: the model chose them), so every value goes through `present.one_line` or `block`. A
decision carries a fresh `decisionId`: the daemon (or the box, when the approval waits there)
answers a retry of it as the first, and a second, different decision is `approval_decided`.
`watch` long-polls the pending set's hash (`changedFrom`), so it wakes when one arrives or leaves.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import (
    ALL_ENVS,
    cli_context,
    complete_approval,
    complete_env,
    fleet_of,
    json_option,
    json_option_for,
    with_client,
)
from peerd.cli.output import (
    JsonOutput,
    PeerdGroup,
    emit_ids,
    emit_json,
    emit_json_line,
    fields,
    quiet_option,
    table,
)
from peerd.cli.stream import to_a_pipe
from peerd.clientwire import DaemonConnectionError
from peerd.core.text import path_segment
from peerd.errors import ApprovalNotFound, DaemonNotRunning, ShuttingDown
from peerd.present import ago, block, one_line, when

PATH = "/v1/approvals"
DECIDE = "POST /v1/approvals/{id}/decision"
WATCH_TIMEOUT_S = 50.0  # the daemon's long-poll bound (contracts.LONG_POLL_MAX_S)
RECONNECT_TRIES = 3  # a dropped long-poll is tried again this often before it is an error
RECONNECT_PAUSE_S = 0.5

Json = dict[str, Any]


@click.group(cls=PeerdGroup)
def approval() -> None:
    """Approvals: actions of runs at approval-required that wait for a person's yes or no."""


def where(view: Json) -> str:
    """`here`, `here for <laptop>` on the box for a linked machine's work, or `on <box>` for an
    approval that waits on a linked box."""
    if view.get("onBox"):
        return f"on {view.get('environmentLabel') or view.get('environmentId')}"
    if view.get("linkLabel"):
        return f"here for {view['linkLabel']}"
    return "here"


def stale_note(stale: list[str]) -> str | None:
    if not stale:
        return None
    boxes = ", ".join(one_line(s) for s in stale)
    return f"{'box' if len(stale) == 1 else 'boxes'} {boxes} not reached: last known shown"


@approval.command("list")
@click.option("--all", "everything", is_flag=True, help="Decided and expired ones too, newest first.")
@click.option(
    "--limit", type=click.IntRange(1, 500), default=100, show_default=True, help="At most this many (--all)."
)
@click.option(
    "--env",
    "machine",
    metavar="ENV",
    default=ALL_ENVS,
    show_default=True,
    shell_complete=complete_env,
    help="Only the approvals of this machine: `here`, or a linked one's label or id.",
)
@json_option
@quiet_option
@click.pass_context
def approval_list(
    ctx: click.Context, everything: bool, limit: int, machine: str, as_json: JsonOutput | None, quiet: bool
) -> None:
    """List the approvals waiting for you, here and on linked boxes (--all: decided ones too)."""
    params = {"all": everything, "limit": limit}

    def go(client: LocalClient) -> tuple[Json, list[tuple[str | None, str]]]:
        fleet = [] if machine in (ALL_ENVS, "here") else fleet_of(client)
        return client.call("GET", PATH, params=params), fleet

    page, fleet = with_client(ctx, go)
    items: list[Json] = page["items"]
    if machine == "here":
        items = [v for v in items if not v.get("onBox")]
    elif machine != ALL_ENVS:
        named = [env_id for env_id, label in fleet if env_id is not None and machine in (env_id, label)]
        if not named:
            linked = ", ".join(label for env_id, label in fleet if env_id is not None) or "none"
            raise click.BadParameter(
                f"no linked machine is named {machine!r} (linked: {linked}); or give `here` or `all`.",
                param_hint="'--env'",
            )
        items = [v for v in items if v.get("onBox") and v.get("environmentId") == named[0]]
    if quiet:
        emit_ids(items, "id")
    elif as_json:
        emit_json(items, as_json)
    else:
        table(
            ["id", "where", "what", "thread", "asked", "deadline", "status"],
            [
                [
                    v["id"],
                    where(v),
                    v["summary"][:60],
                    v["threadId"],
                    ago(v["createdAt"]),
                    ago(v["deadlineAt"]) if v["status"] == "pending" else "",
                    v["status"],
                ]
                for v in items
            ],
        )
    note = stale_note(page.get("stale") or [])
    if note:
        click.echo(f"({note})", err=bool(as_json or quiet))


# --- show --------------------------------------------------------------------------------------


def pretty(value: Any) -> str:
    return block(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))


def indented(text: str) -> str:
    return "    " + block(text).rstrip("\n").replace("\n", "\n    ")


def detail_text(view: Json) -> str:
    """The exact action, as a person reads it before deciding."""
    detail: Json = view.get("detail") or {}
    kind = view.get("kind")
    lines: list[str] = []
    if kind == "command":
        lines += [f"command  {one_line(detail.get('command'))}", f"cwd      {one_line(detail.get('cwd'))}"]
        rest = {k: v for k, v in detail.items() if k not in ("command", "cwd")}
        if rest:
            lines += ["also", indented(pretty(rest))]
    elif kind == "file_change":
        for each in detail.get("changes") or []:
            change = each if isinstance(each, dict) else {"path": each}
            lines.append(
                f"file     {one_line(change.get('path'))} ({one_line(change.get('kind') or 'update')})"
            )
            for key in ("diff", "content", "old", "new"):
                if change.get(key) is not None:
                    lines += [f"  {key}:", indented(str(change[key]))]
        rest = {k: v for k, v in detail.items() if k != "changes"}
        if rest:
            lines += ["also", indented(pretty(rest))]
    elif kind == "mcp_tool":
        lines += [
            f"server   {one_line(detail.get('server'))}",
            f"tool     {one_line(detail.get('tool'))}",
            "arguments",
            indented(pretty(detail.get("arguments") or {})),
        ]
    else:
        lines += ["input", indented(pretty(detail.get("input", detail)))]
    return "\n".join(lines)


def decision_of(view: Json) -> str | None:
    if view["status"] == "pending":
        return None
    scope = {"run": " (for the rest of this run)", "command": " (for this command in this run)"}
    text = f"{view['status']} by {one_line(view.get('decidedBy'))}{scope.get(view.get('scope') or '', '')}"
    return text + (f": {one_line(view['reason'])}" if view.get("reason") else "")


@approval.command("show")
@click.argument("approval_id", shell_complete=complete_approval)
@json_option
@click.pass_context
def approval_show(ctx: click.Context, approval_id: str, as_json: JsonOutput | None) -> None:
    """Show one approval: the exact action (command line, file diffs, tool arguments), who asks."""
    view: Json = with_client(ctx, lambda client: client.call("GET", f"{PATH}/{path_segment(approval_id)}"))
    if as_json:
        emit_json(view, as_json)
        return
    fields(
        [
            ("approval", view["id"]),
            ("status", view["status"]),
            ("where", where(view)),
            ("what", view["summary"]),
            ("kind", f"{view['kind']} ({one_line(view['tool'])})"),
            ("thread", view["threadId"]),
            ("run", view["runId"]),
            *(
                [("asked by", f"linked machine {one_line(view['linkLabel'])}")]
                if view.get("linkLabel")
                else []
            ),
            *([("parent task", view["parentTaskId"])] if view.get("parentTaskId") else []),
            *([("parent thread", view["parentThreadId"])] if view.get("parentThreadId") else []),
            ("asked", when(view["createdAt"])),
            ("deadline", when(view["deadlineAt"])),
            *(
                [("decision", decision_of(view)), ("decided", when(view.get("decidedAt")))]
                if decision_of(view)
                else []
            ),
        ]
    )
    click.echo(f"\n{detail_text(view)}")


# --- approve / deny ----------------------------------------------------------------------------


def decide(ctx: click.Context, approval_id: str, body: Json) -> Json:
    """Send one decision with a fresh decision id (a retry of it is answered as the first)."""
    body = {**body, "decisionId": uuid.uuid4().hex}
    path = f"{PATH}/{path_segment(approval_id)}/decision"
    view: Json = with_client(ctx, lambda client: client.call("POST", path, body=body))
    return view


def decided_line(view: Json) -> str:
    verb = "Approved" if view["status"] == "approved" else "Denied"
    scope = {"run": " for the rest of its run", "command": " for this command in its run"}
    box = f" on {one_line(view.get('environmentLabel'))}" if view.get("onBox") else ""
    return f"{verb}{scope.get(view.get('scope') or '', '')}: {one_line(view['summary'])} ({view['id']}{box})"


@approval.command("approve")
@click.argument("approval_id", shell_complete=complete_approval)
@click.option(
    "--always-for-this-run", "for_run", is_flag=True, help="Approve every later question of the same run too."
)
@click.option(
    "--always-for-this-command",
    "for_command",
    is_flag=True,
    help="Approve the same action (the same tool with the same exact input) again in the same run.",
)
@json_option_for(DECIDE)
@click.pass_context
def approval_approve(
    ctx: click.Context, approval_id: str, for_run: bool, for_command: bool, as_json: JsonOutput | None
) -> None:
    """Approve: the run goes on with the action it asked about."""
    if for_run and for_command:
        raise click.UsageError(
            "Give --always-for-this-run or --always-for-this-command, not both; nothing was sent."
        )
    scope = "run" if for_run else "command" if for_command else "once"
    view = decide(ctx, approval_id, {"decision": "approve", "scope": scope})
    emit_json(view, as_json) if as_json else click.echo(decided_line(view))


@approval.command("deny")
@click.argument("approval_id", shell_complete=complete_approval)
@click.option("--reason", default=None, help="Why: the model is told (at most 2000 characters).")
@json_option_for(DECIDE)
@click.pass_context
def approval_deny(
    ctx: click.Context, approval_id: str, reason: str | None, as_json: JsonOutput | None
) -> None:
    """Deny: the action does not happen, and the model is told (with --reason, why)."""
    body: Json = {"decision": "deny"}
    if reason:
        body["reason"] = reason
    view = decide(ctx, approval_id, body)
    emit_json(view, as_json) if as_json else click.echo(decided_line(view))


# --- watch -------------------------------------------------------------------------------------


def key_of(view: Json) -> str:
    return f"{view.get('environmentId') or ''}/{view['id']}"


def asked_line(view: Json) -> str:
    deadline = ago(view["deadlineAt"])
    return (
        f"asked     {view['id']}  {where(view)}  {one_line(view['summary'])}  "
        f"(thread {one_line(view['threadId'])}, deadline {deadline})"
    )


def left_line(view: Json) -> str:
    outcome = decision_of(view) or "no longer pending"
    return f"{outcome}: {view['id']}  {where(view)}  {one_line(view['summary'])}"


class Watch:
    """`peerd approval watch`: what is pending, then each change of the pending set as it happens."""

    def __init__(self, client: LocalClient, as_json: JsonOutput | None, *, bell: bool) -> None:
        self.client = client
        self.as_json = as_json
        self.bell = bell
        self.seen: dict[str, Json] = {}
        self.stale: list[str] = []

    def say(self, event: str, view: Json, text: str) -> None:
        if self.as_json:
            emit_json_line(
                {
                    "event": event,
                    "approval": view
                    if self.as_json.fields is None
                    else {f: view.get(f) for f in self.as_json.fields},
                }
            )
            return
        click.echo(f"{time.strftime('%H:%M:%S')}  {text}{chr(7) if self.bell and event == 'asked' else ''}")
        sys.stdout.flush()

    def outcome(self, view: Json) -> Json:
        """What became of an approval that left the pending set (its last known view if not told)."""
        try:
            found: Json = self.client.call("GET", f"{PATH}/{path_segment(view['id'])}")
        except ApprovalNotFound:
            return view
        return found if found.get("status") != "pending" else view

    def apply(self, page: Json) -> None:
        current = {key_of(v): v for v in page["items"] if v["status"] == "pending"}
        for key, view in current.items():
            if key not in self.seen:
                self.say("asked", view, asked_line(view))
        for key, view in self.seen.items():
            if key not in current:
                gone = self.outcome(view)
                self.say("left", gone, left_line(gone))
        self.seen = current
        stale = list(page.get("stale") or [])
        if stale != self.stale and not self.as_json:
            note = stale_note(stale)
            click.echo(f"{time.strftime('%H:%M:%S')}  ({note or 'every linked box reached again'})")
        self.stale = stale

    def run(self) -> None:
        hash_: str | None = None
        tries = 0
        while True:
            params = {} if hash_ is None else {"changedFrom": hash_, "timeout": WATCH_TIMEOUT_S}
            try:
                page: Json = self.client.call("GET", PATH, params=params)
            except DaemonConnectionError:
                tries += 1  # a long-poll cut short (the daemon stopping): the next call says why
                if tries > RECONNECT_TRIES:
                    raise
                time.sleep(RECONNECT_PAUSE_S)
                continue
            tries = 0
            self.apply(page)
            hash_ = page["pendingHash"]


@approval.command("watch")
@json_option
@click.pass_context
def approval_watch(ctx: click.Context, as_json: JsonOutput | None) -> None:
    """Print each approval as it is asked (a bell on a terminal) and as it leaves, until Ctrl-C."""

    def go(client: LocalClient) -> None:
        try:
            with to_a_pipe():
                Watch(client, as_json, bell=sys.stdout.isatty()).run()
        except KeyboardInterrupt:
            return  # Ctrl-C ends a watch: nothing went wrong
        except ShuttingDown:  # the daemon is stopping: the watch ends as if it were not running
            raise DaemonNotRunning.at(
                cli_context(ctx).paths.socket
            ) from None  # it stopped: as for any command

    with_client(ctx, go)
