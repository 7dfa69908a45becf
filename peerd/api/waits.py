"""Waits on a pull request, owner socket only (agents use the tools `wait_for_github`,
`list_waits`, `cancel_wait`; peerd/waits/):

GET  /v1/waits?threadId=&status=&limit=    the waits here, newest first
GET  /v1/waits/{id}                        one wait, with what GitHub said at its last poll
POST /v1/waits/{id}/cancel {reason?}       end it `cancelled` (nobody is woken)
"""

from __future__ import annotations

from aiohttp import web

from peerd.api import examples as ex
from peerd.api.app import json_object, ok, query_model
from peerd.api.context import caller_of
from peerd.api.routes import Example, Route, add_routes
from peerd.waits.service import Waits
from peerd.waits.wire import WaitCancelBody, WaitInfo, WaitList, WaitPage

WAITS: web.AppKey[Waits] = web.AppKey("waits")


async def wait_list(request: web.Request) -> web.Response:
    req = query_model(request, WaitList)
    return ok(await request.app[WAITS].listing(caller_of(request), req))


async def wait_show(request: web.Request) -> web.Response:
    return ok(await request.app[WAITS].show(caller_of(request), request.match_info["id"]))


async def wait_cancel(request: web.Request) -> web.Response:
    body = WaitCancelBody.model_validate(await json_object(request))
    return ok(await request.app[WAITS].cancel(caller_of(request), request.match_info["id"], body.reason))


_ID = {"id": "a wait id (wt_...)"}
ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/waits", wait_list, "wait_list", "The waits on pull requests here, newest first.", "waits",
          query=WaitList, answer=WaitPage, example=Example({"items": [ex.WAIT]})),
    Route("GET", "/v1/waits/{id}", wait_show, "wait_show",
          "One wait on a pull request, with what GitHub said at its last poll.", "waits",
          answer=WaitInfo, errors=("wait_not_found",), params=_ID,
          example=Example(ex.WAIT, path={"id": ex.WT})),
    Route("POST", "/v1/waits/{id}/cancel", wait_cancel, "wait_cancel",
          "Cancel a wait: it ends `cancelled` and its thread is not woken for it.", "waits",
          body=WaitCancelBody, answer=WaitInfo, errors=("wait_not_found",), params=_ID,
          example=Example({**ex.WATCHING, "status": "cancelled", "detail": "cancelled by the owner"},
                          path={"id": ex.WT}, body={})),
)  # fmt: skip


def add_wait_routes(app: web.Application, service: Waits) -> None:
    app[WAITS] = service
    add_routes(app, ROUTES)
