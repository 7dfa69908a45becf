"""Items and events as lines, and following them as they arrive (`--follow`).

Every item or event is one line of readable text (never a Python repr; peer text through
`present.one_line`/`block`), or with `--json` one JSON object per line, flushed as it is printed so
a pipe sees it at once. Following uses only the daemon's long-polls: `GET .../events?after=&timeout=`
wakes when anything happens to the thread, then the new items are read (`afterPosition`) and the
run's state checked (`/wait?timeout=0`). `thread wait --follow` ends when the run ends (exit 0;
4 at its timeout); `thread events --follow` on Ctrl-C (130). A closed pipe (`| head`) ends quietly.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from peerd.cli.client import LocalClient
from peerd.cli.output import JsonOutput, emit_json_line
from peerd.core.constants import LONG_POLL_MAX_S
from peerd.core.text import path_segment
from peerd.present import block, local_time, one_line

EVENTS_PAGE = 100


def whole_item(client: LocalClient, thread_id: str, item: dict[str, Any]) -> dict[str, Any]:
    """The item with its whole text (a long text comes in parts: itemId + textOffset)."""
    text, part = item["text"], item
    while part.get("textTruncated"):
        more = client.call(
            "GET",
            f"/v1/threads/{path_segment(thread_id)}/items",
            params={"itemId": item["id"], "textOffset": part["nextTextOffset"]},
        )
        part = more["items"][0]
        text += part["text"]
    return {**item, "text": text, "textOffset": 0, "textTruncated": False, "nextTextOffset": None}


def items_after(
    client: LocalClient, thread_id: str, after: int | None, *, run_id: str | None = None
) -> list[dict[str, Any]]:
    """Every item after position `after` (None: from the first), texts whole."""
    items: list[dict[str, Any]] = []
    while True:
        page = client.call(
            "GET",
            f"/v1/threads/{path_segment(thread_id)}/items",
            params={"afterPosition": after, "runId": run_id, "limit": 100},
        )
        items += [whole_item(client, thread_id, item) for item in page["items"]]
        if not page["hasMore"]:
            return items
        after = page["nextPosition"]


def item_text(item: dict[str, Any]) -> str:
    """An item as people read it: `[3] assistant message: ...`, a command's output indented."""
    label = str(item["kind"]).replace("_", " ")
    data = item.get("data") or {}
    extra = (
        f"  (exit {one_line(data['exit_code'])})" if item["kind"] == "command" and "exit_code" in data else ""
    )
    text = f"[{one_line(item['position'])}] {label}{extra}: {block(str(item['text']))}"
    if item["kind"] == "command" and data.get("output"):
        text += "\n    " + block(str(data["output"])).rstrip().replace("\n", "\n    ")
    return text


def _pairs(data: dict[str, Any]) -> str:
    return ", ".join(f"{one_line(k)}={one_line(v)}" for k, v in data.items())


def event_summary(event: dict[str, Any]) -> str:
    """What an event says, in words: `run run_1 completed (#2)`, `assistant_message item #4 ...`."""
    kind, data = str(event["type"]), dict(event.get("data") or {})
    if kind == "run.updated" and "runId" in data:
        number = f" (#{one_line(data['number'])})" if data.get("number") is not None else ""
        reason = f": {one_line(data['reason'])}" if data.get("reason") else ""
        return f"run {one_line(data['runId'])} {one_line(data.get('status'))}{number}{reason}"
    if kind == "item.added" and "kind" in data:
        return f"{one_line(data['kind'])} item #{one_line(data.get('position'))} in run {one_line(data.get('runId'))}"
    if kind == "task.updated" and "taskId" in data:
        return f"task {one_line(data['taskId'])} {one_line(data.get('status'))}"
    if kind == "thread.created":
        return f"thread {one_line(data.get('threadId'))} created"
    return _pairs(data)


def event_line(event: dict[str, Any]) -> str:
    """One event on one line: `12  14:03:07 CEST  run.updated  run run_1 completed`."""
    when = local_time(event.get("createdAt"))
    return f"{one_line(event['seq'])}  {when}  {one_line(event['type'])}  {event_summary(event)}"


def say(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()


@contextmanager
def to_a_pipe() -> Iterator[None]:
    """A reader that went away (`| head -3`) ends the stream without a traceback."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail too
        sys.exit(0)


def events_page(client: LocalClient, thread_id: str, after: int, timeout: float) -> dict[str, Any]:
    params = {"after": after, "timeout": min(timeout, LONG_POLL_MAX_S), "limit": EVENTS_PAGE}
    page: dict[str, Any] = client.call("GET", f"/v1/threads/{path_segment(thread_id)}/events", params=params)
    return page


def follow_events(client: LocalClient, thread_id: str, after: int, as_json: JsonOutput | None) -> None:
    """Print the events after `after`, then each one as it arrives, until Ctrl-C."""
    with to_a_pipe():
        while True:
            page = events_page(client, thread_id, after, LONG_POLL_MAX_S)
            for event in page["events"]:
                emit_json_line(event, as_json) if as_json else say(event_line(event))
            after = int(page["nextCursor"])


def _settled(client: LocalClient, thread_id: str, run_id: str | None) -> dict[str, Any]:
    result: dict[str, Any] = client.call(
        "GET", f"/v1/threads/{path_segment(thread_id)}/wait", params={"run": run_id, "timeout": 0}
    )
    return result


def follow_run(
    client: LocalClient, thread_id: str, run_id: str | None, seconds: float, as_json: JsonOutput | None
) -> dict[str, Any]:
    """Print the run's items, then each new one as it arrives, until the run ends (or `seconds`
    pass); returns the last wait answer (`terminal` false at the timeout).

    The event cursor is taken before the items are read and the run's state after it, so an item
    or an end that comes in between wakes the next long-poll at once: nothing is missed or late."""
    deadline = time.monotonic() + seconds
    page = events_page(client, thread_id, 0, 0.0)
    while len(page["events"]) == EVENTS_PAGE:  # catch up with the thread's history, not waiting
        page = events_page(client, thread_id, int(page["nextCursor"]), 0.0)
    cursor = int(page["nextCursor"])
    state = _settled(client, thread_id, run_id)
    run_id = run_id or state["runId"]
    position = None
    with to_a_pipe():
        while True:
            for item in items_after(client, thread_id, position, run_id=run_id):
                emit_json_line(item, as_json) if as_json else say(item_text(item))
                position = int(item["position"])
            if state["terminal"] or time.monotonic() >= deadline:
                return state
            page = events_page(client, thread_id, cursor, max(0.0, deadline - time.monotonic()))
            cursor = int(page["nextCursor"])
            state = _settled(client, thread_id, run_id)
