"""The A2A face's routes (peerd/a2a/, docs/user/a2a.md), declared here so the API document lists them.

- `GET /.well-known/agent-card.json`: the public card (name, the interfaces, the capabilities and
  how to authenticate; no projects, no providers). Served without a token on the network listener:
  an A2A client reads it first to learn where and how to sign in.
- `/v1/a2a/jsonrpc` (POST) and `/v1/a2a/rest/...` (the REST binding): behind the listener's own
  auth, like every `/v1/*` route: a link's access token on the network listener
  (`remote.link_auth_middleware`), the owner on the owner socket. The extended card (projects and
  providers as skills) is `GetExtendedAgentCard` there.

What serves them is the A2A face (`A2A_FACE`, `peerd.a2a.http.A2AFace`), given by the daemon; this
module only checks that a caller was decided and hands the request on.
"""

from __future__ import annotations

from typing import Any, Protocol

import pydantic
from aiohttp import web

from peerd.api.context import caller_of
from peerd.api.routes import Route, add_routes
from peerd.operations import Caller

A2A_PREFIX = "/v1/a2a"
CARD_PATH = "/.well-known/agent-card.json"


class Face(Protocol):
    async def public_card(self, request: web.Request) -> web.StreamResponse: ...

    async def serve(self, request: web.Request, caller: Caller) -> web.StreamResponse: ...


A2A_FACE: web.AppKey[Any] = web.AppKey("a2a_face")


class A2AAny(pydantic.BaseModel):
    """An A2A 1.0 message (JSON-RPC 2.0 request, or a REST body); the a2a-sdk validates it."""

    model_config = pydantic.ConfigDict(extra="allow")


async def agent_card(request: web.Request) -> web.StreamResponse:
    face: Face = request.app[A2A_FACE]
    return await face.public_card(request)


async def a2a_endpoint(request: web.Request) -> web.StreamResponse:
    face: Face = request.app[A2A_FACE]
    return await face.serve(request, caller_of(request))


CARD_ROUTE = Route(
    "GET",
    CARD_PATH,
    agent_card,
    "a2a_agent_card",
    "The A2A agent card (public part: interfaces, capabilities, security schemes).",
    "a2a",
    answer=A2AAny,
)
JSONRPC_ROUTE = Route(
    "POST",
    A2A_PREFIX + "/jsonrpc",
    a2a_endpoint,
    "a2a_jsonrpc",
    "A2A 1.0 over JSON-RPC 2.0 (SendMessage, GetTask, CancelTask, streaming, push configs).",
    "a2a",
    body=A2AAny,
    answer=A2AAny,
)
REST_ROUTE = Route(
    "*",
    A2A_PREFIX + "/rest/{tail:.*}",
    a2a_endpoint,
    "a2a_rest",
    "A2A 1.0 over HTTP+JSON (POST message:send, GET tasks/{id}, POST tasks/{id}:cancel, ...).",
    "a2a",
    answer=A2AAny,
    params={"tail": "the A2A REST path (message:send, tasks/ID, tasks/ID:cancel, ...)"},
    documented_methods=("GET", "POST", "DELETE"),
)
ROUTES: tuple[Route, ...] = (JSONRPC_ROUTE, REST_ROUTE)  # behind the listener's auth
NETWORK_ROUTES: tuple[Route, ...] = (CARD_ROUTE, *ROUTES)


def add_a2a_routes(app: web.Application, face: Face, *, network: bool) -> None:
    """Serve the A2A face on `app` (before it is started): the card too on the network listener."""
    app[A2A_FACE] = face
    add_routes(app, NETWORK_ROUTES if network else ROUTES)
