"""Approval routes: the owner socket (this machine's approvals and its linked boxes') and a box's
network listener (a link's own work's approvals). The desk (`peerd.approvals.desk`) decides what
each caller sees; the caller is the authenticated one, never what the body says.

GET  /v1/approvals?all=&limit=&changedFrom=&timeout=
GET  /v1/approvals/{id}
POST /v1/approvals/{id}/decision {decision: approve|deny, scope?: once|run|command, reason?, decisionId?}
"""

from __future__ import annotations

from aiohttp import web

from peerd.api.app import json_body, ok, query_model
from peerd.api.context import caller_of
from peerd.api.routes import Example, Route, add_routes
from peerd.approvals.desk import ApprovalDesk
from peerd.approvals.wire import ApprovalDecisionBody, ApprovalListQuery, ApprovalPage, ApprovalView

DESK: web.AppKey[ApprovalDesk] = web.AppKey("approvals_desk")

_EXAMPLE = {
    "id": "ap_5f1c2e9a0b7d4c31",
    "status": "pending",
    "kind": "command",
    "tool": "Bash",
    "summary": "run `make test` in /home/me/repo",
    "detail": {"command": "make test", "cwd": "/home/me/repo"},
    "threadId": "thr_01HZX3",
    "runId": "run_01HZX4",
    "onBox": False,
    "createdAt": 1764590000.0,
    "deadlineAt": 1764591800.0,
}


async def approval_list(request: web.Request) -> web.Response:
    query = query_model(request, ApprovalListQuery)
    return ok(await request.app[DESK].listing(query, link=caller_of(request).link))


async def approval_show(request: web.Request) -> web.Response:
    return ok(await request.app[DESK].show(request.match_info["id"], link=caller_of(request).link))


async def approval_decide(request: web.Request) -> web.Response:
    body = await json_body(request, ApprovalDecisionBody)
    return ok(await request.app[DESK].decide(request.match_info["id"], body, link=caller_of(request).link))


_ID = {"id": "an approval id (ap_...)"}
ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/approvals", approval_list, "approval_list",
          "Pending approvals (with `all`: decided ones too); with `changedFrom` and `timeout`, a long-poll "
          "for a change of the pending set.", "approvals", query=ApprovalListQuery, answer=ApprovalPage,
          example=Example({"items": [_EXAMPLE], "pendingHash": "9f2c1a7b3d4e5f60", "stale": []})),
    Route("GET", "/v1/approvals/{id}", approval_show, "approval_show",
          "One approval: the exact action asked about, who asks, its deadline and decision.", "approvals",
          answer=ApprovalView, errors=("approval_not_found",), params=_ID,
          example=Example(_EXAMPLE, path={"id": "ap_5f1c2e9a0b7d4c31"})),
    Route("POST", "/v1/approvals/{id}/decision", approval_decide, "approval_decide",
          "Approve or deny; the first decision wins (the same `decisionId` again is answered as the first).",
          "approvals", body=ApprovalDecisionBody, answer=ApprovalView,
          errors=("approval_not_found", "approval_decided", "approval_withdrawn", "approval_not_allowed",
                  "link_revoked", "unreachable"),
          params=_ID,
          example=Example({**_EXAMPLE, "status": "approved", "decidedBy": "owner", "scope": "once"},
                          path={"id": "ap_5f1c2e9a0b7d4c31"}, body={"decision": "approve"})),
)  # fmt: skip


def add_approval_routes(app: web.Application, desk: ApprovalDesk) -> None:
    app[DESK] = desk
    add_routes(app, ROUTES)
