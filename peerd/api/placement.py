"""Placement's route, local socket only: `GET /v1/fleet` (`peerd fleet`).

    GET /v1/fleet?offline=   every environment (this one first) with its status, capacity,
                             load, memory, providers, projects, preference and the report's age;
                             reports older than a minute are read again first unless `offline`

The `Placement` service is built by the daemon (`peerd/daemon.py`), which gives it to those its
reports travel through: `Operations` (`auto`; the link answer `GET /v1/link`), the box's change
feed (`FeedHub(capacity=...)`), and the events of the laptop's live link checks and feed answers.
"""

from __future__ import annotations

from aiohttp import web

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import ok, query_model
from peerd.api.routes import Example, Route, add_routes
from peerd.placement.service import Placement

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
              {"environmentId": ex.ENV, "label": "laptop", "here": True, "status": "here", "access": None,
               "capacity": {**_CAPACITY, "preference": "normal", "liveRuns": 3}, "ageS": 0.0, "error": None},
              {"environmentId": ex.BOX, "label": "box", "here": False, "status": "reachable", "access": "auto",
               "capacity": _CAPACITY, "ageS": 12.5, "error": None},
          ]})),
)  # fmt: skip


def add_placement_routes(app: web.Application, placement: Placement) -> None:
    app[PLACEMENT] = placement
    add_routes(app, ROUTES)
