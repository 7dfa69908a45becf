"""The Board (every thread of the fleet in columns by state, filtered, searched, paged, live) and
Needs you (one queue of what waits for the person, each with its action, and its count in every
page's navigation). The rules are `peerd.console.board`; the reads `peerd.console.fleet`.

Live: the board's stream (`/board/stream`, server-sent events) reads the fleet again every
`BOARD_POLL_S` (sooner when a question is asked or answered) and sends the board (one element,
`swap`) when its HTML changed; there is no fleet-wide change feed to wait on (a box's threads are
read through its link). The navigation's
count is a watcher element (htmx, like the Approvals page's): `/needs-you/count` long-polls the
pending approvals' hash (`changedFrom`, up to `COUNT_WAIT_S`), then answers the count read afresh
and the next watcher; a budget stop or a failed task is counted at the next answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import structlog
from aiohttp import web

from peerd.console.approvals import SCOPES
from peerd.console.board import Filters, lay_out
from peerd.console.fleet import Fleet, read_fleet
from peerd.console.owner import Owner
from peerd.console.pages import owner
from peerd.console.render import page, render_text, shown_error
from peerd.console.state import CONSOLE, SESSION
from peerd.console.stream import RETRY_MS, sse
from peerd.errors import PeerdError, ShuttingDown

log = structlog.get_logger(__name__)

BOARD_POLL_S = 2.0
KEEPALIVE_S = 15.0
COUNT_WAIT_S = 20.0
HASH = re.compile(r"[0-9a-f]{16}")


def _board_context(fleet: Fleet, filters: Filters) -> dict[str, Any]:
    return {"board": lay_out(fleet.cards, filters), "fleet": fleet, "filters": filters}


async def board(request: web.Request) -> web.StreamResponse:
    filters = Filters.of(request.query)
    fleet = await read_fleet(owner(request))
    return page(request, "board.html", title="Board", **_board_context(fleet, filters))


async def board_stream(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    api = owner(request)
    filters = Filters.of(request.query)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    task = asyncio.current_task()
    if task is not None:
        console.stream_started(task)
    await response.write(f"retry: {RETRY_MS}\n\n".encode())
    shown = ""
    quiet_since = time.monotonic()
    try:
        while not console.closed and not console.gate.closing:
            fleet = await read_fleet(api)
            html = render_text("_board.html", root=console.root, **_board_context(fleet, filters))
            if html != shown:
                shown = html
                quiet_since = time.monotonic()
                await response.write(sse("swap", "board", html))
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                await response.write(b": keep-alive\n\n")
            await wait_a_little(api, fleet.pending_hash)
    except PeerdError as exc:
        if not isinstance(exc, ShuttingDown):
            log.info("console.board_stream_problem", code=exc.code)
            with contextlib.suppress(ConnectionError):
                await response.write(sse("problem", "board", shown_error(exc)))
    except ConnectionError:
        pass  # the browser went away
    return response


async def wait_a_little(api: Owner, pending_hash: str) -> None:
    """`BOARD_POLL_S`, or less when a question is asked or answered (the pending approvals'
    long-poll): there is no fleet-wide feed to wait on (see the docstring)."""
    if not HASH.fullmatch(pending_hash):
        await asyncio.sleep(BOARD_POLL_S)
        return
    params = {"limit": 1, "changedFrom": pending_hash, "timeout": BOARD_POLL_S}
    await api.call("GET", "/v1/approvals", params=params)


async def needs_you(request: web.Request) -> web.StreamResponse:
    fleet = await read_fleet(owner(request))
    return page(request, "needs_you.html", title="Needs you", fleet=fleet, scopes=SCOPES)


async def needs_count(request: web.Request) -> web.StreamResponse:
    """The navigation's count and the next watcher: at once without `changedFrom`, else once the
    pending approvals' hash is no longer it or after `COUNT_WAIT_S`."""
    api = owner(request)
    changed_from = request.query.get("changedFrom", "")
    if HASH.fullmatch(changed_from):
        data = await api.call(
            "GET", "/v1/approvals", params={"limit": 1, "changedFrom": changed_from, "timeout": COUNT_WAIT_S}
        )
        del data  # it woke: read the count afresh
    fleet = await read_fleet(api)
    session = request.get(SESSION)
    body = render_text(
        "_needs_count.html",
        root=request.app[CONSOLE].root,
        csrf="" if session is None else session.csrf,
        count=fleet.needs_count,
        pending_hash=fleet.pending_hash,
    )
    # not `render.fragment`: a long-poll must leave the session's notices for the next page
    return web.Response(text=body, content_type="text/html", charset="utf-8")


ROUTES = (
    ("GET", "/board", board),
    ("GET", "/board/stream", board_stream),
    ("GET", "/needs-you", needs_you),
    ("GET", "/needs-you/count", needs_count),
)
