"""The ASGI scope of one aiohttp request: how peerd runs an SDK's ASGI app (the MCP SDK's
`/mcp` handler, the a2a-sdk's routes) behind its own listeners and auth, one request at a time."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def asgi_scope(request: web.Request, extra: dict[str, Any], *, scheme: str) -> dict[str, Any]:
    """`request` as an ASGI `http` scope; `extra` adds what the app reads beside it (the caller)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
        "query_string": request.query_string.encode("latin-1"),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": None,
        "server": None,
        "state": {},
        **extra,
    }
