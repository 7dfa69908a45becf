"""Placement's route, local socket only: `GET /v1/fleet` (`peerd fleet`), and its wiring.

    GET /v1/fleet?offline=   every environment (this one first) with its status, capacity,
                             load, memory, providers, projects, preference and the report's age;
                             reports older than a minute are read again first unless `offline`

`attach` builds the `Placement` service and hangs it where its reports travel: the link answer
(`GET /v1/link`), the change feed's answers, the laptop's live link checks and the follower.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from aiohttp import web

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import ok, query_model
from peerd.api.routes import Example, Route, add_routes
from peerd.config import PlacementConfig
from peerd.peer.client import PeerClient
from peerd.peer.links import LinkService
from peerd.placement.capacity import readers_for
from peerd.placement.service import Placement
from peerd.providers.registry import available
from peerd.runtime.provider import Provider
from peerd.tasks.follower import FollowerPool

PLACEMENT: web.AppKey[Placement] = web.AppKey("placement")

_CAPACITY = {
    "liveRuns": 1,
    "maxRuns": 8,
    "load": 0.4,
    "cpus": 8,
    "memAvailable": 12_884_901_888,
    "memTotal": 34_359_738_368,
    "providers": ["claude", "codex", "script"],
    "projects": [{"id": ex.PRJ, "name": "shop", "repositoryKey": "github.com/acme/shop"}],
    "preference": "prefer",
}


async def fleet(request: web.Request) -> web.Response:
    req = query_model(request, c.FleetRead)
    return ok(await request.app[PLACEMENT].fleet(req))


ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/fleet", fleet, "fleet",
          "Every environment with its status and capacity (reports older than a minute read again).",
          "links", query=c.FleetRead, answer=c.Fleet,
          example=Example({"environments": [
              {"envId": ex.ENV, "label": "laptop", "here": True, "status": "here", "access": None,
               "capacity": {**_CAPACITY, "preference": "normal", "liveRuns": 3}, "ageS": 0.0, "error": None},
              {"envId": ex.BOX, "label": "box", "here": False, "status": "reachable", "access": "auto",
               "capacity": _CAPACITY, "ageS": 12.5, "error": None},
          ]})),
)  # fmt: skip


def add_placement_routes(app: web.Application, placement: Placement) -> None:
    app[PLACEMENT] = placement
    add_routes(app, ROUTES)


def attach(
    app: web.Application,
    config: PlacementConfig,
    *,
    env_id: str,
    label: str,
    home: Path,
    providers: Mapping[str, Provider],
    peers: PeerClient,
    links: LinkService,
    followers: FollowerPool,
    clock: Callable[[], float] = time.time,
) -> Placement:
    """Build placement and wire it where its reports travel (the daemon calls this once)."""
    ops = followers.delegation.ops
    placement = Placement(
        ops.db,
        config,
        env_id=env_id,
        label=label,
        providers=lambda: available(providers),
        readers=readers_for(home),
        peers=peers,
        clock=clock,
    )
    ops.placement = placement  # `auto` in launches and delegations; the link answer's capacity
    followers.delegation.ender.watcher.hub.capacity = placement.local_capacity  # every feed answer
    followers.on_capacity = placement.keep_from_feed  # the laptop keeps what feed answers bring
    links.on_link_answer = placement.link_answered  # and what each live link check brings
    add_placement_routes(app, placement)
    return placement
