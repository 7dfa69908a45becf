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
from peerd.api.routes import Example, Route, add_routes
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


class A2ABindingErrorDetail(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")

    code: int
    message: str


class A2ABindingError(pydantic.BaseModel):
    """The A2A HTTP+JSON binding's own error (google.rpc.Status shape), answered by the a2a-sdk."""

    model_config = pydantic.ConfigDict(extra="allow")

    error: A2ABindingErrorDetail


BINDING_ERRORS: dict[int, type[pydantic.BaseModel] | None] = {
    400: A2ABindingError,
    404: A2ABindingError,
    405: A2ABindingError,
    415: A2ABindingError,
}


async def agent_card(request: web.Request) -> web.StreamResponse:
    face: Face = request.app[A2A_FACE]
    return await face.public_card(request)


async def a2a_endpoint(request: web.Request) -> web.StreamResponse:
    face: Face = request.app[A2A_FACE]
    return await face.serve(request, caller_of(request))


TASK_ID = "run_8fcf92c820e7365dad17"
TASK: dict[str, object] = {
    "id": TASK_ID,
    "contextId": "thr_f5ffd96ba8232db47434",
    "status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-12-02T16:20:07Z"},
}
CARD_ROUTE = Route(
    "GET",
    CARD_PATH,
    agent_card,
    "a2a_agent_card",
    "The A2A agent card (public part: interfaces, capabilities, security schemes).",
    "a2a",
    answer=A2AAny,
    example=Example(
        {
            "name": "peerd box",
            "supportedInterfaces": [
                {
                    "url": "https://box:7433/v1/a2a/jsonrpc",
                    "protocolBinding": "JSONRPC",
                    "protocolVersion": "1.0",
                },
                {
                    "url": "https://box:7433/v1/a2a/rest",
                    "protocolBinding": "HTTP+JSON",
                    "protocolVersion": "1.0",
                },
            ],
            "capabilities": {"streaming": True, "pushNotifications": True, "extendedAgentCard": True},
            "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}},
        }
    ),
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
    headers={"A2A-Version": "1.0"},
    example=Example(
        {"jsonrpc": "2.0", "id": 1, "result": TASK},
        body={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": TASK_ID}},
    ),
)
REST_PATH = A2A_PREFIX + "/rest/{tail:.*}"
REST_MEANING = {"tail": "the A2A REST path (message:send, tasks/ID, tasks/ID:cancel, ...)"}
REST_GET = Route(
    "GET",
    REST_PATH,
    a2a_endpoint,
    "a2a_rest_get",
    "A2A 1.0 over HTTP+JSON, reads (GET tasks/{id}, tasks/{id}:subscribe, tasks, extendedAgentCard, ...).",
    "a2a",
    answer=A2AAny,
    other=BINDING_ERRORS,
    media_type="application/a2a+json",
    params=REST_MEANING,
    headers={"A2A-Version": "1.0"},
    example=Example(TASK, path={"tail": "tasks/" + TASK_ID}),
)
REST_POST = Route(
    "POST",
    REST_PATH,
    a2a_endpoint,
    "a2a_rest_post",
    "A2A 1.0 over HTTP+JSON, changes (POST message:send, message:stream, tasks/{id}:cancel, push configs).",
    "a2a",
    body=A2AAny,
    answer=A2AAny,
    other=BINDING_ERRORS,
    media_type="application/a2a+json",
    params=REST_MEANING,
    headers={"A2A-Version": "1.0"},
    example=Example(
        {"task": TASK},
        body={"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "Fix the flaky test"}]}},
        path={"tail": "message:send"},
    ),
)
REST_DELETE = Route(
    "DELETE",
    REST_PATH,
    a2a_endpoint,
    "a2a_rest_delete",
    "A2A 1.0 over HTTP+JSON: delete a task's push notification config.",
    "a2a",
    answer=A2AAny,
    other=BINDING_ERRORS,
    media_type="application/a2a+json",
    params=REST_MEANING,
    headers={"A2A-Version": "1.0"},
    example=Example({}, path={"tail": "tasks/" + TASK_ID + "/pushNotificationConfigs/p1"}),
)
ROUTES: tuple[Route, ...] = (JSONRPC_ROUTE, REST_GET, REST_POST, REST_DELETE)  # behind the listener's auth
NETWORK_ROUTES: tuple[Route, ...] = (CARD_ROUTE, *ROUTES)


def add_a2a_routes(app: web.Application, face: Face, *, network: bool) -> None:
    """Serve the A2A face on `app` (before it is started): the card too on the network listener."""
    app[A2A_FACE] = face
    add_routes(app, NETWORK_ROUTES if network else ROUTES)
