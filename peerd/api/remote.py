"""The network listener's API: the descriptor, the OAuth endpoints, and `/v1/*` for links.

Every `/v1/*` request carries a link's access token. The box checks the signature, the audience
and the expiry, and then that the client is still active, so a revocation takes effect on the
very next request, access tokens included. The caller's access level and the narrower of its
mode cap and the `X-Peerd-Mode-Limit` header it sends are enforced in `peerd.operations`.

`GET /v1/link` answers the link as the box sees it (the laptop's live status check), with this
box's capacity report for placement (peerd/placement/: live runs, max_runs, load, memory, providers,
projects by repository key, preference). Links may read
projects and threads, launch threads (capped), and send to or interrupt the
threads they started. Projects, archiving, pairing and clients stay local.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api import feedroutes, gitwire, owner_routes
from peerd.api.agent_signin import AgentSignin
from peerd.api.agent_signin_routes import add_agent_signin_routes
from peerd.api.app import DELEGATION, DESCRIPTOR, OPERATIONS, Handler, base_app, error_response, ok
from peerd.api.client_metadata import MetadataFetcher
from peerd.api.context import CALLER_KEY
from peerd.api.listener import host_middleware
from peerd.api.oauth import PAIRING_FAILURES_PER_WINDOW, PAIRING_WINDOW_S, add_oauth_routes
from peerd.api.routes import DESCRIPTOR_ROUTE, OPENAPI_ROUTE, VIEW, Example, Route, add_routes
from peerd.core.access import LinkContext, cap_for, parse_mode_limit
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.errors import CapabilityDenied, PeerdError
from peerd.operations import Caller, Operations
from peerd.peer.client import MODE_LIMIT_HEADER
from peerd.peer.ratelimit import SlidingWindow
from peerd.peer.tokens import TokenRejected, VerifiedTokens
from peerd.store import clients
from peerd.store.db import Database

if TYPE_CHECKING:
    from peerd.tasks.delegation import Delegation

log = structlog.get_logger(__name__)

AGENT_PATHS = ("/v1/a2a/",)  # the /v1 paths a signed-in agent may call (its /mcp is elsewhere)
NOT_ACCEPTED = "This environment no longer accepts this link: it was revoked or expired here. Link again."


def link_auth_middleware(
    db: Database, signing_key: Ed25519PrivateKey, env_id: str, clock: Callable[[], float]
) -> Callable[[web.Request, Handler], object]:
    tokens = VerifiedTokens(signing_key.public_key(), env_id=env_id, clock=clock)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return _unauthorized(
                CapabilityDenied("This API needs a link; pair with `peerd pair` and `peerd link`.")
            )
        try:
            claims = tokens.verify(header.removeprefix("Bearer ").strip())
        except TokenRejected as exc:
            log.info("link.token_rejected", reason=str(exc))
            return _unauthorized(CapabilityDenied(NOT_ACCEPTED))
        now = clock()
        client = await clients.active_client(db, claims.client_id, now=now)
        # A signed-in agent's token opens /mcp and the A2A face (agents speak either), nothing else.
        agent = client is not None and client.kind == "agent"
        if (
            client is None
            or (agent and not request.path.startswith(AGENT_PATHS))
            or client.kind not in ("link", "agent")
        ):
            return _unauthorized(CapabilityDenied(NOT_ACCEPTED))
        try:
            limit = parse_mode_limit(request.headers.get(MODE_LIMIT_HEADER))
        except PeerdError as err:
            return error_response(err)
        await clients.touch(db, client.id, address=request.remote or "", now=now)
        link = LinkContext(
            client_id=client.id,
            label=client.label,
            access=client.access,
            cap=cap_for(client.access, limit),
            own_threads_only=agent,  # an agent sees only the threads it started
        )
        request[CALLER_KEY] = Caller.for_link(link)
        return await handler(request)

    return middleware


async def link_self(request: web.Request) -> web.Response:
    """The calling link as this box sees it; answering at all says the link is still accepted."""
    link = request[CALLER_KEY].link
    if link is None:  # the auth middleware sets a link caller on every /v1 request
        raise CapabilityDenied("This API needs a link; pair with `peerd pair` and `peerd link`.")
    desc = request.app[DESCRIPTOR]
    placement = request.app[OPERATIONS].placement  # what this box has room for (peerd/placement/)
    capacity = None if placement is None else await placement.local_capacity()
    return ok(
        c.LinkSelf(
            environment_id=desc.environment_id,
            client_id=link.client_id,
            label=link.label,
            access=link.access,
            capacity=capacity,
        )
    )


def _unauthorized(err: PeerdError) -> web.Response:
    response = error_response(err)
    response.set_status(401)
    response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return response


LINK_SELF = Route(
    "GET",
    "/v1/link",
    link_self,
    "link_self",
    "The calling link as this box sees it (answering at all says it is still accepted).",
    "links",
    answer=c.LinkSelf,
    example=Example(
        {"environmentId": ex.BOX, "clientId": ex.CLI, "label": "laptop", "access": "approval-required"}
    ),
)
# The owner's routes a link may call too: reads (threads and tasks), launches (capped), and sends to, waits on,
# interrupts and archives of the threads it started (the fence is in `peerd.operations`).
LINKED = frozenset(
    {"project_list", "project_show", "thread_list", "thread_launch", "thread_show", "thread_read"}
    | {"thread_send", "thread_wait", "thread_interrupt", "thread_archive", "thread_events", "run_watch"}
    | {"task_list"}
    | {"thread_diff"}  # only of the threads the link started (`Operations.thread_diff`)
)
ROUTES: tuple[Route, ...] = (
    DESCRIPTOR_ROUTE,
    OPENAPI_ROUTE,
    LINK_SELF,
    *(route for route in owner_routes.ROUTES if route.name in LINKED),
    *feedroutes.ROUTES,
    *gitwire.ROUTES,
)


def network_app(
    ops: Operations,
    desc: c.Descriptor,
    *,
    delegation: Delegation,
    signing_key: Ed25519PrivateKey,
    clock: Clock = SYSTEM_CLOCK,
    allow_private_metadata: bool = False,
) -> web.Application:
    app = base_app()
    app.middlewares.append(host_middleware)  # a foreign Host on a loopback listener: refused first
    app.middlewares.append(link_auth_middleware(ops.db, signing_key, desc.environment_id, clock))  # type: ignore[arg-type]
    app[OPERATIONS] = ops
    app[DELEGATION] = delegation  # the watch and the change feed
    app[DESCRIPTOR] = desc
    app[VIEW] = "network"
    # One brake on wrong pairing codes, for links' redemptions and agents' sign-in pages alike.
    pairing_limit = SlidingWindow(PAIRING_FAILURES_PER_WINDOW, PAIRING_WINDOW_S, clock.monotonic)
    signin = AgentSignin(
        db=ops.db,
        signing_key=signing_key,
        env_id=desc.environment_id,
        label=desc.label,
        clock=clock,
        pairing_limit=pairing_limit,
        fetcher=MetadataFetcher(allow_private=allow_private_metadata),
    )
    add_oauth_routes(
        app,
        db=ops.db,
        signing_key=signing_key,
        env_id=desc.environment_id,
        label=desc.label,
        clock=clock,
        pairing_limit=pairing_limit,
        code_exchange=signin.exchange,
    )
    add_agent_signin_routes(app, signin)  # outside agents sign in to /mcp (issue 29)
    add_routes(app, ROUTES)
    return app
