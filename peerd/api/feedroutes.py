"""The change feed's routes on the network listener (links only): `POST /v1/feed/subscription`
and `POST /v1/feed/changes`, answered by the box's `FeedHub` (`peerd.tasks.feed`) from the
authenticated link. The wire shapes: `peerd.tasks.feedwire`."""

from __future__ import annotations

from aiohttp import web

from peerd.api import examples as ex
from peerd.api.app import DELEGATION, json_body, ok
from peerd.api.context import caller_of
from peerd.api.routes import Example, Route, add_routes
from peerd.tasks.feed import FeedHub
from peerd.tasks.feedwire import (
    CHANGES_PATH,
    SUBSCRIPTION_PATH,
    FeedChanges,
    FeedPoll,
    FeedSubscribe,
    FeedSubscribed,
)


def _hub(request: web.Request) -> FeedHub:
    return request.app[DELEGATION].hub


async def feed_subscription(request: web.Request) -> web.Response:
    req = await json_body(request, FeedSubscribe)
    return ok(await _hub(request).subscribe(caller_of(request), req))


async def feed_changes(request: web.Request) -> web.Response:
    req = await json_body(request, FeedPoll)
    return ok(await _hub(request).changes(caller_of(request), req))


_HASH, _CURSOR = "9e107d9d372bb6826bd81d3542a419d6", "5f0c1e9a2b7d4c3e"
_RUN = {"runId": ex.RUN, "found": True, "settled": True, "status": "completed", "resultRunId": ex.RUN}
ROUTES: tuple[Route, ...] = (
    Route("POST", SUBSCRIPTION_PATH, feed_subscription, "feed_subscribe",
          "Change which of this link's runs the feed follows (deltas; `setHash` checks the whole set).", "feed",
          body=FeedSubscribe, answer=FeedSubscribed, errors=("not_found", "invalid_request"),
          example=Example({"inSync": True, "size": 1, "setHash": _HASH}, body={"add": [ex.RUN], "setHash": _HASH})),
    Route("POST", CHANGES_PATH, feed_changes, "feed_changes",
          "Long-poll for changes of the followed runs after a cursor.", "feed", body=FeedPoll, answer=FeedChanges,
          errors=("not_found",),
          example=Example({"cursor": f"{_CURSOR}-12", "runs": [_RUN], "resynced": False, "timedOut": False},
                          body={"cursor": f"{_CURSOR}-11", "timeout": 45})),
)  # fmt: skip


def add_feed_routes(app: web.Application) -> None:
    add_routes(app, ROUTES)
