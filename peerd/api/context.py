"""Who a request is from, as the handlers read it: the caller an app's authentication put on the
request (`CALLER_KEY`: a link on the network listener, a run or the owner on `/mcp`), else the
local owner. Small and low in `api/` so route modules and the listener's guard need not import
the local app's handlers."""

from __future__ import annotations

from aiohttp import web

from peerd.operations import Caller

LOCAL = Caller.local()
CALLER_KEY = web.RequestKey("caller", Caller)


def caller_of(request: web.Request) -> Caller:
    """The link caller the network app's auth middleware set, else the local owner."""
    caller: Caller = request.get(CALLER_KEY, LOCAL)
    return caller
