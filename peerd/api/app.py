"""The aiohttp applications: the local API (Unix socket) and the network listener (TCP + TLS).

Errors are mapped in one place (`error_middleware`): a `PeerdError` becomes `{code, message}` with
the status from `peerd.errors.HTTP_STATUS`; malformed or oversized bodies are typed 400/413; an
unexpected exception is logged with its traceback and answered `internal_error` without details.

A body is refused as `invalid_request` before any handler sees it when it is not JSON, holds
`NaN`/`Infinity` (not JSON, though Python's parser takes them), a number too long to convert, or
nests deeper than `MAX_JSON_DEPTH` (100,000 levels would otherwise end in a RecursionError here or
in whatever walks it later). Query strings are flat; their values are checked by the contract.

Every answer of both listeners carries the wire protocol's revision and the package version
(`Peerd-Protocol: 2`, `Peerd-Version: 0.1.0`; `stamp_protocol`), errors and streams included: a
peer reads what this daemon speaks from any answer (`peerd.peer.client`), and `caller_protocol`
reads what the caller speaks from its request (revision 1 when it sends no header).

Shutdown (`ShutdownGate`, one per daemon on every app): from the moment the daemon stops, a new
request is answered `shutting_down` (503) at once; a request in flight gets `ANSWER_GRACE_S` to
finish on its own, then is cancelled and answered `shutting_down` too: long-polls and forwarded
calls get a typed answer within a second, never a dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pydantic
import structlog
from aiohttp import web

from peerd import __version__
from peerd import contracts as c
from peerd.errors import (
    CapabilityDenied,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PeerdError,
    ShuttingDown,
    http_status,
)
from peerd.operations import Operations
from peerd.peer.links import LinkService
from peerd.tasks.delegation import Delegation

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_JSON_DEPTH = 64  # arrays and objects inside each other; no request of ours needs a tenth of it
ANSWER_GRACE_S = 0.3  # at shutdown, what a request in flight gets to finish before it is cut
CUT_WAIT_S = 0.5  # how long a cut handler may take to unwind before it is answered anyway
SHUTTING_DOWN = "peerd is shutting down; this request was not carried out. Retry once it is back."

OPERATIONS = web.AppKey("operations", Operations)
SAME_ORIGIN_PATHS: web.AppKey[frozenset[str]] = web.AppKey("same_origin_paths")
DESCRIPTOR = web.AppKey("descriptor", c.Descriptor)
LINKS = web.AppKey("links", LinkService)
# Delegated tasks (`/v1/tasks`, `POST /v1/watch`, the change feed): set where an app is built.
DELEGATION = web.AppKey("delegation", Delegation)
StatusFn = Callable[[], Awaitable[c.Status]]
STATUS_FN: web.AppKey[StatusFn] = web.AppKey("status_fn")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=pydantic.BaseModel)


def error_response(err: PeerdError) -> web.Response:
    return web.json_response(err.to_wire(), status=http_status(err.code), dumps=compact)


class ShutdownGate:
    """What a daemon's apps answer while it stops (see the module docstring)."""

    def __init__(self) -> None:
        self.closing = False
        self._cut = asyncio.Event()
        self._inflight: set[asyncio.Future[web.StreamResponse]] = set()

    def admit(self, handler: Awaitable[web.StreamResponse]) -> asyncio.Future[web.StreamResponse]:
        inner = asyncio.ensure_future(handler)
        self._inflight.add(inner)
        inner.add_done_callback(self._inflight.discard)
        return inner

    async def close(self, grace: float = ANSWER_GRACE_S) -> None:
        """Refuse new requests, give those in flight `grace`, then cut the rest; returns once
        every request was answered (or its handler would not unwind in `CUT_WAIT_S`)."""
        self.closing = True
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=grace)
        self._cut.set()
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=CUT_WAIT_S)


SHUTDOWN_GATE = web.AppKey("shutdown_gate", ShutdownGate)


@web.middleware
async def shutdown_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gate = request.app.get(SHUTDOWN_GATE)
    if gate is None:
        return await handler(request)
    if gate.closing:
        return error_response(ShuttingDown(SHUTTING_DOWN))
    inner = gate.admit(handler(request))
    cut: asyncio.Future[Any] = asyncio.ensure_future(gate._cut.wait())
    try:
        await asyncio.wait([inner, cut], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the client went away: so does its handler
        inner.cancel()
        with contextlib.suppress(BaseException):
            await inner
        raise
    finally:
        cut.cancel()
    if inner.done():
        return inner.result()  # the handler's own answer, or its exception for error_middleware
    inner.cancel()
    await asyncio.wait([inner], timeout=CUT_WAIT_S)
    return error_response(ShuttingDown(SHUTTING_DOWN))


def validation_message(exc: pydantic.ValidationError) -> str:
    """One line per problem, naming the wire field: what a person needs to fix the request."""
    parts = []
    for e in exc.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg']}")
    return "Invalid request: " + "; ".join(parts)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except PeerdError as err:
        return error_response(err)
    except pydantic.ValidationError as exc:
        return error_response(InvalidRequest(validation_message(exc)))
    except web.HTTPRequestEntityTooLarge:
        return error_response(PayloadTooLarge(f"The request body is larger than {MAX_BODY_BYTES} bytes."))
    except web.HTTPNotFound:
        return error_response(NotFound(f"No such endpoint: {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}."))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("api.unhandled", method=request.method, path=request.path)
        return error_response(PeerdError("peerd hit an internal error; its log has the details."))


@web.middleware
async def no_browsers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A page in a browser must never drive peerd: requests carrying `Origin` are refused, but for
    the paths an app serves to a person's browser (`SAME_ORIGIN_PATHS`: an agent's OAuth sign-in
    page, api/agent_signin.py) from a page of its own origin."""
    origin = request.headers.get("Origin")
    same_origin = origin == f"{request.scheme}://{request.host}"
    if same_origin and request.path in request.app.get(SAME_ORIGIN_PATHS, frozenset()):
        return await handler(request)
    if origin is not None:
        return error_response(
            CapabilityDenied("Requests from web pages (with an Origin header) are refused.")
        )
    return await handler(request)


def _no_constants(name: str) -> Any:
    raise InvalidRequest(f"The request body holds {name}, which is not JSON; send a finite number.")


def json_depth_exceeds(data: Any, limit: int) -> bool:
    """Whether parsed JSON nests arrays/objects more than `limit` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def parse_json(raw: bytes) -> Any:
    """Bytes as JSON within our limits, or a typed invalid_request saying what is wrong."""
    too_deep = InvalidRequest(f"The request body nests deeper than {MAX_JSON_DEPTH} levels.")
    try:
        data = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The request body is not valid JSON.") from None
    if json_depth_exceeds(data, MAX_JSON_DEPTH):
        raise too_deep
    return data


async def json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object (empty body = {}); anything else is a typed invalid_request."""
    if not request.can_read_body:
        data: Any = {}
    else:
        raw = await request.read()
        data = parse_json(raw) if raw.strip() else {}
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


async def json_body(request: web.Request, model: type[M]) -> M:
    return model.model_validate(await json_object(request))


def query_model(request: web.Request, model: type[M], renames: dict[str, str] | None = None) -> M:
    data: dict[str, Any] = {}
    for key, value in request.query.items():
        data[(renames or {}).get(key, key)] = value
    return model.model_validate(data)


def compact(body: Any) -> str:
    """JSON as answers send it: no spaces after `,` and `:` (about 6% of a thread's first page)."""
    return json.dumps(body, separators=(",", ":"))


def ok(model: c.Wire | dict[str, Any], status: int = 200) -> web.Response:
    body = model.wire() if isinstance(model, c.Wire) else model
    return web.json_response(body, status=status, dumps=compact)


async def stamp_protocol(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer says which wire revision and release this daemon runs (`on_response_prepare`:
    errors, long-polls and streams too)."""
    response.headers[c.PROTOCOL_HEADER] = str(c.WIRE_PROTOCOL)
    response.headers[c.VERSION_HEADER] = __version__


def caller_protocol(request: web.Request) -> int:
    """The wire revision the caller speaks: its `Peerd-Protocol` header, 1 without one (a peerd
    from before the header, or any other client); a value that is not a positive integer is 1."""
    raw = request.headers.get(c.PROTOCOL_HEADER, "")
    return int(raw) if raw.isdigit() and 0 < int(raw) < 1_000_000 else 1


def base_app() -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, shutdown_middleware, no_browsers_middleware],
        client_max_size=MAX_BODY_BYTES,
    )
    app.on_response_prepare.append(stamp_protocol)
    return app


async def descriptor(request: web.Request) -> web.Response:
    return ok(request.app[DESCRIPTOR])
