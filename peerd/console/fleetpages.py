"""The Fleet page (each environment's capacity report, its age and its placement preference, as
`peerd fleet` shows them) and a thread's Move (the dry run's candidates with their reasons, then
the move itself), through the owner's API: `GET /v1/fleet`, `POST /v1/threads/{id}/move`."""

from __future__ import annotations

import uuid

from aiohttp import web

from peerd import contracts as c
from peerd.console.pages import back, form, owner
from peerd.console.render import notice, page, shown_error
from peerd.console.threads import thread_href
from peerd.core.text import path_segment
from peerd.errors import PeerdError
from peerd.handoff.wire import MoveAnswer


async def fleet_page(request: web.Request) -> web.StreamResponse:
    offline = request.query.get("offline") == "1"
    data = await owner(request).call("GET", "/v1/fleet", params={"offline": offline})
    return page(request, "fleet.html", title="Fleet", fleet=c.Fleet.model_validate(data), offline=offline)


async def move_page(request: web.Request) -> web.StreamResponse:
    """The dry run: who could take the thread, and why not where not."""
    api = owner(request)
    thread_id = request.match_info["id"]
    thread = await api.thread(api.here, thread_id)
    answer = MoveAnswer.model_validate(
        await api.call("POST", f"/v1/threads/{path_segment(thread_id)}/move", body={"dryRun": True})
    )
    return page(
        request,
        "move.html",
        title=f"Move {thread.title}",
        thread=thread,
        candidates=answer.candidates or [],
        href=thread_href(api.here, thread_id),
        request_id=uuid.uuid4().hex,
    )


async def move(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    thread_id = request.match_info["id"]
    data = await form(request)
    href = thread_href(api.here, thread_id)
    body: dict[str, object] = {"to": data.get("to") or None, "interrupt": data.get("interrupt") == "1"}
    if data.get("message", "").strip():
        body["message"] = data["message"].strip()
    if data.get("request_id"):
        body["clientRequestId"] = data["request_id"]
    try:
        answer = MoveAnswer.model_validate(
            await api.call("POST", f"/v1/threads/{path_segment(thread_id)}/move", body=body)
        )
        where = answer.move.environment_id if answer.move is not None else data.get("to")
        notice(
            request,
            f"Moving to {data.get('label') or where}: this page says `moved` once the copy there runs.",
        )
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
    raise back(request, href)


ROUTES = (
    ("GET", "/fleet", fleet_page),
    ("GET", "/threads/here/{id}/move", move_page),
    ("POST", "/threads/here/{id}/move", move),
)
