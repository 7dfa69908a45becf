"""The owner's side of sign-ins approved in the console (issue 29; store/signin_requests.py), on the
owner socket only: the waiting requests, and a decision on one (an access level, or a denial).

    GET  /v1/agent-signins                    the requests still waiting, oldest first
    POST /v1/agent-signins/{id}/decision      {"access": LEVEL} approves; {} denies
"""

from __future__ import annotations

import structlog
from aiohttp import web
from pydantic import BaseModel

from peerd import contracts as c
from peerd.api.app import OPERATIONS, json_body, ok
from peerd.api.routes import Example, Route, add_routes
from peerd.store import signin_requests

log = structlog.get_logger(__name__)


class SigninRequests(BaseModel):
    """The sign-ins waiting for the owner."""

    items: list[c.SigninRequestInfo]


async def signin_list(request: web.Request) -> web.Response:
    ops = request.app[OPERATIONS]
    return ok({"items": [r.wire() for r in await signin_requests.waiting(ops.db, now=ops.clock())]})


async def signin_decide(request: web.Request) -> web.Response:
    ops = request.app[OPERATIONS]
    decision = await json_body(request, c.SigninDecide)
    decided = await signin_requests.decide(
        ops.db, request.match_info["id"], access=decision.access, now=ops.clock()
    )
    log.info("agent_signin.decided", request_id=decided.id, state=decided.state, access=decided.access)
    return ok(decided)


_EXAMPLE = {
    "id": "sir_3f9c0a1b2d4e5f60718a",
    "clientId": "https://claude.ai/oauth/claude-code-client-metadata",
    "clientName": "Claude Code",
    "redirectUri": "http://localhost:56359/callback",
    "state": "pending",
    "access": None,
    "createdAt": 1796229075.0,
    "expiresAt": 1796229675.0,
}
ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/agent-signins", signin_list, "agent_signin_list",
          "Outside agents' sign-ins waiting for the owner's approval (issue 29).", "links",
          answer=SigninRequests, example=Example({"items": [_EXAMPLE]})),
    Route("POST", "/v1/agent-signins/{id}/decision", signin_decide, "agent_signin_decide",
          "Approve a waiting sign-in at an access level, or deny it (no access).", "links",
          body=c.SigninDecide, answer=c.SigninRequestInfo, errors=("not_found", "conflict"),
          params={"id": "the sign-in request (`sir_...`)"},
          example=Example({**_EXAMPLE, "state": "approved", "access": "read-only"}, body={"access": "read-only"},
                          path={"id": "sir_3f9c0a1b2d4e5f60718a"})),
)  # fmt: skip


def add_signin_request_routes(app: web.Application) -> None:
    """Mount them on the owner socket's app (it holds `OPERATIONS`)."""
    add_routes(app, ROUTES)
