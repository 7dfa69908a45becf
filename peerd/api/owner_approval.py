"""Approval in the console instead of a typed code (issue 29): the sign-in page's "Ask the owner"
stores a request (store/signin_requests.py) and shows a page that looks again every few seconds;
once the owner decided (`POST /v1/agent-signins/{id}/decision`, the console's Connections page), its
next look sends the browser back to the agent with a code, or with `access_denied`. Only the
browser that asked (its cookie) collects, and only once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import structlog
from aiohttp import web

from peerd.api import signin_page
from peerd.api.client_metadata import AgentClient
from peerd.core import agent_oauth as rules
from peerd.errors import RateLimited
from peerd.peer.ratelimit import SlidingWindow
from peerd.store import signin_requests as requests_store
from peerd.store.db import Database

log = structlog.get_logger(__name__)

ASKS_PER_MINUTE = 10


class Signin(Protocol):
    """What of `agent_signin.AgentSignin` this needs."""

    db: Database
    label: str
    clock: Callable[[], float]
    ask_limit: SlidingWindow

    def page(self, request: web.Request, status: int, **kw: Any) -> web.Response: ...

    def redirect(self, request: web.Request, uri: str, params: dict[str, str | None]) -> web.Response: ...


async def ask(
    signin: Signin,
    request: web.Request,
    client: AgentClient,
    redirect_uri: str,
    checked: rules.AuthorizeRequest,
) -> web.Response:
    if not signin.ask_limit.hit("ask"):
        return signin.page(
            request, 429, error="Too many sign-ins were asked for this minute; try again soon."
        )
    try:
        asked = await requests_store.ask(
            signin.db,
            oauth_client_id=client.client_id,
            client_name=client.name,
            redirect_uri=redirect_uri,
            code_challenge=checked.code_challenge,
            resource=checked.resource,
            oauth_state=checked.state,
            now=signin.clock(),
        )
    except RateLimited as exc:
        return signin.page(request, 429, error=exc.message)
    log.info("agent_signin.asked", request_id=asked.request.id, oauth_client_id=client.client_id[:200])
    return signin_page.render_waiting(
        request, label=signin.label, request_id=asked.request.id, poll_secret=asked.poll_secret
    )


async def wait(signin: Signin, request: web.Request) -> web.Response:
    """The waiting page's poll: wait again, go back to the agent with a code (approved) or
    `access_denied` (denied), or say the request is gone. Only the browser that asked (its
    cookie) collects, and only once."""
    request_id = request.query.get("request", "")[:64]
    secret = request.cookies.get(signin_page.WAIT_COOKIE, "")
    outcome = (
        await requests_store.collect(signin.db, request_id, secret, now=signin.clock())
        if request_id and secret
        else requests_store.Outcome("gone")
    )
    if outcome.state == "pending":
        return signin_page.render_waiting(
            request, label=signin.label, request_id=request_id, poll_secret=None
        )
    if outcome.state == "approved" and outcome.redirect_uri is not None:
        log.info("agent_signin.approved_in_console", request_id=request_id)
        return signin.redirect(
            request, outcome.redirect_uri, {"code": outcome.code, "state": outcome.oauth_state}
        )
    if outcome.state == "denied" and outcome.redirect_uri is not None:
        return signin.redirect(
            request,
            outcome.redirect_uri,
            {
                "error": "access_denied",
                "error_description": "The owner denied this sign-in.",
                "state": outcome.oauth_state,
            },
        )
    return signin.page(
        request,
        400,
        error="This sign-in request is unknown, expired or already answered; "
        "start the sign-in again from the agent.",
    )
