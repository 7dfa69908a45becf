"""Routes of a thread's move to a linked environment (see `peerd/handoff/`).

On the owner socket (the mover's side):

    POST /v1/threads/{id}/move {to?, message?, interrupt?, dryRun?, clientRequestId?}
                                 record the move and start it (or, dryRun, list who can take it)
    GET  /v1/moves/{id}?wait=S   the move; with wait, until it ends (at most 50 s)

On both listeners, for a link (the side a thread moves to; see `peerd/handoff/boxside.py`):

    POST /v1/handoff/check {repositoryKey, provider}
    POST /v1/projects/{id}/moved-branch {moveId, branch, tip}
    POST /v1/threads/{id}/moved-from {environmentId, threadId}
"""

from __future__ import annotations

from aiohttp import web
from pydantic import Field

from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import OPERATIONS, json_body, ok, query_model
from peerd.api.context import caller_of
from peerd.api.routes import FORWARDING, Example, Route, add_routes
from peerd.handoff import boxside
from peerd.handoff.service import HandoffService
from peerd.handoff.wire import (
    BranchLanded,
    BranchLanding,
    MoveAnswer,
    MovedFrom,
    MoveInfo,
    TakeAnswer,
    TakeCheck,
    ThreadMove,
)

HANDOFF: web.AppKey[HandoffService] = web.AppKey("handoff")


class MoveWait(c.Input):
    wait: float = Field(default=0.0, ge=0, le=c.LONG_POLL_MAX_S)


async def thread_move(request: web.Request) -> web.Response:
    req = await json_body(request, ThreadMove)
    service = request.app[HANDOFF]
    return ok(await service.move(caller_of(request), request.match_info["id"], req))


async def move_show(request: web.Request) -> web.Response:
    req = query_model(request, MoveWait)
    return ok(await request.app[HANDOFF].show(request.match_info["id"], wait_s=req.wait))


async def handoff_check(request: web.Request) -> web.Response:
    req = await json_body(request, TakeCheck)
    return ok(await boxside.take_check(request.app[OPERATIONS], caller_of(request), req))


async def moved_branch(request: web.Request) -> web.Response:
    req = await json_body(request, BranchLanding)
    ops = request.app[OPERATIONS]
    return ok(await boxside.land(ops, caller_of(request), request.match_info["id"], req))


async def moved_from(request: web.Request) -> web.Response:
    req = await json_body(request, MovedFrom)
    ops = request.app[OPERATIONS]
    return ok(await boxside.moved_from(ops, caller_of(request), request.match_info["id"], req))


_SHA = "4f0e2c9a7b1d3e5f6a8c0b2d4e6f8a1c3e5b7d9f"
_MOV = ex.MOVE["moveId"]
_MOVE = {**ex.MOVE, "startedBy": "owner"}
_MOVE_ERRORS = (
    "thread_not_found",
    "thread_busy",
    "thread_moved",
    "thread_moving",
    "move_refused",
    "provider_unavailable",
    "conflict",
    *FORWARDING,
)
OWNER_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/threads/{id}/move", thread_move, "thread_move",
          "Move a thread to a linked environment (or, dryRun, list who can take it).", "handoff",
          body=ThreadMove, answer=MoveAnswer, errors=_MOVE_ERRORS, params={"id": "a thread id"},
          example=Example({"move": _MOVE, "candidates": None}, path={"id": ex.THR},
                          body={"to": "box", "message": "Carry on with the refund tests."})),
    Route("GET", "/v1/moves/{id}", move_show, "move_show", "A move; with wait, until it ends.", "handoff",
          query=MoveWait, answer=MoveInfo, errors=("move_not_found",), params={"id": "a move id"},
          example=Example({**_MOVE, "state": "moved", "snapshot": _SHA, "branchThere": f"peerd/{ex.THR}",
                           "movedTo": {"environmentId": ex.BOX, "threadId": ex.THR}},
                          path={"id": _MOV}, query={"wait": "30"})),
)  # fmt: skip
BOX_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/handoff/check", handoff_check, "handoff_check",
          "Whether this environment can take a moved thread: its project and provider.", "handoff",
          body=TakeCheck, answer=TakeAnswer,
          example=Example({"projectId": ex.PRJ, "providerInstalled": True, "providerAllowed": True,
                           "providers": ["script", "codex"], "access": "auto"},
                          body={"repositoryKey": "github.com/acme/shop", "provider": "codex"})),
    Route("POST", "/v1/projects/{id}/moved-branch", moved_branch, "moved_branch",
          "Land a moved thread's branch: a tip only moves to a descendant of itself, and only a branch "
          "the caller's own work made.", "handoff",
          body=BranchLanding, answer=BranchLanded,
          errors=("project_not_found", "capability_denied", "not_yours", "git_error"), params={"id": "a project id"},
          example=Example({"outcome": "absent", "branch": f"peerd/{ex.THR}", "keptRef": None}, path={"id": ex.PRJ},
                          body={"moveId": _MOV, "branch": f"peerd/{ex.THR}", "tip": _SHA})),
    Route("POST", "/v1/threads/{id}/moved-from", moved_from, "moved_from",
          "Record where a thread the link launched was moved from.", "handoff", body=MovedFrom, answer=c.Thread,
          errors=("thread_not_found", "capability_denied"), params={"id": "a thread id"},
          example=Example(ex.THREAD, path={"id": ex.THR}, body={"environmentId": ex.ENV, "threadId": ex.THR})),
)  # fmt: skip
ROUTES = (*OWNER_ROUTES, *BOX_ROUTES)


def add_handoff_routes(app: web.Application, service: HandoffService) -> None:
    """The owner socket: the mover's routes and the box side's (a link reaches the latter on the
    network listener: `add_box_routes`)."""
    app[HANDOFF] = service
    add_routes(app, ROUTES)


def add_box_routes(app: web.Application) -> None:
    add_routes(app, BOX_ROUTES)
