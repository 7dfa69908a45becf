"""peerd's MCP endpoint, `/mcp`: the agent tools over MCP streamable HTTP, served by the daemon.

Four listeners serve it, each deciding who the caller is before the MCP server sees a byte:

- the **agent socket** (`Paths.agent_socket`): a live run's token only (`Authorization: Bearer`),
  as for `/v1/tools/*` there;
- the **owner socket**: a run's token acts as that run; no token acts as the owner (agents the
  owner started by hand, through `peerd mcp`);
- a **loopback TCP listener** (`start_tcp_listener`: plain HTTP on 127.0.0.1, a port picked at
  start; never the network listener), for the coder CLIs peerd starts, which speak HTTP but not
  over a Unix socket. It serves `/mcp` only, to a live run's token only: TCP has no peer
  credentials, so there is no owner identity here, and a missing, unknown or ended token is
  answered 401 with a typed error. `Host` must be `127.0.0.1:PORT` or `localhost:PORT` (a web
  page whose name was rebound to 127.0.0.1 sends its own name), a request with `Origin` is refused
  (`no_browsers_middleware`), bodies are capped at `MAX_BODY_BYTES`, and connections get the
  network listener's caps and deadlines (`peerd.api.listener.start_tcp`).

- the **network listener** (TLS, `--listen`; issue 29): outside agents (Claude Code in a terminal,
  Codex, any MCP client) with an access token from the box's OAuth sign-in. Who they are is
  `peerd.api.agent_signin.AgentSignin.authenticate`'s to say (`add_mcp_route(..., signed_in=)`): a
  link caller at the agent's level, fenced to its own threads; no or a refused token is 401 with
  `WWW-Authenticate: Bearer resource_metadata=...` (RFC 9728).

The caller is the run the token belongs to (`peerd.api.tools.caller_from_token`, exactly as for
`/v1/tools/*`), so a link's run gets the link's fence and cap here too. It travels to the tool
call in the ASGI scope (`mcp_server.CALLER_SCOPE_KEY`); each tool is the one `/v1/tools/{name}`
runs (`peerd.api.tools.invoke`).

The loopback port is bound first (`bind_loopback`), before the run manager is built: runs are
given its address (`PEERD_MCP_URL`), and `McpService` is built with what the tools act through
(`ToolServices`) once those exist; `start_tcp_listener` then serves the bound socket.

The SDK (`peerd.api.mcp_server`) costs about a second to import and some 22 MiB, which an idle
daemon does not pay: `McpService.warm` imports it in a thread when the first run starts (the
`RunStarting` event) or `/mcp` is first called, and `/mcp` waits for it. The SDK's handler is
ASGI; `asgi_call` runs it for one aiohttp request and buffers its answer (stateless JSON: one
message in, one JSON answer out, so nothing streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import structlog
from aiohttp import hdrs, web

from peerd.api import local
from peerd.api.app import SHUTDOWN_GATE, Handler, ShutdownGate, base_app, error_response
from peerd.api.asgi import asgi_scope
from peerd.api.listener import ListenerLimits, bind, start_tcp
from peerd.api.mcp_taskport import TaskPort
from peerd.api.routes import Example, Route, add_routes
from peerd.api.tools import ToolServices, caller_from_token, invoke
from peerd.errors import CapabilityDenied, PeerdError, Unavailable
from peerd.operations import Caller
from peerd.runtime.background import import_in_thread, in_daemon_thread

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

log = structlog.get_logger(__name__)

MCP_PATH = "/mcp"
TCP_HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0  # how long a request waits for the SDK's first import (about a second)
Access = Literal["owner", "agent", "tcp", "network"]
NO_TOKEN_HERE = (
    "This endpoint serves peerd's agent tools to peerd's runs only: pass the run token peerd gave "  # noqa: S105
    "this run (Authorization: Bearer)."
)


@dataclass(frozen=True)
class Loopback:
    """The loopback listener's sockets, bound to 127.0.0.1 on a port the kernel picked."""

    sockets: list[socket.socket]
    port: int

    @property
    def url(self) -> str:
        return f"http://{TCP_HOST}:{self.port}{MCP_PATH}"

    @property
    def hosts(self) -> frozenset[str]:
        """The Host values it answers (fail closed)."""
        return frozenset({f"{TCP_HOST}:{self.port}", f"localhost:{self.port}"})

    def close(self) -> None:
        """The sockets, when nothing serves them (a start that failed first); else a no-op."""
        for sock in self.sockets:
            sock.close()


async def bind_loopback() -> Loopback:
    sockets = await bind(TCP_HOST, 0)
    return Loopback(sockets, sockets[0].getsockname()[1])


class McpService:
    """The daemon's one MCP server: built off the event loop on first need, shared by the listeners."""

    def __init__(self, services: ToolServices, *, loopback: Loopback | None = None) -> None:
        self.services = services
        self.loopback = loopback
        self.served: Counter[Access] = Counter()  # authenticated requests, per listener kind
        self._manager: StreamableHTTPSessionManager | None = None
        self._failure: str | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str | None:
        """The loopback listener's `http://127.0.0.1:PORT/mcp`."""
        return None if self.loopback is None else self.loopback.url

    @property
    def tcp_hosts(self) -> frozenset[str]:
        return frozenset() if self.loopback is None else self.loopback.hosts

    def warm(self) -> None:
        """Start building the SDK server now (idempotent; needs the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve(), name="peerd.mcp")

    async def _serve(self) -> None:
        try:
            module = await import_in_thread("peerd.api.mcp_server")
            tools = await in_daemon_thread(module.tool_list, name="peerd-mcp-tools")
            manager = module.session_manager(self._invoke, tools, TaskPort(self.services))
        except Exception as exc:  # the endpoint says so; the rest of the daemon is unaffected
            log.exception("mcp.unavailable")
            self._failure = (
                f"peerd's MCP server could not start ({type(exc).__name__}); its log has the details."
            )
            self._ready.set()
            return
        async with manager.run():
            self._manager = manager
            self._ready.set()
            await asyncio.Event().wait()  # until close() cancels it

    async def _invoke(self, caller: Caller, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await invoke(self.services, caller, name, arguments)

    async def manager(self) -> StreamableHTTPSessionManager:
        self.warm()
        try:
            await asyncio.wait_for(self._ready.wait(), READY_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable("peerd's MCP server is still starting; retry in a moment.") from None
        if self._manager is None:
            raise Unavailable(self._failure or "peerd's MCP server has stopped.")
        return self._manager

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._manager = None


MCP_SERVICE = web.AppKey("mcp_service", McpService)
MCP_ACCESS: web.AppKey[Access] = web.AppKey("mcp_access")
# The network listener (`access="network"`): outside agents signed in over OAuth (issue 29). Who
# the caller is, or the 401 to answer, is peerd/api/agent_signin.py's (`AgentSignin.authenticate`).
SignedIn = Callable[[web.Request], Awaitable["Caller | web.Response"]]
NETWORK_CALLER: web.AppKey[SignedIn] = web.AppKey("mcp_network_caller")


def add_mcp_route(
    app: web.Application, service: McpService, access: Access, *, signed_in: SignedIn | None = None
) -> None:
    """Serve `/mcp` on `app` (before it is started); `access` says who may call (module docstring)."""
    app[MCP_SERVICE] = service
    app[MCP_ACCESS] = access
    if signed_in is not None:
        app[NETWORK_CALLER] = signed_in
    add_routes(app, (MCP_ROUTE,))


def _unauthorized(err: PeerdError) -> web.Response:
    response = error_response(err)
    response.set_status(401)
    response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return response


async def mcp_endpoint(request: web.Request) -> web.StreamResponse:
    service, access = request.app[MCP_SERVICE], request.app[MCP_ACCESS]
    ops = service.services.ops
    signed_in = await request.app[NETWORK_CALLER](request) if access == "network" else None
    if isinstance(signed_in, web.StreamResponse):  # no token, or one refused: 401 (RFC 9728)
        return signed_in
    header = request.headers.get(hdrs.AUTHORIZATION)
    if access == "tcp" and header is None:
        return _unauthorized(CapabilityDenied(NO_TOKEN_HERE))
    try:
        caller = signed_in or await caller_from_token(ops, header, owner_without_token=access == "owner")
    except CapabilityDenied as err:  # parent_not_active, link_revoked, no or malformed token
        if access == "tcp":
            return _unauthorized(err)
        raise
    request[local.CALLER_KEY] = caller  # the listener's guard counts the connection authenticated
    service.served[access] += 1
    if request.method != hdrs.METH_POST:
        return not_post()
    body = await request.read()  # capped by the app (payload_too_large)
    manager = await service.manager()
    return await asgi_call(manager.handle_request, request, body, {"peerd.caller": caller})


def not_post() -> web.Response:
    """405 for anything but POST, at every revision: 2026-07-28 has no GET stream and no sessions
    (GET and DELETE answer 405), and at 2025-11-25 a server without a standalone event stream
    answers GET 405 and a stateless one (no `Mcp-Session-Id` is ever issued) has no session to
    DELETE. (The SDK's stateless handler would hold a GET open as an empty stream, which a
    buffered answer never ends.)"""
    error = {"code": -32000, "message": "Method not allowed: /mcp takes POST only."}
    return web.json_response(
        {"jsonrpc": "2.0", "id": None, "error": error}, status=405, headers={hdrs.ALLOW: "POST"}
    )


class McpMessage(pydantic.BaseModel):
    """One JSON-RPC 2.0 message of MCP (the SDK validates the rest)."""

    model_config = pydantic.ConfigDict(extra="allow")
    jsonrpc: Literal["2.0"]
    method: str
    id: int | str | None = None
    params: dict[str, Any] | None = None


class McpErrorData(pydantic.BaseModel):
    code: int
    message: str
    data: Any = None


class McpError(pydantic.BaseModel):
    """The SDK's own answer to a message it cannot take (JSON-RPC 2.0 error, no id)."""

    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    error: McpErrorData


MCP_ROUTE = Route(
    "*",
    MCP_PATH,
    mcp_endpoint,
    "mcp",
    "The agent tools over MCP streamable HTTP (stateless, JSON answers).",
    "tools",
    body=McpMessage,
    run_token=True,
    errors=("parent_not_active", "link_revoked", "unavailable"),
    description="A notification is answered 202 without a body; the SDK answers what it cannot take itself "
    "(JSON-RPC errors: 400 unparsable or invalid, 405 not POST, 406 without this Accept, 415 not JSON).",
    headers={"Accept": "application/json, text/event-stream"},
    other={202: None, 400: McpError, 405: McpError, 406: McpError, 415: McpError},
    documented_methods=("POST",),
    example=Example(
        {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "thread_launch"}]}},
        body={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    ),
)


async def asgi_call(app: Any, request: web.Request, body: bytes, extra: dict[str, Any]) -> web.Response:
    """Run an ASGI app for one request whose body is already read; its answer, buffered."""
    scope = asgi_scope(request, extra, scheme="http")
    answered = asyncio.Event()
    delivered = False
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    try:
        await app(scope, receive, send)
    finally:
        answered.set()
    response = web.Response(status=int(start.get("status", 500)), body=b"".join(chunks))
    for name, value in start.get("headers", []):
        key = bytes(name).decode("latin-1")
        if key.lower() not in ("content-length", "transfer-encoding", "connection"):
            response.headers.add(key, bytes(value).decode("latin-1"))
    return response


@web.middleware
async def loopback_host_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The loopback listener answers only `Host: 127.0.0.1:PORT` or `localhost:PORT` (DNS rebinding)."""
    host = (request.headers.get(hdrs.HOST) or "").lower()
    if host not in request.app[MCP_SERVICE].tcp_hosts:
        return error_response(
            CapabilityDenied(
                "This listener answers only Host 127.0.0.1:PORT or localhost:PORT (its own port); "
                "the request named another host."
            )
        )
    return await handler(request)


async def start_tcp_listener(
    service: McpService, gate: ShutdownGate, limits: ListenerLimits, *, shutdown_timeout_s: float
) -> web.AppRunner:
    """Serve `/mcp` on the service's loopback sockets (`bind_loopback`)."""
    loopback = service.loopback
    if loopback is None:
        raise ValueError("the MCP service has no loopback sockets to serve")
    app = base_app()
    app.middlewares.insert(0, loopback_host_middleware)  # before anything reads the request
    app[SHUTDOWN_GATE] = gate
    add_mcp_route(app, service, "tcp")
    return await start_tcp(
        app,
        host=TCP_HOST,
        port=0,
        tls=None,
        limits=limits,
        advertise=(),
        shutdown_timeout_s=shutdown_timeout_s,
        sockets=loopback.sockets,
    )
