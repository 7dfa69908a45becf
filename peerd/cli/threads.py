"""`peerd thread ...`: launch agent conversations, follow their runs, read what they did."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.common import (
    ALL_ENVS,
    ENV_META,
    PAGE,
    approval_line,
    complete_thread,
    confirm,
    env_option,
    exit_code_of_wait,
    fleet_of,
    json_option,
    json_option_for,
    waiting_field,
    with_client,
    yes_option,
)
from peerd.cli.handoff import lineage as move_lineage
from peerd.cli.handoff import thread_move
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
from peerd.cli.stream import event_summary, follow_events, follow_run, item_text, items_after
from peerd.core.constants import INTERACTION_MODES, LONG_POLL_MAX_S, RUNTIME_MODES
from peerd.core.text import path_segment
from peerd.errors import PeerdError
from peerd.present import ago, one_line, when

# A run in one of these may be waiting for a person (only a live run asks).
LIVE_RUN = ("queued", "starting", "running")


@click.group(cls=PeerdGroup)
def thread() -> None:
    """Threads: agent conversations, each in its own git worktree."""


def on_its_machine(client: LocalClient, given: str, *, shown: dict[str, Any] | None = None) -> str:
    """The whole id of the thread `given` names (an id or a unique start of one), with `client`
    pointed at the machine it lives on: here, or the linked machine this one launched, placed,
    delegated or moved it to, or that has it when asked (`GET /v1/threads/{id}/where`). `--env`
    names the machine itself and skips the lookup. Says on stderr when it goes elsewhere (`shown`:
    into that record instead, as `on`)."""
    if client.environment_id is not None:
        if shown is not None:
            shown["on"] = client.environment_id
        return given
    where = client.call("GET", f"/v1/threads/{path_segment(given)}/where")
    if where["environmentId"] is not None:
        client.environment_id = where["environmentId"]
        machine = where["label"] or where["environmentId"]
        if shown is not None:
            shown["on"] = machine
        else:
            click.echo(f"thread {where['threadId']} is on {machine}", err=True)
    return str(where["threadId"])


def wait_for_run(client: LocalClient, thread_id: str, run_id: str | None, seconds: float) -> dict[str, Any]:
    """Wait up to `seconds`, as a loop of long-polls of at most 50 s each; a run that did not
    complete comes back with its `reason` (why it failed or was interrupted)."""
    deadline = time.monotonic() + seconds
    while True:
        chunk = max(0.0, min(LONG_POLL_MAX_S, deadline - time.monotonic()))
        result: dict[str, Any] = client.call(
            "GET", f"/v1/threads/{path_segment(thread_id)}/wait", params={"run": run_id, "timeout": chunk}
        )
        run_id = run_id or result["runId"]  # later chunks stay pinned to the run the first one saw
        if result["terminal"] or time.monotonic() >= deadline:
            if result["terminal"] and result["status"] != "completed" and result["runId"]:
                thread = client.call("GET", f"/v1/threads/{path_segment(thread_id)}")
                latest = thread.get("latestRun") or {}
                if latest.get("id") == result["runId"]:
                    result["reason"] = latest.get("reason")
            return result


BUDGET_KEYS = {"tokens": int, "usd": float, "seconds": float}


def budget_option(text: str, flag: str = "--budget") -> dict[str, float | int]:
    """`--budget`'s LIMITS, with the option named in the usage error."""
    try:
        return parse_budget(text)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{flag}'") from None


def parse_budget(text: str) -> dict[str, float | int]:
    """`tokens=50000,usd=2,seconds=600` (any of them) as the API's budget object."""
    limits: dict[str, float | int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        kind = BUDGET_KEYS.get(key.strip())
        if not sep or kind is None:
            raise click.BadParameter(f"{part!r}: write LIMIT=VALUE with LIMIT one of tokens, usd, seconds.")
        try:
            number = kind(value.strip())
        except ValueError:
            raise click.BadParameter(f"{part!r}: {value.strip()!r} is not a number.") from None
        if not number > 0 or number == float("inf"):
            raise click.BadParameter(f"{part!r}: a limit must be a positive number.")
        limits[key.strip()] = number
    if not limits:
        raise click.BadParameter("give at least one limit, e.g. tokens=50000.")
    return limits


def _why(wait: dict[str, Any]) -> str:
    return f": {wait['reason']}" if wait.get("reason") else ""


@thread.command("launch")
@env_option
@click.option("--project", "project_id", required=True, help="Project id or name.")
@click.option("--provider", default="script", show_default=True, help="Which coder runs the thread.")
@click.option("--prompt", default=None, help="The first message ('-' reads standard input).")
@click.option("--prompt-file", type=click.File("r"), default=None, help="Read the first message from a file.")
@click.option("--title", default=None)
@click.option("--model", default=None)
@click.option(
    "--runtime-mode", type=click.Choice(RUNTIME_MODES), default=None, help="Access level of the run."
)
@click.option("--interaction-mode", type=click.Choice(INTERACTION_MODES), default=None)
@click.option("--client-request-id", default=None, help="Idempotency key: a retry returns the same thread.")
@click.option("--in-place", is_flag=True, help="Work in the project checkout itself, not a new worktree.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=None,
    help="Wait up to this many seconds for the run; exit 0 only if it completed (see `thread wait`).",
)
@click.option(
    "--budget",
    "budget",
    default=None,
    metavar="LIMITS",
    help="Stop the run past any of these limits, e.g. tokens=50000,usd=2,seconds=600.",
)
@json_option_for("POST /v1/threads", "wait")
@click.pass_context
def thread_launch(
    ctx: click.Context,
    project_id: str,
    provider: str,
    prompt: str | None,
    prompt_file: Any,
    title: str | None,
    model: str | None,
    runtime_mode: str | None,
    interaction_mode: str | None,
    client_request_id: str | None,
    in_place: bool,
    wait_s: float | None,
    budget: str | None,
    as_json: JsonOutput | None,
) -> None:
    """Launch a thread in a project with a first message (`--env auto`: peerd picks the machine)."""
    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("Give exactly one of --prompt and --prompt-file.")
    text = prompt_file.read() if prompt_file is not None else prompt
    if text == "-":
        text = sys.stdin.read()
    body = {
        "projectId": project_id,
        "provider": provider,
        "prompt": text,
        "title": title,
        "model": model,
        "runtimeMode": runtime_mode,
        "interactionMode": interaction_mode,
        "clientRequestId": client_request_id,
        "inPlace": in_place,
        "budget": None if budget is None else budget_option(budget),
    }

    def go(client: LocalClient) -> dict[str, Any]:
        launched: dict[str, Any] = client.call(
            "POST", "/v1/threads", body={k: v for k, v in body.items() if v is not None}
        )
        if launched.get("placement"):  # --env auto: the rest goes where it was placed
            client.environment_id = launched["placement"]["environmentId"]
        if wait_s is not None:
            launched["wait"] = wait_for_run(client, launched["threadId"], launched["runId"], wait_s)
        return launched

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
    else:
        note = " (an earlier launch with this key)" if data["replayed"] else ""
        click.echo(one_line(f"thread {data['threadId']} run {data['runId']} {data['status']}{note}"))
        click.echo(one_line(f"worktree {data['worktreePath']}"))
        if data.get("placement"):
            click.echo(one_line(f"placed on {data['placement']['reason']}"))
        if "wait" in data:
            click.echo(one_line(f"run {data['wait']['runId']} {data['wait']['status']}{_why(data['wait'])}"))
            if waiting := data["wait"].get("awaitingApproval"):
                click.echo(one_line(approval_line(waiting)))
    if "wait" in data:
        ctx.exit(exit_code_of_wait(data["wait"]))


@thread.command("list")
@env_option
@click.option("--project", "project_id", default=None, help="Only this project's threads.")
@click.option("--all", "include_archived", is_flag=True, help="Include archived threads.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=100, show_default=True, help="At most this many (0: all)."
)
@json_option
@quiet_option
@click.pass_context
def thread_list(
    ctx: click.Context,
    project_id: str | None,
    include_archived: bool,
    limit: int,
    as_json: JsonOutput | None,
    quiet: bool,
) -> None:
    """List threads, newest first (`thread list -q | head -1` is the latest). `--env all`: here and
    on every linked machine, with an ON column (a machine that cannot answer is named on stderr)."""
    fleet = ctx.meta.get(ENV_META) == ALL_ENVS
    if fleet:
        ctx.meta.pop(ENV_META)

    def one(client: LocalClient) -> list[Any]:
        items: list[Any] = []
        cursor = None
        while True:
            want = PAGE if limit == 0 else min(PAGE, limit - len(items))
            params = {
                "projectId": project_id,
                "includeArchived": include_archived,
                "cursor": cursor,
                "limit": want,
                "order": "newest",
            }
            page = client.call("GET", "/v1/threads", params=params)
            items.extend(page["items"])
            cursor = page["nextCursor"]
            if cursor is None or (limit and len(items) >= limit):
                return items

    def go(client: LocalClient) -> list[Any]:
        listed = everything(client)
        # A question waiting for you marks its thread (here or on a box). Only a live run asks: with
        # none listed, the second request is not made (an empty list answers in one round trip).
        live = any((t["latestRun"] or {}).get("status") in LIVE_RUN for t in listed)
        if live and not quiet and not as_json:
            client.environment_id = None
            asking = {v["threadId"]: v["id"] for v in client.call("GET", "/v1/approvals")["items"]}
            for t in listed:
                if t["id"] in asking:
                    t["asking"] = asking[t["id"]]
        return listed

    def everything(client: LocalClient) -> list[Any]:
        if not fleet:
            return one(client)
        everywhere: list[Any] = []
        for env_id, label in fleet_of(client):
            client.environment_id = env_id
            try:
                everywhere += [{**t, "on": label} for t in one(client)]
            except PeerdError as exc:
                if env_id is None:
                    raise
                click.echo(one_line(f"{label}: not listed ({exc.code}: {exc.message})"), err=True)
        everywhere.sort(key=lambda t: (t["createdAt"], t["id"]), reverse=True)
        return everywhere[:limit] if limit else everywhere

    items = with_client(ctx, go)
    if quiet:
        emit_ids(items, "id")
        return
    if as_json:
        emit_json(items, as_json)
        return
    rows = []
    for t in items:
        run = t["latestRun"] or {}
        status = f"{t['status']}, waiting for your approval ({t['asking']})" if "asking" in t else t["status"]
        row = [t["id"], t["title"][:40], t["provider"], t["runtimeMode"], run.get("status"), status]
        rows.append([*row[:1], t["on"], *row[1:]] if fleet else row)
    heads = ["id", "title", "provider", "mode", "last run", "status"]
    table([*heads[:1], "on", *heads[1:]] if fleet else heads, rows)


@thread.command("show")
@env_option
@click.argument("thread_id", shell_complete=complete_thread)
@click.option("--run", "run_id", default=None, help="Only this run's items.")
@json_option
@click.pass_context
def thread_show(ctx: click.Context, thread_id: str, run_id: str | None, as_json: JsonOutput | None) -> None:
    """Show a thread and its items (long texts read whole)."""

    def go(client: LocalClient) -> dict[str, Any]:
        shown: dict[str, Any] = {"on": None}  # None: here
        whole = on_its_machine(client, thread_id, shown=shown)
        info = client.call("GET", f"/v1/threads/{path_segment(whole)}")
        shown |= {"thread": info, "items": items_after(client, whole, None, run_id=run_id)}
        latest = info.get("latestRun") or {}
        if latest.get("status") in LIVE_RUN:  # a question waiting for you?
            now = client.call("GET", f"/v1/threads/{path_segment(info['id'])}/wait", params={"timeout": 0})
            shown["awaitingApproval"] = now.get("awaitingApproval")
        return shown

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
        return
    t = data["thread"]
    run = t["latestRun"] or {}
    waiting = data.get("awaitingApproval")
    fields(
        [
            ("thread", t["id"]),
            ("on", data.get("on")),
            ("title", t["title"]),
            ("project", t["projectId"]),
            ("provider", f"{t['provider']}{' / ' + t['model'] if t['model'] else ''}"),
            ("modes", f"{t['runtimeMode']}, {t['interactionMode']}"),
            ("worktree", f"{t['worktreePath']}{' (in place)' if t['inPlace'] else ''}"),
            ("branch", t["branch"]),
            ("status", t["status"] + (", queue held" if t["queueHeld"] else "")),
            ("last run", f"{run.get('id')} #{run.get('number')} {run.get('status')}" if run else "none"),
            ("waiting for", waiting_field(waiting)),
            ("reason", run.get("reason")),
            ("run usage", _usage(run.get("usage")) if run else None),
            ("thread usage", _usage(t.get("usage"))),
            ("updated", when(t["updatedAt"])),
            ("placement", t.get("placement")),
            *_lineage(t),
            *move_lineage(t),
        ]
    )
    click.echo("")
    for item in data["items"]:
        click.echo(item_text(item))


def _usage(wire: dict[str, Any] | None) -> str:
    """A usage object of the API as one line ("unknown" when the provider reported none)."""
    from peerd.core.usage import Usage, describe  # noqa: PLC0415  # show only: CLI start-up

    return describe(None if wire is None else Usage.from_json(wire))


def _lineage(t: dict[str, Any]) -> list[tuple[str, Any]]:
    """Where a thread came from: a subagent's parent on the machine that delegated to this one.

    `delegatedFrom` is what the launching link said, so it is shown as that link's claim, never
    as fact; only the link itself (`linkLabel`) is known here."""
    origin = t.get("delegatedFrom")
    if origin:
        claimant = t.get("linkLabel") or "its launcher, unverified"
        return [("subagent of", f"thread {origin['threadId']} (claimed by {claimant})")]
    if t.get("linkLabel"):
        return [("started by", f"link {t['linkLabel']}")]
    kind, _, ref = str(t.get("startedBy") or "").partition(":")
    starters = {
        "run": "an agent's tool call in run",
        "task": "a task delegated by thread",
        "orchestrate": "orchestration",
    }
    if kind in starters and ref:
        return [("started by", f"{starters[kind]} {ref}")]
    return []


@thread.command("send")
@env_option
@click.argument("thread_id", shell_complete=complete_thread)
@click.argument("text")
@click.option("--client-request-id", default=None, help="Idempotency key: a retry returns the same run.")
@json_option_for("POST /v1/threads/{id}/runs")
@click.pass_context
def thread_send(
    ctx: click.Context, thread_id: str, text: str, client_request_id: str | None, as_json: JsonOutput | None
) -> None:
    """Send a message: a new run, queued while another is live. Releases a held queue."""
    body = {"text": text, "clientRequestId": client_request_id}

    def go(client: LocalClient) -> Any:
        return client.call(
            "POST",
            f"/v1/threads/{path_segment(on_its_machine(client, thread_id))}/runs",
            body={k: v for k, v in body.items() if v is not None},
        )

    data = with_client(ctx, go)
    emit_json(data, as_json) if as_json else click.echo(one_line(f"run {data['runId']} {data['status']}"))


@thread.command("wait")
@env_option
@click.argument("thread_id", shell_complete=complete_thread)
@click.option("--run", "run_id", default=None, help="The run to wait for (default: the latest).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds to wait in all.",
)
@click.option(
    "--follow", "-f", is_flag=True, help="Print the run's items as they arrive (--json: one object per line)."
)
@json_option
@click.pass_context
def thread_wait(
    ctx: click.Context,
    thread_id: str,
    run_id: str | None,
    timeout: float,
    follow: bool,
    as_json: JsonOutput | None,
) -> None:
    """Wait for a run to end. Exits 0 only if it completed: 5 failed, 6 interrupted or cancelled,
    7 still live waiting for your approval, 4 still live at the timeout. With --follow, print its
    items as they arrive, then how it ended."""

    def go(client: LocalClient) -> dict[str, Any]:
        whole = on_its_machine(client, thread_id)
        if follow:
            ended = follow_run(client, whole, run_id, timeout, as_json)
            return wait_for_run(client, whole, ended["runId"], 0.0)  # with the reason
        return wait_for_run(client, whole, run_id, timeout)

    data = with_client(ctx, go)
    if as_json and follow:
        emit_json_line(data)  # the stream's last line: how the run ended
    elif as_json:
        emit_json(data, as_json)
    else:
        live = "" if data["terminal"] else " (still live: timed out)"
        click.echo(one_line(f"run {data['runId']} {data['status']}{live}{_why(data)}"))
        if waiting := data.get("awaitingApproval"):
            click.echo(one_line(approval_line(waiting)))
    ctx.exit(exit_code_of_wait(data))


@thread.command("interrupt")
@env_option
@click.argument("thread_id", shell_complete=complete_thread)
@click.option("--stop", is_flag=True, help="Also hold the queue: nothing queued starts until the next send.")
@click.option("--reason", default=None, help="Why (recorded on the run).")
@json_option_for("POST /v1/threads/{id}/interrupt")
@click.pass_context
def thread_interrupt(
    ctx: click.Context, thread_id: str, stop: bool, reason: str | None, as_json: JsonOutput | None
) -> None:
    """Interrupt the live run (signals the provider's whole process group)."""

    def go(client: LocalClient) -> Any:
        body = {"stop": stop, **({"reason": reason} if reason else {})}
        return client.call(
            "POST", f"/v1/threads/{path_segment(on_its_machine(client, thread_id))}/interrupt", body=body
        )

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
    else:
        held = ", queue held" if data["queueHeld"] else ""
        run = f" (run {data['runId']})" if data["runId"] else ""
        click.echo(one_line(f"{data['status'].replace('_', ' ')}{run}{held}"))


@thread.command("archive")
@click.argument("thread_id", shell_complete=complete_thread)
@click.option(
    "--force", is_flag=True, help="Also when its worktree has uncommitted or untracked files (they are lost)."
)
@click.option(
    "--delete-branch", is_flag=True, help="Delete the thread's own branch too (its commits are lost)."
)
@yes_option
@json_option_for("POST /v1/threads/{id}/archive")
@click.pass_context
def thread_archive(
    ctx: click.Context,
    thread_id: str,
    force: bool,
    delete_branch: bool,
    yes: bool,
    as_json: JsonOutput | None,
) -> None:
    """Archive a thread and remove its worktree (its branch is kept unless --delete-branch). A
    worktree with uncommitted or untracked files is refused (`worktree_dirty`, naming them) unless
    --force."""
    also = " and delete its branch" if delete_branch else ""
    confirm(yes, f"Archive {thread_id}, remove its worktree{also}?")
    body = {"force": force, "deleteBranch": delete_branch}

    def go(client: LocalClient) -> Any:
        whole = on_its_machine(client, thread_id)
        return client.call("POST", f"/v1/threads/{path_segment(whole)}/archive", body=body)

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
        return
    removed = "; worktree removed" if data["worktreeRemoved"] else ""
    deleted = "; branch deleted" if data.get("branchDeleted") else ""
    click.echo(f"archived {data['threadId']}{removed}{deleted}")
    if data.get("discarded"):
        click.echo(f"discarded {len(data['discarded'])} uncommitted or untracked file(s)")


@thread.command("events")
@env_option
@click.argument("thread_id", shell_complete=complete_thread)
@click.option("--after", type=int, default=0, show_default=True, help="Cursor: the last event seen.")
@click.option("--timeout", type=float, default=0.0, help="Long-poll up to this many seconds (max 50).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they arrive, until Ctrl-C.")
@json_option
@click.pass_context
def thread_events(
    ctx: click.Context, thread_id: str, after: int, timeout: float, follow: bool, as_json: JsonOutput | None
) -> None:
    """Print the thread's events after a cursor, one line each (--follow: as they arrive;
    --follow --json: one JSON object per line)."""
    if follow:
        with_client(
            ctx, lambda client: follow_events(client, on_its_machine(client, thread_id), after, as_json)
        )
        return

    def go(client: LocalClient) -> Any:
        params = {"after": after, "timeout": min(timeout, LONG_POLL_MAX_S)}
        whole = on_its_machine(client, thread_id)
        return client.call("GET", f"/v1/threads/{path_segment(whole)}/events", params=params)

    data = with_client(ctx, go)
    if as_json:
        emit_json(data, as_json)
        return
    table(
        ["seq", "time", "type", "what"],
        [[e["seq"], ago(e["createdAt"]), e["type"], event_summary(e)] for e in data["events"]],
    )
    click.echo(f"next cursor: {data['nextCursor']}")


thread.add_command(thread_move)  # `peerd thread move` (peerd/cli/handoff.py)
