"""The route registry: each HTTP route once, with what describes it.

Every api module keeps its routes as a tuple of `Route`s next to its handlers (`local.ROUTES`,
`remote.ROUTES`, `gitwire.ROUTES`, ...). The aiohttp apps are built from those tuples
(`add_routes`), and the OpenAPI document (`peerd.api.openapi`) is generated from the same tuples:
method, path, the pydantic models of the body, the query and the answer, the success status, the
error codes the route can return, whether a run token matters, and an example. Nothing here is a
second copy of a schema: the models are the contract's own (`peerd.contracts`), and the few
answers that are not models (`{"items": [...]}` lists) are described by the generic `Items`.

Codes listed in a route are checked against `peerd.errors.HTTP_STATUS` (a test), so each has a
status; the codes every route can return (malformed body, Origin, shutdown, ...) are listed once,
in `peerd.api.openapi`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import pydantic
from aiohttp import web

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import descriptor, ok
from peerd.errors import HTTP_STATUS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

# Codes a call that names `environmentId` can add: it is forwarded to that linked environment, which
# may refuse it (with the same route's own codes) or not be reached.
FORWARDING = (
    "not_linked",
    "link_revoked",
    "unreachable",
    "pin_mismatch",
    "not_a_peerd",
    "wrong_environment",
    "incompatible",
)


class Items(c.Wire, Generic[T]):
    """`{"items": [...]}`: a whole list (not paged)."""

    items: list[T]


@dataclass(frozen=True)
class Example:
    """One request and its answer, for the reference (`docs/reference/api.md`)."""

    answer: Any
    body: Mapping[str, Any] | None = None
    query: Mapping[str, str] | None = None
    path: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """One concrete path of a templated route (`/v1/tools/{name}`: one per tool), described alone."""

    value: str
    description: str
    body: type[pydantic.BaseModel]
    answer: Any
    example: Example | None = None


@dataclass(frozen=True)
class Route:
    method: str  # GET, POST, DELETE; "*" for a route aiohttp answers on every method (`/mcp`)
    path: str  # aiohttp's pattern: /v1/threads/{id}
    handler: Handler
    name: str  # the operationId
    summary: str
    tag: str
    body: type[pydantic.BaseModel] | None = None
    query: type[pydantic.BaseModel] | None = None
    renames: Mapping[str, str] = field(default_factory=dict)  # query name on the wire -> model field alias
    answer: Any = None  # a pydantic model (or type) of the 2xx body; None: any JSON object
    status: int = 200
    also: tuple[int, ...] = ()  # other success statuses (a replayed launch is 200, not 201)
    errors: tuple[str, ...] = ()  # codes this route can return besides the generic ones
    run_token: bool = False  # takes `Authorization: Bearer <run token>` (agent tools)
    form: bool = False  # the body is application/x-www-form-urlencoded (OAuth)
    error_body: type[pydantic.BaseModel] = c.ErrorBody
    error_status: Mapping[str, int] = field(default_factory=lambda: HTTP_STATUS)  # code -> status
    params: Mapping[str, str] = field(default_factory=dict)  # path parameter -> what it names
    headers: Mapping[str, str] = field(default_factory=dict)  # a request header it needs -> its value
    other: Mapping[int, type[pydantic.BaseModel] | None] = field(default_factory=dict)  # more answers
    description: str = ""
    example: Example | None = None
    variants: tuple[Variant, ...] = ()
    documented_methods: tuple[str, ...] = ()  # for "*": the methods the document describes
    media_type: str = "application/json"  # of the 2xx answer (the A2A REST binding's is its own)

    @property
    def methods(self) -> tuple[str, ...]:
        return self.documented_methods if self.method == "*" else (self.method,)

    @property
    def document_path(self) -> str:
        """The path as the document (and aiohttp's `canonical`) says it: `{tail:.*}` is `{tail}`."""
        return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", self.path)


ROUTES_KEY: web.AppKey[list[Route]] = web.AppKey("routes", list)


def add_routes(app: web.Application, routes: tuple[Route, ...]) -> None:
    """Register `routes` on `app` (in order) and remember them (`registered`)."""
    app.setdefault(ROUTES_KEY, [])
    for route in routes:
        if route.method == "GET":  # as `add_get`: HEAD is answered too
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
        app[ROUTES_KEY].append(route)


def registered(app: web.Application) -> list[Route]:
    found: list[Route] | None = app.get(ROUTES_KEY)
    return [] if found is None else list(found)


def without(model: type[pydantic.BaseModel], *names: str, name: str) -> type[pydantic.BaseModel]:
    """`model` less some fields, as its own model: a body whose other fields come from the path."""
    fields: dict[str, Any] = {
        key: (info.annotation, info) for key, info in model.model_fields.items() if key not in names
    }
    derived: type[pydantic.BaseModel] = pydantic.create_model(name, __base__=c.Input, **fields)
    return derived


def wrapped(name: str, model: type[pydantic.BaseModel] | None) -> type[pydantic.BaseModel]:
    """`{"result": <model's body>}` as its own model, named after `name` (an agent tool's answer)."""
    title = "".join(part.title() for part in name.split("_")) + "Answer"
    inner: Any = dict[str, Any] if model is None else model
    answer: type[pydantic.BaseModel] = pydantic.create_model(title, __base__=c.Wire, result=(inner, ...))
    return answer


# --- routes every listener serves -------------------------------------------------------------

View = Literal["owner", "network"]
VIEW: web.AppKey[View] = web.AppKey("openapi_view")  # which document an app serves (owner: the whole)


async def openapi_json(request: web.Request) -> web.Response:
    """The OpenAPI document: the whole API on the owner socket, a link's routes on the network."""
    from peerd.api import openapi  # noqa: PLC0415  # it reads every route table, this one included

    return ok(openapi.served(request.app.get(VIEW, "owner")))


DESCRIPTOR_ROUTE = Route(
    "GET",
    "/.well-known/peerd",
    descriptor,
    "descriptor",
    "What this peerd is (anyone may ask; no credentials).",
    "daemon",
    answer=c.Descriptor,
    example=Example(ex.DESCRIPTOR),
)
OPENAPI_ROUTE = Route(
    "GET",
    "/v1/openapi.json",
    openapi_json,
    "openapi",
    "This API's OpenAPI 3.1 document (on the network listener: the routes a link may call).",
    "daemon",
    description="Generated from the route tables and the contract's models; `docs/reference/openapi.json`.",
    example=Example({"openapi": "3.1.0", "info": {"title": "peerd", "version": "0.1.0"}, "paths": {}}),
)
