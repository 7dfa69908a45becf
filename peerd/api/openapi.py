"""The OpenAPI 3.1 document of peerd's HTTP API, generated from the route tables and the contract.

One source: the `Route` tuples the apps are built from (`peerd.api.routes`) and the pydantic models
they name; schemas come from `models_json_schema` (by alias, into `components/schemas`), never
written by hand. `LISTENERS` says which tables each listener serves, as `peerd.daemon` composes
them (a test compares it with a real daemon's apps).

The whole document (`document()`, what the owner socket serves and `docs/reference/openapi.json`
holds) covers every listener; each operation names the listeners that serve it
(`x-peerd-listeners`) and its credentials on each as security alternatives. `document("network")`
is what the network listener serves to a link: that listener's routes with only its credentials.

Errors are `ErrorBody {code, message, details?}` (OAuth's are RFC 6749's own): per operation, each
status lists the codes it can carry (an enum on `code`), the route's own and the generic ones
(`GENERIC`: a malformed body, a request from a web page, a daemon that is stopping ...), which every
route can return and which are said once in `info`. Every code, with its status, whether it is
transient, the typed fields it carries and what it means, is `x-peerd-errors`, computed from the
exception tree's registry (`peerd.errors.REGISTRY`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
from pydantic.json_schema import models_json_schema

from peerd import __version__
from peerd import contracts as c
from peerd.api import (
    a2a_routes,
    agent_signin_routes,
    approvals,
    gitwire,
    handoff,
    mcp_http,
    oauth,
    orchestrate,
    owner_routes,
    placement,
    remote,
    signin_requests,
    tools,
    waits,
)
from peerd.api.routes import Example, Route, View
from peerd.core.constants import INTERACTION_MODES, RUNTIME_MODES
from peerd.errors import HTTP_STATUS, REGISTRY
from peerd.peer.client import MODE_LIMIT_HEADER

SCHEMAS = "#/components/schemas/"


@dataclass(frozen=True)
class Listener:
    name: str
    url: str
    description: str
    routes: tuple[Route, ...]


LISTENERS: tuple[Listener, ...] = (
    Listener(
        "owner",
        "http://localhost",
        "The owner socket, `<home>/peerd.sock`: a 0600 Unix socket (HTTP/1.1 over it). Reaching it is the "
        "credential (`ownerSocket`); processes peerd started for runs are refused.",
        (
            *owner_routes.ROUTES,
            *gitwire.ROUTES,
            *orchestrate.ROUTES,
            *waits.ROUTES,
            *approvals.ROUTES,
            *placement.ROUTES,
            *handoff.ROUTES,
            *signin_requests.ROUTES,
            mcp_http.MCP_ROUTE,
            *a2a_routes.ROUTES,
        ),
    ),
    Listener(
        "network",
        "https://{host}:{port}",
        "The network listener (`--listen`): TLS with the box's self-signed certificate, which linked "
        "machines pin. `/v1/*` takes a link's access token (`linkBearer`, from `/oauth/token`); `/mcp` an "
        "outside agent's (`agentBearer`, signed in at `/oauth/authorize`).",
        (
            *oauth.ROUTES,
            *agent_signin_routes.ROUTES,
            *remote.ROUTES,
            *approvals.ROUTES,
            *handoff.BOX_ROUTES,
            mcp_http.MCP_ROUTE,
            *a2a_routes.NETWORK_ROUTES,
        ),
    ),
    Listener(
        "agent",
        "http://localhost",
        "The agent socket, `<home>/agent.sock`, the one socket a run is given: the agent tools, for a live "
        "run's token only (`runToken`).",
        (tools.TOOLS_ROUTE, mcp_http.MCP_ROUTE),
    ),
    Listener(
        "mcp",
        "http://127.0.0.1:{port}",
        "The loopback MCP listener (plain HTTP on 127.0.0.1, a port picked at start): `/mcp` for the coder "
        "CLIs peerd starts, a live run's token only; a missing or refused token is 401.",
        (mcp_http.MCP_ROUTE,),
    ),
)
BY_NAME = {listener.name: listener for listener in LISTENERS}

# Codes any route can return, by listener: (status, code, when).
GENERIC: dict[str, tuple[tuple[int, str, str], ...]] = {
    "*": (
        (403, "capability_denied", "the request carries Origin (a web page)"),
        (500, "internal_error", "a bug; the daemon's log has the details"),
        (503, "unavailable", "the daemon is still starting"),
        (503, "storage_unavailable", "the store cannot be written now (disk full, read-only, locked)"),
        (503, "shutting_down", "the daemon is stopping; nothing was done"),
    ),
    "body": (
        (400, "invalid_request", "the body is not a JSON object within the limits, or fails the model"),
        (413, "payload_too_large", "the body is larger than 2 MiB"),
    ),
    "query": ((400, "invalid_request", "a query parameter fails the model, or is unknown"),),
    "path": ((404, "not_found", "no route matches (an empty or unencoded path segment)"),),
    "owner": ((403, "capability_denied", "the caller is a process peerd started for a run"),),
    "network": ((403, "capability_denied", "the Host header is not one of this listener's names"),),
    "network/v1": (
        (401, "capability_denied", "no access token, or one this box no longer accepts"),
        (400, "invalid_request", f"a malformed {MODE_LIMIT_HEADER} header"),
    ),
    "network/mcp": (
        (
            401,
            "capability_denied",
            "no agent access token, or one this box no longer accepts (the "
            "WWW-Authenticate header names where to sign in, RFC 9728)",
        ),
    ),
    "agent": ((403, "capability_denied", "no run token, or not a Bearer one"),),
    "mcp": (
        (401, "capability_denied", "no run token, or one no live run has"),
        (401, "parent_not_active", "the run has ended"),
        (401, "link_revoked", "the link that started the run was revoked"),
        (403, "capability_denied", "the Host header is not 127.0.0.1:PORT or localhost:PORT"),
    ),
}

SECURITY_SCHEMES: dict[str, Any] = {
    "ownerSocket": {
        # OpenAPI has no scheme for Unix-socket peer credentials; mutualTLS, the scheme where the
        # transport authenticates the client, stands in for it. No header or certificate is read.
        "type": "mutualTLS",
        "description": "The owner socket itself: only its owner (mode 0600) can connect, and a process "
        "peerd started for a run is refused by its peer credentials. Nothing is sent.",
    },
    "linkBearer": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "peerd access token (Ed25519-signed, minutes long; refreshed at /oauth/token)",
        "description": "A link's access token. The box checks it and that the link is still active on "
        "every request, so a revocation takes effect at once.",
    },
    "agentBearer": {
        "type": "oauth2",
        "description": "An outside agent's access token from the box's OAuth sign-in (issue 29): "
        "authorization code with PKCE (S256), approved by a person with an agent pairing code "
        "(`peerd pair --for agent`). Refused once the agent is revoked; the token of a link is not one.",
        "flows": {
            "authorizationCode": {
                "authorizationUrl": "/oauth/authorize",
                "tokenUrl": "/oauth/token",
                "refreshUrl": "/oauth/token",
                "scopes": {},
            }
        },
    },
    "runToken": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "run token",
        "description": "The token peerd gave a run (PEERD_RUN_TOKEN_FILE): the call acts as that run, "
        "within its thread's modes and, for a link's run, the link's fence.",
    },
}

MODE_LIMIT = {
    "name": MODE_LIMIT_HEADER,
    "in": "header",
    "required": False,
    "description": "Network listener: narrow this call to the calling agent's own modes, "
    "`<runtimeMode>/<interactionMode>` (modes only ever narrow).",
    "schema": {
        "type": "string",
        "pattern": f"^\\s*({'|'.join(RUNTIME_MODES)})(/({'|'.join(INTERACTION_MODES)}))?\\s*$",
    },
}

# What the query parameters many routes share mean (the models' own descriptions win).
PARAMETERS = {
    "environmentId": "run it on this linked environment (its id or label) through the link",
    "cursor": "the previous page's nextCursor",
    "limit": "at most this many",
    "timeout": "long-poll: wait at most this many seconds for a change",
    "after": "only what came after this cursor",
    "run": "the run (default: the thread's latest)",
}


@dataclass(frozen=True)
class Operation:
    """One operation of the document: a route (or one variant of it) on its listeners."""

    route: Route
    method: str
    path: str
    listeners: tuple[str, ...]
    op_id: str
    summary: str
    description: str
    body: type[pydantic.BaseModel] | None
    answer: Any
    example: Example | None


def operations(view: View | None = None) -> list[Operation]:
    """Every operation, in table order, with the listeners (of `view`, or all) that serve it."""
    where: dict[tuple[str, str], list[str]] = {}
    first: dict[tuple[str, str], Route] = {}
    for listener in LISTENERS:
        if view not in (None, "owner") and listener.name != view:
            continue
        for route in listener.routes:
            for method in route.methods:
                key = (method, route.document_path)
                if key in first and first[key] is not route:
                    raise ValueError(f"{method} {route.path} is two different routes")
                first.setdefault(key, route)
                where.setdefault(key, []).append(listener.name)
    ops = []
    for (method, path), route in first.items():
        served = tuple(where[(method, path)])
        if not route.variants:
            ops.append(
                Operation(
                    route, method, path, served, route.name, route.summary, route.description,
                    route.body, route.answer, route.example,
                )
            )  # fmt: skip
        for v in route.variants:
            head, _, rest = " ".join(v.description.split()).partition(". ")
            ops.append(
                Operation(
                    route, method, re.sub(r"\{[^}]+\}", v.value, path), served, f"{route.name}_{v.value}",
                    head.rstrip(".") + ".", rest, v.body, v.answer, v.example,
                )
            )  # fmt: skip
    return ops


def _security(op: Operation) -> list[dict[str, list[str]]]:
    """Who may call, as alternatives: each listener's credential (`{}`: none needed)."""
    none: list[str] = []
    alternatives: list[dict[str, list[str]]] = []
    for name in op.listeners:
        if name == "owner":
            found = [{"ownerSocket": none}]
            if op.route.run_token:
                found.append({"ownerSocket": none, "runToken": none})
        elif name == "network" and op.path == mcp_http.MCP_PATH:
            found = [{"agentBearer": none}]  # an outside agent signed in over OAuth (api/agent_signin.py)
        elif name == "network":
            found = [{"linkBearer": none}] if op.path.startswith("/v1/") else [{}]
        else:
            found = [{"runToken": none}]
        alternatives.extend(f for f in found if f not in alternatives)
    return alternatives


def _errors(op: Operation) -> list[tuple[int, str, type[pydantic.BaseModel]]]:
    """(status, code, body model) of every error this operation can answer, sorted."""
    route = op.route
    kinds = ["*", *op.listeners]
    if op.body is not None:
        kinds.append("body")
    if route.query is not None:
        kinds.append("query")
    if "{" in op.path:
        kinds.append("path")
    if "network" in op.listeners and op.path.startswith("/v1/"):
        kinds.append("network/v1")
    if "network" in op.listeners and op.path == "/mcp":
        kinds.append("network/mcp")
    found: set[tuple[int, str, type[pydantic.BaseModel]]] = {
        (status, code, c.ErrorBody) for kind in kinds for status, code, _ in GENERIC.get(kind, ())
    }
    for code in route.errors:
        found.add((route.error_status[code], code, route.error_body))
    return sorted(found, key=lambda e: (e[0], e[1], e[2].__name__))


def _params(
    op: Operation, query_schemas: dict[type[pydantic.BaseModel], dict[str, Any]]
) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    given = op.example.path if op.example is not None else {}
    for name in re.findall(r"\{([^}]+)\}", op.path):
        param: dict[str, Any] = {"name": name, "in": "path", "required": True}
        param["description"] = op.route.params.get(name, name)
        param["schema"] = {"type": "string", "minLength": 1}
        if name in given:
            param["example"] = given[name]
        params.append(param)
    if op.route.query is not None:
        schema = query_schemas[op.route.query]
        required = set(schema.get("required", []))
        wire_name = {alias: wire for wire, alias in op.route.renames.items()}
        example = dict(op.example.query or {}) if op.example else {}
        for alias, prop in schema["properties"].items():
            name = wire_name.get(alias, alias)
            param = {"name": name, "in": "query", "required": alias in required}
            if text := prop.get("description", PARAMETERS.get(name)):
                param["description"] = text
            param["schema"] = _query_schema(prop)
            if param["schema"].get("type") == "array":
                param["style"], param["explode"] = "form", False  # `a,b`, one parameter
            if name in example:
                param["example"] = example[name]
            params.append(param)
    for name, value in op.route.headers.items():
        params.append({"name": name, "in": "header", "required": True, "schema": {"enum": [value]}})
    if "network" in op.listeners and op.path.startswith("/v1/"):
        params.append(MODE_LIMIT)
    return params


def _query_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """A property's schema as a query parameter: no null (an absent parameter is the null), no title."""
    schema = {k: v for k, v in prop.items() if k not in ("title", "description")}
    if "anyOf" in schema:
        kept = [s for s in schema.pop("anyOf") if s.get("type") != "null"]
        schema = {**(kept[0] if len(kept) == 1 else {"anyOf": kept}), **schema}
    if schema.get("default", "") is None:
        del schema["default"]
    return schema


def _schema_of(model: Any, refs: dict[tuple[Any, str], Any], mode: str) -> dict[str, Any]:
    if model is None:
        return {"type": "object"}
    return dict(refs[(model, mode)])


def _error_schema(group: dict[type[pydantic.BaseModel], list[str]], refs: dict[tuple[Any, str], Any]) -> Any:
    shapes = []
    for model, codes in group.items():
        field = "code" if "code" in model.model_fields else "error"
        ref = _schema_of(model, refs, "serialization")
        shapes.append({"allOf": [ref], "properties": {field: {"enum": codes}}, "required": [field]})
    return shapes[0] if len(shapes) == 1 else {"oneOf": shapes}


def _responses(op: Operation, refs: dict[tuple[Any, str], Any]) -> dict[str, Any]:
    route, example = op.route, op.example
    responses: dict[str, Any] = {}
    for status in (route.status, *route.also):
        content: dict[str, Any] = {"schema": _schema_of(op.answer, refs, "serialization")}
        if example is not None and status == route.status:
            content["example"] = example.answer
        what = "Done." if status == route.status else "Done before (a replay of the same clientRequestId)."
        responses[str(status)] = {"description": what, "content": {route.media_type: content}}
    by_status: dict[int, dict[type[pydantic.BaseModel], list[str]]] = {}
    for status, code, model in _errors(op):
        by_status.setdefault(status, {}).setdefault(model, []).append(code)
    for status, group in sorted(by_status.items()):
        codes = [code for codes in group.values() for code in codes]
        content = {"application/json": {"schema": _error_schema(group, refs)}}
        if route.media_type == "text/html":  # a page for people: what is wrong is a page too
            content["text/html"] = {"schema": {"type": "string"}}
        responses[str(status)] = {"description": ", ".join(f"`{code}`" for code in codes), "content": content}
    for status, extra in sorted(route.other.items()):
        if extra is None:
            responses[str(status)] = {"description": "Accepted; no body."}
            continue
        shape = _schema_of(extra, refs, "serialization")
        known = responses.setdefault(str(status), {"description": extra.__doc__ or extra.__name__})
        content = known.setdefault("content", {"application/json": {"schema": shape}})["application/json"]
        if content["schema"] != shape:
            content["schema"] = {"oneOf": [content["schema"], shape]}
            known["description"] += f"; or the SDK's own `{extra.__name__}`"
    return dict(sorted(responses.items()))


def _operation(
    op: Operation, refs: dict[tuple[Any, str], Any], queries: dict[Any, dict[str, Any]]
) -> dict[str, Any]:
    route = op.route
    spec: dict[str, Any] = {"operationId": op.op_id, "summary": op.summary}
    if op.description:
        spec["description"] = op.description
    spec["tags"] = [route.tag]
    spec["x-peerd-listeners"] = list(op.listeners)
    spec["security"] = _security(op)
    if params := _params(op, queries):
        spec["parameters"] = params
    if op.body is not None:
        media: dict[str, Any] = {"schema": _schema_of(op.body, refs, "validation")}
        if op.example is not None and op.example.body is not None:
            media["example"] = dict(op.example.body)
        kind = "application/x-www-form-urlencoded" if route.form else "application/json"
        required = any(f.is_required() for f in op.body.model_fields.values())
        spec["requestBody"] = {"required": required, "content": {kind: media}}
    spec["responses"] = _responses(op, refs)
    return spec


def _models(ops: Iterable[Operation]) -> list[tuple[type[pydantic.BaseModel], str]]:
    found: set[tuple[type[pydantic.BaseModel], str]] = set()
    for op in ops:
        if op.body is not None:
            found.add((op.body, "validation"))
        if op.answer is not None:
            found.add((op.answer, "serialization"))
        found.update((model, "serialization") for _, _, model in _errors(op))
        found.update((model, "serialization") for model in op.route.other.values() if model is not None)
    return sorted(found, key=lambda m: (m[0].__module__, m[0].__qualname__, m[1]))


@functools.cache
def document(view: View | None = None) -> dict[str, Any]:
    """The OpenAPI document: every listener (`None`, the owner socket's), or the network view."""
    ops = operations(view)
    keyed, defs = models_json_schema(_models(ops), by_alias=True, ref_template=SCHEMAS + "{model}")  # type: ignore[arg-type]
    refs: dict[tuple[Any, str], Any] = dict(keyed.items())
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    queries: dict[Any, dict[str, Any]] = {}
    for model in {op.route.query for op in ops if op.route.query is not None}:
        schema = model.model_json_schema(by_alias=True, ref_template=SCHEMAS + "{model}")
        schemas.update(schema.pop("$defs", {}))
        queries[model] = schema
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs, queries)
    served = [listener for listener in LISTENERS if any(listener.name in op.listeners for op in ops)]
    used = {name for op in ops for alternative in _security(op) for name in alternative}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "peerd",
            "version": __version__,
            "description": _INTRO + _generic_text(served),
            "x-peerd-protocol-version": c.PROTOCOL_VERSION,
        },
        "servers": [_server(listener) for listener in served],
        "tags": [{"name": tag} for tag in dict.fromkeys(op.route.tag for op in ops)],
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {k: v for k, v in SECURITY_SCHEMES.items() if k in used},
        },
        "x-peerd-error-statuses": dict(sorted(HTTP_STATUS.items())),
        "x-peerd-errors": error_codes(),
    }


def error_codes() -> dict[str, dict[str, Any]]:
    """Every error code from the registry: its status, whether retrying later can succeed
    (`transient`), whether it makes a link unusable (`endsLink`), what the CLI exits with on it
    (`exitCode`), the RFC 6749 `error` the OAuth endpoints answer it with (`oauthError`, for a
    class that declares one), the typed fields it carries in
    `details` with their values, and what it means (its class's docstring)."""
    found: dict[str, dict[str, Any]] = {}
    for code, cls in sorted(REGISTRY.items()):
        entry: dict[str, Any] = {
            "status": cls.http_status,
            "transient": cls.transient,
            "endsLink": cls.ends_link,
            "exitCode": cls.exit_code,
        }
        if cls.oauth_error is not None and "oauth_error" in vars(cls):
            entry["oauthError"] = cls.oauth_error
        if cls.wire_fields:
            entry["details"] = {name: list(values) for name, values in cls.wire_fields.items()}
        entry["description"] = " ".join((cls.__doc__ or "").split("\n\n")[0].split())  # 1st paragraph
        found[code] = entry
    return found


def served(view: View) -> dict[str, Any]:
    """What `GET /v1/openapi.json` answers: the whole document on the owner socket."""
    return document(None if view == "owner" else view)


_INTRO = """\
peerd's HTTP API: the owner socket, the network listener (linked machines), the agent socket and \
the loopback MCP listener. Each operation names the listeners that serve it (`x-peerd-listeners`); \
its security alternatives are those listeners' credentials. Bodies and answers are JSON with \
camelCase fields; unknown fields are refused. Errors are `{code, message}` with a stable `code` \
(and, for a few codes, typed `details`); `x-peerd-errors` describes every code, \
`x-peerd-error-statuses` maps each to its status.

"""


def _generic_text(listeners: list[Listener]) -> str:
    names = {
        "*",
        "body",
        "query",
        "path",
        "network/v1",
        "network/mcp",
        *(listener.name for listener in listeners),
    }
    lines = ["Codes any operation can return (listed in each operation's responses too):", ""]
    for kind, entries in GENERIC.items():
        if kind in names:
            where = {"*": "any", "body": "with a body", "query": "with a query", "path": "with a path id"}
            for status, code, when in entries:
                lines.append(f"- {status} `{code}` ({where.get(kind, kind)}): {when}")
    return "\n".join(lines) + "\n"


def _server(listener: Listener) -> dict[str, Any]:
    server: dict[str, Any] = {"url": listener.url, "description": listener.description}
    server["x-peerd-listener"] = listener.name
    variables = {"host": "127.0.0.1", "port": "7433"} if listener.name == "network" else {"port": "0"}
    names = re.findall(r"\{([^}]+)\}", listener.url)
    if names:
        server["variables"] = {name: {"default": variables[name]} for name in names}
    return server
