"""Approvals in the store (migration 14): each record is committed before its CLI is answered, and
each decision is one conditional update (`WHERE status = 'pending'`), so the first one wins even
when two deciders race in different transactions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiosqlite

from peerd.approvals.rules import Approval
from peerd.contracts import TaskApproval
from peerd.store.db import Database
from peerd.store.threads.writes import new_run

_COLUMNS = (
    "id, run_id, thread_id, ask_key, kind, tool, summary, detail, digest, status, link_origin, link_label,"
    " parent_task_id, parent_thread_id, scope, reason, decided_by, decision_id, created_at, deadline_at,"
    " decided_at, delivered_at"
)
_MARKS = ", ".join("?" * len(_COLUMNS.split(",")))


def _row(row: aiosqlite.Row) -> Approval:
    return Approval(
        id=row["id"],
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        ask_key=row["ask_key"],
        kind=row["kind"],
        tool=row["tool"],
        summary=row["summary"],
        detail=json.loads(row["detail"]),
        digest=row["digest"],
        status=row["status"],
        link_origin=row["link_origin"],
        link_label=row["link_label"],
        parent_task_id=row["parent_task_id"],
        parent_thread_id=row["parent_thread_id"],
        scope=row["scope"],
        reason=row["reason"],
        decided_by=row["decided_by"],
        decision_id=row["decision_id"],
        created_at=row["created_at"],
        deadline_at=row["deadline_at"],
        decided_at=row["decided_at"],
        delivered_at=row["delivered_at"],
    )


def _values(a: Approval) -> tuple[Any, ...]:
    return (
        a.id,
        a.run_id,
        a.thread_id,
        a.ask_key,
        a.kind,
        a.tool,
        a.summary,
        json.dumps(dict(a.detail), sort_keys=True),
        a.digest,
        a.status,
        a.link_origin,
        a.link_label,
        a.parent_task_id,
        a.parent_thread_id,
        a.scope,
        a.reason,
        a.decided_by,
        a.decision_id,
        a.created_at,
        a.deadline_at,
        a.decided_at,
        a.delivered_at,
    )


async def insert(db: Database, approval: Approval) -> None:
    async with db.write() as tx:
        await tx.execute(f"INSERT INTO approvals ({_COLUMNS}) VALUES ({_MARKS})", _values(approval))  # noqa: S608


async def get(db: Database, approval_id: str) -> Approval | None:
    row = await db.fetchone(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (approval_id,))  # noqa: S608
    return None if row is None else _row(row)


async def settle(db: Database, decided: Approval) -> Approval | None:
    """Write a decision (or expiry, or cancellation) if the record is still pending; None when
    another decision got there first (read it again to see which)."""
    async with db.write() as tx:
        cur = await tx.execute(
            "UPDATE approvals SET status = ?, scope = ?, reason = ?, decided_by = ?, decision_id = ?,"
            " decided_at = ?, delivered_at = ? WHERE id = ? AND status = 'pending'",
            (
                decided.status,
                decided.scope,
                decided.reason,
                decided.decided_by,
                decided.decision_id,
                decided.decided_at,
                decided.delivered_at,
                decided.id,
            ),
        )
        return decided if (cur.rowcount or 0) == 1 else None


async def delivered(db: Database, approval_id: str, *, now: float) -> bool:
    """Mark a decision as told to a CLI; False when it had been told already (told once)."""
    async with db.write() as tx:
        cur = await tx.execute(
            "UPDATE approvals SET delivered_at = ? WHERE id = ? AND delivered_at IS NULL", (now, approval_id)
        )
        return (cur.rowcount or 0) == 1


async def of_run(db: Database, run_id: str) -> list[Approval]:
    rows = await db.lookup_all(
        f"SELECT {_COLUMNS} FROM approvals WHERE run_id = ? ORDER BY created_at",  # noqa: S608
        (run_id,),
    )
    return [_row(r) for r in rows]


async def owed_on_thread(db: Database, thread_id: str, digest: str) -> list[Approval]:
    """Decisions (and pending questions) of this thread for this action not yet told to a CLI."""
    rows = await db.fetchall(
        f"SELECT {_COLUMNS} FROM approvals WHERE thread_id = ? AND digest = ? AND delivered_at IS NULL"  # noqa: S608
        " ORDER BY created_at",
        (thread_id, digest),
    )
    return [_row(r) for r in rows]


async def rebind(db: Database, approval_id: str, *, run_id: str, ask_key: str) -> None:
    """A pending question asked again by the thread's next run (after a restart): the same record
    now answers that run."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE approvals SET run_id = ?, ask_key = ? WHERE id = ? AND status = 'pending'",
            (run_id, ask_key, approval_id),
        )


async def pending(db: Database, *, link_origin: str | None = None) -> list[Approval]:
    if link_origin is None:
        sql = f"SELECT {_COLUMNS} FROM approvals WHERE status = 'pending' ORDER BY created_at"  # noqa: S608
        rows = await db.fetchall(sql)
    else:
        sql = (
            f"SELECT {_COLUMNS} FROM approvals WHERE link_origin = ? AND status = 'pending'"  # noqa: S608
            " ORDER BY created_at"
        )
        rows = await db.fetchall(sql, (link_origin,))
    return [_row(r) for r in rows]


async def recent(db: Database, *, limit: int, link_origin: str | None = None) -> list[Approval]:
    """Every approval, newest first (`approval list --all`)."""
    if link_origin is None:
        rows = await db.fetchall(
            f"SELECT {_COLUMNS} FROM approvals ORDER BY created_at DESC LIMIT ?",  # noqa: S608
            (limit,),
        )
    else:
        rows = await db.fetchall(
            f"SELECT {_COLUMNS} FROM approvals WHERE link_origin = ?"  # noqa: S608
            " ORDER BY created_at DESC LIMIT ?",
            (link_origin, limit),
        )
    return [_row(r) for r in rows]


async def next_deadline(db: Database) -> float | None:
    value = await db.scalar("SELECT MIN(deadline_at) FROM approvals WHERE status = 'pending'")
    return None if value is None else float(value)


async def due(db: Database, now: float) -> list[Approval]:
    rows = await db.fetchall(
        f"SELECT {_COLUMNS} FROM approvals WHERE status = 'pending' AND deadline_at <= ?",  # noqa: S608
        (now,),
    )
    return [_row(r) for r in rows]


# --- a laptop's mirror of a box's pending approvals ------------------------------------------------


async def mirror(db: Database, environment_id: str, bodies: Sequence[dict[str, Any]], *, now: float) -> None:
    """Replace what this machine knows of `environment_id`'s pending approvals."""
    async with db.write() as tx:
        await tx.execute("DELETE FROM remote_approvals WHERE environment_id = ?", (environment_id,))
        await tx.executemany(
            "INSERT INTO remote_approvals (environment_id, id, body, seen_at) VALUES (?, ?, ?, ?)",
            [(environment_id, str(b["id"]), json.dumps(b), now) for b in bodies],
        )


async def mirrored(
    db: Database, environment_id: str | None = None
) -> list[tuple[str, dict[str, Any], float]]:
    if environment_id is None:
        rows = await db.fetchall("SELECT environment_id, body, seen_at FROM remote_approvals")
    else:
        rows = await db.fetchall(
            "SELECT environment_id, body, seen_at FROM remote_approvals WHERE environment_id = ?",
            (environment_id,),
        )
    return [(r["environment_id"], json.loads(r["body"]), float(r["seen_at"])) for r in rows]


async def mirrored_one(db: Database, approval_id: str) -> tuple[str, dict[str, Any]] | None:
    row = await db.fetchone("SELECT environment_id, body FROM remote_approvals WHERE id = ?", (approval_id,))
    return None if row is None else (row["environment_id"], json.loads(row["body"]))


async def forget_mirrored(db: Database, environment_id: str, approval_id: str) -> None:
    async with db.write() as tx:
        await tx.execute(
            "DELETE FROM remote_approvals WHERE environment_id = ? AND id = ?", (environment_id, approval_id)
        )


def with_delivery(approval: Approval, now: float) -> Approval:
    return replace(approval, delivered_at=now)


async def waiting_on_thread(db: Database, thread_id: str) -> Approval | None:
    """The oldest question of the thread still waiting for a person."""
    row = await db.fetchone(
        f"SELECT {_COLUMNS} FROM approvals WHERE thread_id = ? AND status = 'pending'"  # noqa: S608
        " ORDER BY created_at LIMIT 1",
        (thread_id,),
    )
    return None if row is None else _row(row)


async def waiting_approval(db: Database, thread_id: str) -> TaskApproval | None:
    """The thread's question waiting for a person, as a wait's answer names it."""
    found = await waiting_on_thread(db, thread_id)
    return None if found is None else TaskApproval(approval_id=found.id, summary=found.summary)


async def mirrored_on_thread(db: Database, environment_id: str, thread_id: str) -> dict[str, Any] | None:
    """A linked box's pending approval for that box thread, as its feed last brought it."""
    for _, body, _ in await mirrored(db, environment_id):
        if body.get("threadId") == thread_id and body.get("status") == "pending":
            return body
    return None


LIVE_OR_QUEUED = ("queued", "starting", "running")


async def queue_continuation(db: Database, thread_id: str, asked_in: str, prompt: str, *, now: float) -> bool:
    """A run on the thread for an owed decision, unless one is queued or live there already (it
    will ask again and inherit the decision), the thread went on since the run that asked
    (`asked_in` is no longer its latest run: the question is stale), or the thread is archived or
    held by a stop."""
    async with db.write() as tx:
        async with tx.execute("SELECT status, queue_held FROM threads WHERE id = ?", (thread_id,)) as cur:
            thread = await cur.fetchone()
        if thread is None or thread["status"] == "archived" or thread["queue_held"]:
            return False
        marks = ", ".join("?" * len(LIVE_OR_QUEUED))
        async with tx.execute(
            f"SELECT 1 FROM runs WHERE thread_id = ? AND status IN ({marks}) LIMIT 1",  # noqa: S608
            (thread_id, *LIVE_OR_QUEUED),
        ) as cur:
            if await cur.fetchone() is not None:
                return False
        async with tx.execute(
            "SELECT id FROM runs WHERE thread_id = ? ORDER BY number DESC LIMIT 1", (thread_id,)
        ) as cur:
            latest = await cur.fetchone()
        if latest is None or latest["id"] != asked_in:
            return False
        await new_run(tx, thread_id, prompt, now, origin="continue")
        return True
