"""The A2A face's HTTP shell: the agent card, and the a2a-sdk's bindings behind peerd's auth.

Chosen: the SDK's own Starlette routes for the JSON-RPC and REST bindings (its dispatch, its
validation of `lf.a2a.v1` messages, its SSE), run as an ASGI app per aiohttp request
(`asgi_stream`, as `peerd/api/mcp_http.py` runs the MCP SDK's handler, but streaming, for SSE),
over our `RequestHandler` (`handler.py`). The listener has decided the caller before the SDK sees a
byte (`peerd/api/a2a_routes.py`); it travels in the ASGI scope (`SCOPE_CALLER`) into the
`ServerCallContext`, so there is one caller identity and the SDK never authenticates anything.

The card: a public one at `/.well-known/agent-card.json` (what it is, where and how to
authenticate: no projects, no providers), and the full one, with the providers and the projects
this caller may use as skills, as the authenticated extended card.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import pydantic
from a2a.auth.user import User
from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.server.routes.common import ServerCallContextBuilder
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    AuthorizationCodeOAuthFlow,
    HTTPAuthSecurityScheme,
    OAuth2SecurityScheme,
    OAuthFlows,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount

from peerd.a2a import mapping
from peerd.a2a.handler import BASE_STATE, CALLER_STATE, PeerdRequestHandler
from peerd.a2a.push import PushService
from peerd.a2a.remote import RemoteTasks
from peerd.a2a.view import task_by_id
from peerd.api.a2a_routes import A2A_PREFIX
from peerd.api.asgi import asgi_scope
from peerd.errors import InvalidRequest
from peerd.operations import Caller, Operations
from peerd.store import projects

SCOPE_CALLER = "peerd.caller"
JSONRPC_PATH = A2A_PREFIX + "/jsonrpc"
REST_PATH = A2A_PREFIX + "/rest"
BEARER = "bearer"
OAUTH = "oauth"
SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


class PeerdUser(User):
    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.caller.namespace


class CallerContext(ServerCallContextBuilder):
    """The SDK's call context from the caller the listener decided (never from the request)."""

    def build(self, request: Request) -> ServerCallContext:
        caller = request.scope[SCOPE_CALLER]
        # The SDK reads A2A-Version and extensions from the headers; the credentials stay out.
        headers = {k: v for k, v in request.headers.items() if k.lower() not in SECRET_HEADERS}
        return ServerCallContext(
            user=PeerdUser(caller),
            state={
                CALLER_STATE: caller,
                BASE_STATE: f"{request.url.scheme}://{request.headers.get('host', 'localhost')}",
                "headers": headers,
            },
            requested_extensions=get_requested_extensions(request.headers.getlist(HTTP_EXTENSION_HEADER)),
        )


class A2AFace:
    def __init__(self, ops: Operations, *, label: str, allow_private_push: list[str]) -> None:
        self.ops = ops
        self.label = label
        self.push = PushService(
            ops,
            allowed=mapping.networks(allow_private_push),
            task_of=lambda task_id: task_by_id(ops, task_id),
        )
        self.remote = RemoteTasks(ops)
        self.handler = PeerdRequestHandler(ops, self.push, self.extended_card, self.remote)
        context = CallerContext()
        self.app = Starlette(
            exception_handlers={404: _binding_error, 405: _binding_error},
            routes=[
                *create_jsonrpc_routes(self.handler, JSONRPC_PATH, context_builder=context),
                Mount(REST_PATH, routes=create_rest_routes(self.handler, context_builder=context)),
            ],
        )

    async def start(self) -> None:
        self.push.start()
        await self.remote.start()

    async def close(self) -> None:
        await self.remote.close()
        await self.push.close()

    # --- the card -------------------------------------------------------------------------------

    def _card(self, base: str) -> AgentCard:
        card = AgentCard(
            name=f"peerd {self.label}",
            description=(
                f"The coding agents of the peerd environment {self.label!r}: a message starts a thread "
                "(an agent conversation in a project's own worktree); its contextId is the thread."
            ),
            version="1.0",
            capabilities=AgentCapabilities(streaming=True, push_notifications=True, extended_agent_card=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            supported_interfaces=[
                AgentInterface(url=base + JSONRPC_PATH, protocol_binding="JSONRPC", protocol_version="1.0"),
                AgentInterface(url=base + REST_PATH, protocol_binding="HTTP+JSON", protocol_version="1.0"),
            ],
        )
        card.security_schemes[BEARER].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    description="A link's access token from this box's /oauth/token (`peerd pair`), or "
                    "the owner's socket; see docs/user/a2a.md.",
                )
            )
        )
        # An agent peerd did not start signs in with OAuth 2.1 + PKCE, approved by the owner with a
        # pairing code (`peerd pair --for agent`), as it does for /mcp (api/agent_signin.py).
        card.security_schemes[OAUTH].CopyFrom(
            SecurityScheme(
                oauth2_security_scheme=OAuth2SecurityScheme(
                    description="An outside agent's sign-in, approved with `peerd pair --for agent` or in the "
                    "console; see docs/user/agents.md.",
                    oauth2_metadata_url=base + "/.well-known/oauth-authorization-server",
                    flows=OAuthFlows(
                        authorization_code=AuthorizationCodeOAuthFlow(
                            authorization_url=base + "/oauth/authorize",
                            token_url=base + "/oauth/token",
                            refresh_url=base + "/oauth/token",
                            pkce_required=True,
                        )
                    ),
                )
            )
        )
        for scheme in (BEARER, OAUTH):  # either one
            requirement = SecurityRequirement()
            requirement.schemes[scheme].CopyFrom(StringList())
            card.security_requirements.append(requirement)
        card.skills.append(
            AgentSkill(
                id="thread",
                name="Coding thread",
                description="Start or continue a coding thread; the extended card lists providers and projects.",
                tags=["coding"],
            )
        )
        return card

    async def extended_card(self, caller: Caller, base: str) -> AgentCard:
        card = self._card(base)
        del card.skills[:]
        listed = await projects.page(self.ops.db, cursor=None, limit=100)
        providers = [name for name in self.ops.runs.providers() if self.ops.provider_installed(name)]
        if caller.link is not None:
            providers = [name for name in providers if self.ops.link_may_use(name)]
        for skill in mapping.skills(listed.items, providers):
            card.skills.append(AgentSkill(**skill))  # type: ignore[arg-type]
        return card

    async def public_card(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(agent_card_to_dict(self._card(_base_of(request))))

    # --- the bindings ---------------------------------------------------------------------------

    async def serve(self, request: web.Request, caller: Caller) -> web.StreamResponse:
        body = await request.read()  # capped by the app (payload_too_large)
        checked_body(body, jsonrpc=request.path == JSONRPC_PATH)
        return await asgi_stream(self.app, request, body, {SCOPE_CALLER: caller})


MAX_DEPTH = 32


class JsonRpcEnvelope(pydantic.BaseModel):
    """What the SDK's JSON-RPC dispatch assumes of a request before it validates the rest."""

    model_config = pydantic.ConfigDict(extra="allow")

    jsonrpc: Literal["2.0"]
    method: str = pydantic.Field(min_length=1, max_length=100)
    id: pydantic.StrictStr | Annotated[int, pydantic.Field(ge=-(2**63), lt=2**63)] | None = None
    params: dict[str, Any] | None = None


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def checked_body(body: bytes, *, jsonrpc: bool) -> None:
    """Refuse what would make the SDK fail (a 500) instead of answering: a body that is not UTF-8
    JSON, nested deeper than `MAX_DEPTH`, or (JSON-RPC) not one request object."""
    if not body:
        if jsonrpc:
            raise InvalidRequest("A JSON-RPC request needs a body.")
        return
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past Python's limit
        raise InvalidRequest("The body is not JSON (UTF-8).") from None
    if _depth(data) > MAX_DEPTH:
        raise InvalidRequest(f"The body is nested deeper than {MAX_DEPTH} levels.")
    if jsonrpc:
        try:
            JsonRpcEnvelope.model_validate(data)
        except pydantic.ValidationError:
            raise InvalidRequest(
                'Not a JSON-RPC 2.0 request object (jsonrpc "2.0", a method, a string or integer id, '
                "object params)."
            ) from None


async def _binding_error(request: Request, exc: Exception) -> JSONResponse:
    """An unknown path or method under the bindings, in the binding's own error shape."""
    status = getattr(exc, "status_code", 404)
    reason = "NOT_FOUND" if status == 404 else "METHOD_NOT_ALLOWED"
    message = "No such A2A method here." if status == 404 else "This A2A path takes another method."
    return JSONResponse({"error": {"code": status, "status": reason, "message": message}}, status_code=status)


def _base_of(request: web.Request) -> str:
    scheme = "https" if request.secure else "http"
    return f"{scheme}://{request.host}"


async def asgi_stream(
    app: Any, request: web.Request, body: bytes, extra: dict[str, Any]
) -> web.StreamResponse:
    """Run an ASGI app for one request whose body is already read; its answer streamed as it comes."""
    scope = asgi_scope(request, extra, scheme="https" if request.secure else "http")
    finished = asyncio.Event()
    delivered = False
    response: web.StreamResponse | None = None

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for name, value in message.get("headers", []):
                key = name.decode("latin-1")
                if key.lower() in ("content-length", "transfer-encoding", "connection"):
                    continue
                response.headers.add(key, value.decode("latin-1"))
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            chunk = message.get("body", b"")
            if chunk:
                await response.write(chunk)
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    if response is None:
        raise web.HTTPInternalServerError()
    await response.write_eof()
    return response
