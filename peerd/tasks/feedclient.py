"""The follower's calls to the box, as request bodies and answers: the change feed's subscription
and poll (`peerd.tasks.feedwire`), how an older box without it is told apart, and the settled
run's reply, read whole."""

from __future__ import annotations

from typing import Any

from peerd.core.text import path_segment
from peerd.errors import NotFound, PeerdError, Unavailable
from peerd.peer.forwarding import Forwarder
from peerd.tasks.actions import Poll, ReadResult
from peerd.tasks.subscription import Delta


def subscription_body(delta: Delta) -> dict[str, Any]:
    body: dict[str, Any] = {"setHash": delta.set_hash}
    if delta.add:
        body["add"] = list(delta.add)
    if delta.remove:
        body["remove"] = list(delta.remove)
    if delta.reset:
        body["reset"] = True
    return body


def poll_body(poll: Poll) -> dict[str, Any]:
    body: dict[str, Any] = {"timeout": poll.timeout}
    if poll.cursor is not None:
        body["cursor"] = poll.cursor
    return body


def feed_code(exc: PeerdError) -> str:
    """A box without the change feed answers `not_found` for its routes: that is worth waiting
    out (the box may be updated), not a reason to fail the link's tasks."""
    return Unavailable.code if exc.code == NotFound.code else exc.code


def feed_message(exc: PeerdError, label: str) -> str:
    if exc.code == NotFound.code:
        return f"{label} runs a peerd without the change feed; update peerd there (the tasks wait)."
    return exc.message


async def read_reply(forwarder: Forwarder, env_id: str, read: ReadResult) -> str | None:
    """The settled run's last reply, read whole (paged, long text by itemId + textOffset)."""
    path = f"/v1/threads/{path_segment(read.thread_id)}/items"  # the box named it: one segment
    reply: dict[str, Any] | None = None
    after: int | None = None
    while True:
        params: dict[str, Any] = {"runId": read.result_run_id, "limit": 100}
        if after is not None:
            params["afterPosition"] = after
        page = await forwarder.call(env_id, "GET", path, params=params)
        for item in page["items"]:
            if item["kind"] == "assistant_message":
                reply = item
        if not page["hasMore"]:
            break
        after = page["nextPosition"]
    if reply is None:
        return None
    text, part = str(reply["text"]), reply
    while part.get("textTruncated"):  # left out when false
        more = await forwarder.call(
            env_id, "GET", path, params={"itemId": reply["id"], "textOffset": part["nextTextOffset"]}
        )
        part = more["items"][0]
        text += part["text"]
    return text
