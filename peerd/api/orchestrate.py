"""Orchestration routes, local socket only (the owner runs orchestrations; links never do).

POST /v1/orchestrations                 start one (or `dryRun`: how coders would resolve)
GET  /v1/orchestrations                 list them
GET  /v1/orchestrations/{id}?after=&timeout=   one, with packets and receipts (long-poll)
POST /v1/orchestrations/{id}/cancel {reason?}

The engine behind them loads on the first call (`orchestrate/lazy.py`): these routes and their
request model import none of it.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import Field

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import json_body, json_object, ok, query_model
from peerd.api.routes import Example, Route, add_routes
from peerd.orchestrate.front import OrchestrateRequest
from peerd.orchestrate.lazy import LazyOrchestrations

ORCHESTRATIONS: web.AppKey[LazyOrchestrations] = web.AppKey("orchestrations")


class WaitQuery(c.Input):
    after: float = Field(default=0.0, ge=0)
    timeout: float = Field(default=0.0, ge=0, le=c.LONG_POLL_MAX_S)


class CancelBody(c.Input):
    reason: str | None = Field(default=None, max_length=2000)


async def orchestration_start(request: web.Request) -> web.Response:
    req = await json_body(request, OrchestrateRequest)
    return ok(await request.app[ORCHESTRATIONS].start_run(req), status=200 if req.dry_run else 201)


async def orchestration_list(request: web.Request) -> web.Response:
    return ok({"items": await request.app[ORCHESTRATIONS].list()})


async def orchestration_show(request: web.Request) -> web.Response:
    query = query_model(request, WaitQuery)
    service = request.app[ORCHESTRATIONS]
    run_id = request.match_info["id"]
    if query.timeout > 0:
        return ok(await service.wait(run_id, after=query.after, seconds=query.timeout))
    return ok(await service.info(run_id))


async def orchestration_cancel(request: web.Request) -> web.Response:
    body = CancelBody.model_validate(await json_object(request))
    return ok(await request.app[ORCHESTRATIONS].cancel(request.match_info["id"], body.reason))


_ID = {"id": "an orchestration id (orc_...)"}
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/orchestrations", orchestration_start, "orchestration_start",
          "Start an orchestration (or `dryRun`: how the coders would resolve).", "orchestrations",
          body=OrchestrateRequest, status=201, also=(200,),
          errors=("project_not_found", "not_linked", "provider_unavailable", "config_invalid", "git_error",
                  "checkout_dirty"),
          example=Example(ex.ORCHESTRATION, body={"projectId": ex.PRJ, "task": "Split the payment module"})),
    Route("GET", "/v1/orchestrations", orchestration_list, "orchestration_list", "The orchestrations.",
          "orchestrations", example=Example({"items": [ex.ORCHESTRATION]})),
    Route("GET", "/v1/orchestrations/{id}", orchestration_show, "orchestration_show",
          "One orchestration with its packets and receipts; with `timeout`, a long-poll for a change.",
          "orchestrations", query=WaitQuery, errors=("orchestration_not_found",), params=_ID,
          example=Example(ex.ORCHESTRATION, path={"id": ex.ORC})),
    Route("POST", "/v1/orchestrations/{id}/cancel", orchestration_cancel, "orchestration_cancel",
          "Cancel an orchestration and stop its packets.", "orchestrations", body=CancelBody,
          errors=("orchestration_not_found",), params=_ID,
          example=Example({**ex.ORCHESTRATION, "status": "cancelled"}, path={"id": ex.ORC}, body={})),
)  # fmt: skip


def add_orchestration_routes(app: web.Application, service: LazyOrchestrations) -> None:
    app[ORCHESTRATIONS] = service
    add_routes(app, ROUTES)
