"""Approvals: what waits for the owner's yes or no, here and on linked boxes (for the work this
machine started there), approve (once, for the rest of the run, for the same command) or deny with
a reason, and the recent decisions with who made them.

Everything goes through the owner socket as `peerd approval` does (`GET /v1/approvals?all=true`,
`POST /v1/approvals/{id}/decision`); a decision on a box's approval is forwarded by the daemon.
The buttons are plain forms (they work without JavaScript) and pass the console's guard like
every change: same origin, the session's CSRF token. Each form carries its own decision id, so a
form sent twice (a double click, a retry) is one decision. The list stays live with a long-poll
on the pending set's hash (`changedFrom`): a small watcher element asks `/approvals/live`, which
answers at once when the set changed (the new list swapped in out of band, so a reason being typed
is kept while nothing changes) or after `LIVE_WAIT_S` with the same watcher.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from peerd.console.owner import Env, Owner
from peerd.console.pages import back, form, owner
from peerd.console.render import notice, page, render_text, shown_error
from peerd.console.state import CONSOLE, SESSION
from peerd.console.threads import thread_href
from peerd.core.text import path_segment
from peerd.errors import PeerdError

PATH = "/v1/approvals"
LIVE_WAIT_S = 25.0
RECENT = 20  # decided ones shown under the pending ones
HASH = re.compile(r"[0-9a-f]{16}")
SCOPES = {
    "once": "Approved.",
    "run": "Approved for the rest of its run.",
    "command": "Approved for this command.",
}

Json = dict[str, Any]


@dataclass(frozen=True)
class Shown:
    """One approval as the page shows it."""

    view: Json
    where: str
    thread_href: str | None
    decided_by: str | None
    detail: list[tuple[str, str]]  # (label, text) in the order a person reads them
    decision_id: str


def decided_by_text(by: str | None, clients: dict[str, str]) -> str | None:
    """Who decided, in words: the owner, a linked machine (by its label), the deadline, the run."""
    if by is None:
        return None
    if by == "owner":
        return "the owner"
    if by.startswith("link:"):
        client = by.partition(":")[2]
        return f"linked machine {clients.get(client, client)}"
    return {"deadline": "the deadline (nobody answered in time)", "run_ended": "the run's end"}.get(by, by)


def detail_parts(view: Json) -> list[tuple[str, str]]:
    """The exact action: the command line and its directory; each file's path and diff or content;
    an MCP tool's server, name and arguments; any other tool's input."""
    detail: Json = view.get("detail") or {}
    kind = view.get("kind")
    if kind == "command":
        rest = {k: v for k, v in detail.items() if k not in ("command", "cwd")}
        parts = [("Command", str(detail.get("command", ""))), ("In", str(detail.get("cwd", "")))]
        return parts + ([("Also", pretty(rest))] if rest else [])
    if kind == "file_change":
        parts = []
        for each in detail.get("changes") or []:
            change = each if isinstance(each, dict) else {"path": each}
            label = f"{change.get('path')} ({change.get('kind') or 'update'})"
            body = next((str(change[k]) for k in ("diff", "content") if change.get(k) is not None), None)
            if body is None and change.get("new") is not None:
                body = f"replace:\n{change.get('old', '')}\nwith:\n{change['new']}"
            parts.append((label, body or "(no content shown)"))
        return parts
    if kind == "mcp_tool":
        return [
            ("Server", str(detail.get("server", ""))),
            ("Tool", str(detail.get("tool", ""))),
            ("Arguments", pretty(detail.get("arguments") or {})),
        ]
    return [("Input", pretty(detail.get("input", detail)))]


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


async def _context(api: Owner, data: Json) -> Json:
    envs = await api.envs()
    try:
        clients = {x.id: x.label for x in await api.clients()}
    except PeerdError:
        clients = {}
    shown: list[Shown] = []
    for view in data.get("items", []):
        env: Env | None = api.env_of(envs, view.get("environmentId")) if view.get("onBox") else api.here
        label = view.get("environmentLabel") or view.get("environmentId")
        shown.append(
            Shown(
                view=view,
                where=f"on {label}" if view.get("onBox") else "here",
                thread_href=thread_href(env, view["threadId"]) if env is not None else None,
                decided_by=decided_by_text(view.get("decidedBy"), clients),
                detail=detail_parts(view),
                decision_id=uuid.uuid4().hex,
            )
        )
    return {
        "pending": [s for s in shown if s.view["status"] == "pending"],
        "decided": [s for s in shown if s.view["status"] != "pending"][:RECENT],
        "pending_hash": data.get("pendingHash", ""),
        "stale": list(data.get("stale") or []),
    }


async def _listing(api: Owner, *, changed_from: str | None = None, wait_s: float = 0.0) -> Json:
    params: Json = {"all": True, "limit": 100}
    if changed_from is not None:
        params |= {"changedFrom": changed_from, "timeout": wait_s}
    data: Json = await api.call("GET", PATH, params=params)
    return data


async def approvals(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    context = await _context(api, await _listing(api))
    return page(request, "approvals.html", title="Approvals", **context)


def live_fragment(request: web.Request, template: str, **context: Any) -> web.Response:
    """A fragment for the watcher. Unlike `render.fragment` it leaves the session's notices for the
    next page: a long-poll that a decision wakes answers just before the page the decision's
    redirect loads, and would otherwise take its "Approved." away."""
    session = request.get(SESSION)
    root = request.app[CONSOLE].root
    body = render_text(template, root=root, csrf="" if session is None else session.csrf, **context)
    return web.Response(text=body, content_type="text/html", charset="utf-8")


async def approvals_live(request: web.Request) -> web.StreamResponse:
    """The watcher again once the pending set's hash is no longer `changedFrom` (with the new list,
    out of band), or after `LIVE_WAIT_S` with nothing else."""
    changed_from = request.query.get("changedFrom", "")
    if not HASH.fullmatch(changed_from):
        changed_from = "0" * 16
    api = owner(request)
    data = await _listing(api, changed_from=changed_from, wait_s=LIVE_WAIT_S)
    if data.get("pendingHash") == changed_from:
        return live_fragment(request, "_approvals_watch.html", pending_hash=changed_from)
    return live_fragment(request, "_approvals_live.html", **(await _context(api, data)))


async def approval_decide(request: web.Request) -> web.StreamResponse:
    decision = request.match_info["decision"]
    if decision not in ("approve", "deny"):
        raise web.HTTPNotFound()
    data = await form(request)
    body: Json = {"decision": decision}
    if decision == "approve":
        body["scope"] = data.get("scope") if data.get("scope") in SCOPES else "once"
    elif data.get("reason", "").strip():
        body["reason"] = data["reason"].strip()
    if data.get("decisionId"):
        body["decisionId"] = data["decisionId"]
    try:
        view = await owner(request).call(
            "POST", f"{PATH}/{path_segment(request.match_info['id'])}/decision", body=body
        )
        said = SCOPES[body["scope"]] if decision == "approve" else "Denied."
        notice(request, f"{said} {view.get('summary', '')}".strip())
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
    raise back(request, "/needs-you" if data.get("next") == "/needs-you" else "/approvals")


ROUTES = (
    ("GET", "/approvals", approvals),
    ("GET", "/approvals/live", approvals_live),
    ("POST", "/approvals/{id}/{decision}", approval_decide),
)
