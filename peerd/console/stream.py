"""A thread's items as server-sent events, resumable with `Last-Event-ID`.

`GET /threads/{env}/{id}/stream?after=POSITION` sends `item` events (each item rendered once, in
position order) and `swap` events: a part of the page (the header's latest run, the usage total,
the usage-by-run table, the Interrupt and Stop buttons; the send area once the thread moved) as one
element with its id, read from `thread show` and sent when its HTML changed (the page's script
swaps the element with the same id). Every event's id is
`POSITION.CURSOR`: the position of the last item sent and the thread's event cursor at the time
those items were read. A browser that reconnects (EventSource does so by itself after a dropped
connection, sending `Last-Event-ID`; the page's script does it after a refused one, with `?last=`)
resumes from there: items are read by position, so none is lost or sent twice, and the long-poll
on the events cursor wakes for anything that happened while it was away.

Between changes the stream long-polls the thread's events (`KEEPALIVE_S`) and writes a comment
line when nothing happened, which keeps proxies (`tailscale serve`) from closing an idle stream.
It ends when the daemon stops, when the console closes, or on an error, after a `problem` event
that says what went wrong; the browser then shows "reconnecting" and tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog
from aiohttp import web

from peerd import contracts as c
from peerd.console.owner import LIVE, Env, Owner
from peerd.console.pages import owner
from peerd.console.render import render_text, shown_error
from peerd.console.state import CONSOLE, SESSION
from peerd.console.threads import moved_link, thread_href
from peerd.errors import PeerdError, ShuttingDown

log = structlog.get_logger(__name__)

KEEPALIVE_S = 15.0
RETRY_MS = 2000


def resume_point(last_event_id: str | None, after: str | None) -> tuple[int, int | None]:
    """(the last item position the browser has, the event cursor or None) from what it sent."""
    if last_event_id:
        position, _, cursor = last_event_id.partition(".")
        with contextlib.suppress(ValueError):
            return max(-1, int(position)), max(0, int(cursor))
    with contextlib.suppress(TypeError, ValueError):
        return max(-1, int(after or "")), None
    return -1, None


def sse(event: str, event_id: str, data: str) -> bytes:
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    body = "".join(f"data: {line}\n" for line in lines)
    return f"event: {event}\nid: {event_id}\n{body}\n".encode()


async def caught_up(api: Owner, env: Env, thread_id: str) -> int:
    """The thread's event cursor now (its history paged through without waiting)."""
    cursor = 0
    while True:
        page = await api.events(env, thread_id, cursor, 0.0)
        cursor = page.next_cursor
        if len(page.events) < c.PAGE_LIMIT:
            return cursor


LIVE_PARTS = ("run_state", "usage_total", "usage_runs", "run_controls")  # _thread_parts.html


class Parts:
    """The thread page's live parts (its header's run, the usage total, the usage-by-run table,
    the run's buttons, the send area), each sent as a `swap` event when its HTML changed. The send
    area only when the thread's status changes (a move): swapping it would drop a message being
    typed."""

    def __init__(self, env: Env, thread_id: str, envs: list[Env], csrf: str, root: str) -> None:
        self.context = {"href": thread_href(env, thread_id), "live": LIVE, "csrf": csrf, "root": root}
        self.envs = envs
        self.sent: dict[str, str] = {}
        self.status: str | None = None

    def changed(self, api: Owner, thread: c.Thread) -> list[str]:
        context = {**self.context, **moved_link(api, self.envs, thread), "thread": thread}
        out = []
        names = list(LIVE_PARTS)
        if thread.status != self.status and (self.status is not None or thread.status == "moved"):
            names.append("send_area")  # a change, or a move the page may have been rendered before
        self.status = thread.status
        for name in names:
            html = render_text(
                "_thread_part.html", part=name, request_id=uuid.uuid4().hex, said="", level="info", **context
            )
            if self.sent.get(name) != html or name == "send_area":
                self.sent[name] = html
                out.append(html)
        return out


async def thread_stream(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    api = owner(request)
    env = await api.env(request.match_info["env"])
    thread_id = request.match_info["id"]
    last = request.headers.get("Last-Event-ID") or request.query.get("last")
    position, cursor = resume_point(last, request.query.get("after"))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    task = asyncio.current_task()
    if task is not None:
        console.stream_started(task)
    await response.write(f"retry: {RETRY_MS}\n\n".encode())
    session = request.get(SESSION)
    parts = Parts(env, thread_id, await api.envs(), "" if session is None else session.csrf, console.root)
    try:
        if cursor is None:
            cursor = await caught_up(api, env, thread_id)
        while not console.closed and not console.gate.closing:
            while True:
                read = await api.items(env, thread_id, position)
                for item in read.items:
                    position = item.position
                    html = render_text("_item.html", item=item)
                    await response.write(sse("item", f"{position}.{cursor}", html))
                if not read.has_more:
                    break
            for html in parts.changed(api, await api.thread(env, thread_id)):
                await response.write(sse("swap", f"{position}.{cursor}", html))
            events = await api.events(env, thread_id, cursor, KEEPALIVE_S)
            if not events.events:
                await response.write(b": keep-alive\n\n")
            cursor = events.next_cursor
    except PeerdError as exc:
        if not isinstance(exc, ShuttingDown):
            log.info("console.stream_problem", code=exc.code)
            with contextlib.suppress(ConnectionError):
                await response.write(sse("problem", f"{position}.{cursor or 0}", shown_error(exc)))
    except ConnectionError:
        pass  # the browser went away
    return response


ROUTES = (("GET", "/threads/{env}/{id}/stream", thread_stream),)
