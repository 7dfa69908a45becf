"""The change feed's routes on the network listener (links only): `POST /v1/feed/subscription`
and `POST /v1/feed/changes`, answered by the box's `FeedHub` (`peerd.tasks.feed`) from the
authenticated link. The wire shapes: `peerd.tasks.feedwire`."""

from __future__ import annotations

from aiohttp import web

from peerd.api.app import OPERATIONS, json_body, ok
from peerd.api.local import caller_of
from peerd.errors import NotFound
from peerd.tasks.feed import FeedHub
from peerd.tasks.feedwire import CHANGES_PATH, SUBSCRIPTION_PATH, FeedPoll, FeedSubscribe


def _hub(request: web.Request) -> FeedHub:
    delegation = request.app[OPERATIONS].delegation
    if delegation is None:
        raise NotFound("Delegation is not available in this daemon.")
    return delegation.ender.watcher.hub


async def feed_subscription(request: web.Request) -> web.Response:
    req = await json_body(request, FeedSubscribe)
    return ok(await _hub(request).subscribe(caller_of(request), req))


async def feed_changes(request: web.Request) -> web.Response:
    req = await json_body(request, FeedPoll)
    return ok(await _hub(request).changes(caller_of(request), req))


def add_feed_routes(app: web.Application) -> None:
    app.router.add_post(SUBSCRIPTION_PATH, feed_subscription)
    app.router.add_post(CHANGES_PATH, feed_changes)
