"""An orchestration as the API shows it (`GET /v1/orchestrations/{id}`), the report's input."""

from __future__ import annotations

from typing import Any

from peerd.approvals import store as approvals_store
from peerd.orchestrate import spend
from peerd.orchestrate import store as ostore
from peerd.orchestrate.states import TERMINAL_PACKET
from peerd.store.db import Database


def _reviewer(run: ostore.RunRow, packet: ostore.PacketRow, receipts: list[dict[str, Any]]) -> Any:
    """The packet's reviewer where it ran: as its latest reviewer thread was placed (the `thread`
    receipt's coder), or its latest review's; before any, the request's (an `auto` one is placed
    when its review starts: never shown as where it ran)."""
    for receipt in reversed(receipts):
        body = receipt["body"]
        if receipt["packetId"] != packet.packet_id:
            continue
        if receipt["kind"] == "thread" and body.get("role") == "reviewer" and body.get("coder"):
            return body["coder"]
        if receipt["kind"] == "review" and body.get("reviewer"):
            return body["reviewer"]
    reviewers = run.request.get("reviewers") or {}
    return reviewers.get(packet.packet_id)


def _usage(found: spend.Spend) -> dict[str, Any] | None:
    return None if found.usage is None else found.usage.to_json()


def _out_of_scope(receipts: list[dict[str, Any]], packet_id: str) -> list[str]:
    found = [r["body"] for r in receipts if r["kind"] == "implementation" and r["packetId"] == packet_id]
    with_commit = [body for body in found if body.get("commit")]
    return list(with_commit[-1].get("outOfScope") or []) if with_commit else []


async def _awaiting(db: Database, packet: ostore.PacketRow) -> dict[str, Any] | None:
    """The question the packet's coder waits on a person for (here, or on its box as the feed
    brought it); None when nothing waits: a packet in a final state (integrated, parked, cancelled)
    has no coder that could ask, whatever a box's feed last said."""
    if packet.thread_id is None or packet.state in TERMINAL_PACKET:
        return None
    if packet.environment is None:
        found = await approvals_store.waiting_on_thread(db, packet.thread_id)
        return None if found is None else {"approvalId": found.id, "summary": found.summary}
    body = await approvals_store.mirrored_on_thread(db, packet.environment, packet.thread_id)
    if body is None:
        return None
    return {"approvalId": body["id"], "summary": body["summary"], "environmentId": packet.environment}


async def describe(db: Database, run_id: str) -> dict[str, Any]:
    run = await ostore.get(db, run_id)
    request = run.request
    flags = request.get("flags") or {}
    receipts = await ostore.receipts(db, run.id)
    planner = [r for r in receipts if r["kind"] == spend.RUN and r["packetId"] is None]
    return {
        "access": request.get("access") or "auto",
        "id": run.id,
        "projectId": run.project_id,
        "task": run.task,
        "status": run.status,
        "reason": run.reason,
        "baseCommit": run.base_commit,
        "branch": run.branch,
        "createdAt": run.created_at,
        "updatedAt": run.updated_at,
        "endedAt": run.ended_at,
        "verify": request.get("verify"),
        "includeDirty": bool(request.get("includeDirty")),
        "allowOutOfScope": bool(flags.get("allowOutOfScope")),
        "keep": bool(request.get("keep")),
        "push": request.get("push"),
        "pr": bool(request.get("pr")),
        "serializeOverlaps": bool(flags.get("serializeOverlaps")),
        # What its runs spent (null: none reported any): all of them, and the planner's alone.
        "usage": _usage(spend.whole_spend(receipts)),
        "plannerUsage": _usage(spend.spend_of(r["body"] for r in planner)),
        "budget": request.get("budget"),
        "packetBudget": request.get("packetBudget"),
        "packets": [
            {
                "id": p.packet_id,
                "goal": p.spec.get("goal"),
                "files": p.spec.get("files") or [],
                "allowOutOfScope": p.spec.get("allow_out_of_scope") or False,
                # What its latest commit changes outside its files (the implementation receipt's).
                "outOfScope": _out_of_scope(receipts, p.packet_id),
                "dependsOn": p.spec.get("depends_on") or p.spec.get("dependsOn") or [],
                "state": p.state,
                "hop": p.hop,
                "attempt": p.attempt,
                "coder": p.coder,
                "reviewer": _reviewer(run, p, receipts),
                "environment": p.environment,
                "threadId": p.thread_id,
                "branch": p.branch,
                "commit": p.commit_sha,
                "failure": p.failure,
                "updatedAt": p.updated_at,
                "retries": p.memo.counters(),
                "stopOwed": [thread for thread, _ in p.memo.stop_owed],
                "usage": _usage(spend.packet_spend(receipts, p.packet_id)),
                "awaitingApproval": await _awaiting(db, p),
            }
            for p in run.packets
        ],
        "receipts": receipts,
    }
