"""Tasks (every delegated task, where it runs, its result, cancel) and Orchestrations (packets as a
dependency graph, receipts, the report, cancel). Approvals are `peerd.console.approvals`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from peerd.console.graph import NODE_H, NODE_W, layout
from peerd.console.owner import Env
from peerd.console.pages import back, owner
from peerd.console.render import fragment, notice, page, shown_error
from peerd.console.threads import thread_href
from peerd.core.text import path_segment
from peerd.errors import PeerdError
from peerd.orchestrate.report import END_WORDS
from peerd.orchestrate.states import TERMINAL_RUN

TASK_STATES = ("pending", "running", "completed", "failed", "cancelled", "interrupted")
TASK_PAGE = 50
ORC_TERMINAL = tuple(sorted(TERMINAL_RUN))  # an orchestration's final states (states.py)
LIVE_WAIT_S = 25.0
USAGE_READS = 8  # task shows in flight at once, for the Usage column


# --- Tasks --------------------------------------------------------------------------------------


async def task_list(request: web.Request) -> web.StreamResponse:
    api = owner(request)
    states = [s for s in request.query.getall("status", []) if s in TASK_STATES]
    env_filter = request.query.get("env", "")
    params: dict[str, Any] = {
        "status": ",".join(states) or None,
        "targetEnvironment": env_filter or None,
        "cursor": request.query.get("cursor") or None,
        "limit": TASK_PAGE,
    }
    envs = await api.envs()
    found = await api.tasks(params)
    spent = await _usages(api, [task.task_id for task in found.items])
    rows = []
    for task in found.items:
        remote = task.remote_child
        where: Env | None = api.here
        child = task.child_thread_id
        if remote is not None:
            where, child = api.env_of(envs, remote.environment_id), remote.thread_id
        rows.append(
            {
                "task": task,
                "where": remote.label if remote is not None else api.here.label,
                "child_href": thread_href(where, child) if where is not None and child else None,
                "parent_href": thread_href(api.here, task.parent_thread_id),
                "usage": spent.get(task.task_id),
            }
        )
    more = None
    if found.next_cursor:
        query = [("status", s) for s in states] + ([("env", env_filter)] if env_filter else [])
        more = "/tasks?" + "&".join(
            f"{k}={path_segment(v)}" for k, v in [*query, ("cursor", found.next_cursor)]
        )
    return page(
        request,
        "tasks.html",
        title="Tasks",
        rows=rows,
        states=TASK_STATES,
        wanted=states,
        envs=envs,
        env_filter=env_filter,
        more=more,
    )


async def _usages(api: Any, task_ids: list[str]) -> dict[str, Any]:
    """Each task's usage (only `task show` has it: its child's runs and their delegations),
    a few at a time; a task that cannot be read now shows none."""
    gate = asyncio.Semaphore(USAGE_READS)

    async def one(task_id: str) -> Any:
        async with gate:
            try:
                return (await api.task(task_id)).usage
            except PeerdError:
                return None

    found = await asyncio.gather(*(one(t) for t in task_ids))
    return dict(zip(task_ids, found, strict=True))


async def task_cancel_confirm(request: web.Request) -> web.StreamResponse:
    task = await owner(request).task(request.match_info["id"])
    return page(
        request,
        "confirm.html",
        title="Cancel a task",
        question=f"Cancel the task {task.title!r}?",
        detail="Its child thread is stopped (on the machine it runs on) and the parent is woken with the "
        "cancellation.",
        action=f"/tasks/{path_segment(task.task_id)}/cancel",
        button="Cancel the task",
        cancel="/tasks",
    )


async def task_cancel(request: web.Request) -> web.StreamResponse:
    try:
        done = await owner(request).cancel_task(request.match_info["id"])
        notice(request, f"Task {done.title!r}: {done.status}.")
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
    raise back(request, "/tasks")


# --- Orchestrations -----------------------------------------------------------------------------


async def orchestration_list(request: web.Request) -> web.StreamResponse:
    items = await owner(request).orchestrations()
    return page(request, "orchestrations.html", title="Orchestrations", items=list(reversed(items)))


def last_receipt(info: dict[str, Any], kind: str, packet: str | None = None) -> dict[str, Any] | None:
    found = [
        r["body"] for r in info.get("receipts", []) if r.get("kind") == kind and r.get("packetId") == packet
    ]
    return found[-1] if found else None


async def _context(request: web.Request, info: dict[str, Any]) -> dict[str, Any]:
    api = owner(request)
    envs = await api.envs()
    packets = []
    for packet in info.get("packets", []):
        env = api.env_named(envs, packet.get("environment"))
        impl = last_receipt(info, "implementation", packet["id"]) or {}
        review = last_receipt(info, "review", packet["id"]) or {}
        verification = impl.get("verification") or {}
        packets.append(
            {
                **packet,
                "where": env.label if env is not None else packet.get("environment"),
                "thread_href": thread_href(env, packet["threadId"])
                if env and packet.get("threadId")
                else None,
                "check": "passed"
                if verification.get("passed")
                else (verification.get("classification") or "-"),
                "verdict": review.get("verdict", "-"),
            }
        )
    receipts = [
        {**r, "pretty": json.dumps(r.get("body"), indent=2, sort_keys=True)} for r in info.get("receipts", [])
    ]
    hops = [
        {
            "packet": r.get("packetId"),
            "what": _hop_name(r["kind"], r.get("body") or {}),
            "usage": (r.get("body") or {}).get("usage"),
            # peerd's own work: a plan directory, the integration (git and the check), no model
            "free": r.get("kind") == "integration" or (r.get("body") or {}).get("source") == "plan_dir",
        }
        for r in info.get("receipts", [])
        if r.get("kind") in ("plan", "implementation", "review", "integration")
    ]
    return {
        "info": info,
        "packets": packets,
        "graph": layout(info.get("packets", [])),
        "node_w": NODE_W,
        "node_h": NODE_H,
        "receipts": receipts,
        "hops": hops,
        "resolution": last_receipt(info, "resolution"),
        "integration": last_receipt(info, "integration"),
        "terminal": info.get("status") in ORC_TERMINAL,
        # not_integrated, check_failed: said in words beside the state, as the report says them
        "end_words": END_WORDS.get(str(info.get("status"))),
    }


def _hop_name(kind: str, body: dict[str, Any]) -> str:
    """A receipt as a hop: "plan", "attempt 2 (fix)", "review round 1", "integration (no model)"."""
    if kind == "implementation":
        hop = body.get("hop")
        return f"attempt {body.get('attempt', 1)}" + (f" ({hop})" if hop and hop != "implement" else "")
    if kind == "review":
        return f"review round {body.get('round', 1)}"
    if kind == "integration":
        return "integration (peerd's git, no model)"
    return "plan" + (" (a plan directory, no model)" if body.get("source") == "plan_dir" else "")


async def orchestration_page(request: web.Request) -> web.StreamResponse:
    info = await owner(request).orchestration(request.match_info["id"])
    context = await _context(request, info)
    return page(request, "orchestration.html", title=f"Orchestration {info['id']}", **context)


async def orchestration_live(request: web.Request) -> web.StreamResponse:
    """The orchestration's body once it changed after `after` (a long-poll, `LIVE_WAIT_S`)."""
    try:
        after = float(request.query.get("after", "0"))
    except ValueError:
        after = 0.0
    info = await owner(request).orchestration(request.match_info["id"], after=after, wait_s=LIVE_WAIT_S)
    return fragment(request, "_orchestration.html", **(await _context(request, info)))


async def orchestration_cancel_confirm(request: web.Request) -> web.StreamResponse:
    info = await owner(request).orchestration(request.match_info["id"])
    return page(
        request,
        "confirm.html",
        title="Cancel an orchestration",
        question=f"Cancel orchestration {info['id']}?",
        detail="Every packet still running is stopped, here and on linked machines; integrated work stays.",
        action=f"/orchestrations/{path_segment(info['id'])}/cancel",
        button="Cancel the orchestration",
        cancel=f"/orchestrations/{path_segment(info['id'])}",
    )


async def orchestration_cancel(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["id"]
    try:
        done = await owner(request).cancel_orchestration(run_id)
        notice(request, f"Orchestration {run_id}: {done.get('status')}.")
    except PeerdError as exc:
        notice(request, shown_error(exc), level="error")
    raise back(request, f"/orchestrations/{path_segment(run_id)}")


ROUTES = (
    ("GET", "/tasks", task_list),
    ("GET", "/tasks/{id}/cancel", task_cancel_confirm),
    ("POST", "/tasks/{id}/cancel", task_cancel),
    ("GET", "/orchestrations", orchestration_list),
    ("GET", "/orchestrations/{id}", orchestration_page),
    ("GET", "/orchestrations/{id}/live", orchestration_live),
    ("GET", "/orchestrations/{id}/cancel", orchestration_cancel_confirm),
    ("POST", "/orchestrations/{id}/cancel", orchestration_cancel),
)
