"""The `waits` table (migration 23): each state change one function and one transaction.

record    the wait, before the tool call that asked returns (so before the asking turn ends);
          the same clientRequestId from the same thread returns the first wait
claim     a watcher takes the wait: a new fencing token, so an older watcher can deliver nothing
polled    what a poll saw, or its failure and the backoff (a delay beside the wall time of the
          next poll, so a restart waits at most the delay whatever the wall clock did)
deliver   the wait ends `delivered` and its wake run is queued, in ONE transaction, only while it
          is `watching` and the claim is the caller's: a wait is delivered once, whatever crashes
cancel    the wait ends `cancelled` (the agent, the owner, or its thread's Stop or archive)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import aiosqlite

from peerd.errors import IdempotencyKeyReused, WaitNotFound
from peerd.store import threads
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.waits.machine import Outcome, Snapshot, Until, WaitStatus, Watch


@dataclass(frozen=True)
class WaitRow:
    id: str
    thread_id: str
    run_id: str | None
    project_id: str
    namespace: str
    request_key: str | None
    request_hash: str
    pr: str
    until: Until
    status: WaitStatus
    outcome: Outcome | None
    detail: str | None
    seen: dict[str, Any] | None
    polls: int
    failures: int
    rate_limited: int
    baseline: str | None
    next_at: float | None
    delay_s: float | None
    last_error: str | None
    claim: str | None
    woken_run_id: str | None
    deadline_at: float
    created_at: float
    updated_at: float
    ended_at: float | None

    def watch(self) -> Watch:
        return Watch(
            until=self.until,
            deadline=self.deadline_at,
            status=self.status,
            failures=self.failures,
            rate_limited=self.rate_limited,
            baseline=self.baseline,
        )


@dataclass(frozen=True)
class NewWait:
    thread_id: str
    run_id: str | None
    project_id: str
    namespace: str
    request_key: str | None
    request_hash: str
    pr: str
    until: Until
    deadline_at: float


def _row(row: aiosqlite.Row | Any) -> WaitRow:
    data = dict(row)
    data["seen"] = json.loads(data["seen"]) if data["seen"] else None
    return WaitRow(**data)


async def _one(tx: Tx, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row | None:
    async with tx.execute(sql, params) as cur:
        row: aiosqlite.Row | None = await cur.fetchone()
        return row


async def record(db: Database, new: NewWait, *, now: float) -> tuple[WaitRow, bool]:
    """Record the wait (`watching`); a retry with the same key returns the first one (True)."""
    async with db.write() as tx:
        if new.request_key is not None:
            existing = await _one(
                tx,
                "SELECT * FROM waits WHERE namespace = ? AND request_key = ?",
                (new.namespace, new.request_key),
            )
            if existing is not None:
                if existing["request_hash"] != new.request_hash:
                    raise IdempotencyKeyReused(
                        f"clientRequestId {new.request_key!r} was already used for a different "
                        "wait_for_github. Use a new clientRequestId for a new wait, or repeat the "
                        "original call to get its wait."
                    )
                return _row(existing), True
        wait_id = new_id("wt")
        await tx.execute(
            "INSERT INTO waits (id, thread_id, run_id, project_id, namespace, request_key, request_hash, pr,"
            " until, status, deadline_at, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'watching', ?, ?, ?)",
            (
                wait_id,
                new.thread_id,
                new.run_id,
                new.project_id,
                new.namespace,
                new.request_key,
                new.request_hash,
                new.pr,
                new.until,
                new.deadline_at,
                now,
                now,
            ),
        )
        await threads.event(tx, new.thread_id, "wait.updated", {"waitId": wait_id, "status": "watching"}, now)
        row = await _one(tx, "SELECT * FROM waits WHERE id = ?", (wait_id,))
    assert row is not None  # noqa: S101  # written by this very transaction
    return _row(row), False


async def get(db: Database, wait_id: str) -> WaitRow:
    row = await db.lookup("SELECT * FROM waits WHERE id = ?", (wait_id,))
    if row is None:
        raise WaitNotFound(f"Wait {wait_id} was not found; `peerd wait list` shows the waits here.")
    return _row(row)


async def listing(db: Database, *, thread_id: str | None, statuses: list[str], limit: int) -> list[WaitRow]:
    where, params = [], []
    if thread_id is not None:
        where.append("thread_id = ?")
        params.append(thread_id)
    if statuses:
        where.append(f"status IN ({', '.join('?' for _ in statuses)})")
        params.extend(statuses)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = await db.fetchall(
        f"SELECT * FROM waits {clause} ORDER BY created_at DESC, id DESC LIMIT ?",  # noqa: S608  # fixed fragments, values bound
        (*params, limit),
    )
    return [_row(r) for r in rows]


async def open_ids(db: Database) -> list[str]:
    """Every wait still `watching` (start-up resumes each)."""
    rows = await db.fetchall("SELECT id FROM waits WHERE status = 'watching' ORDER BY created_at")
    return [r["id"] for r in rows]


async def open_for_thread(db: Database, thread_id: str) -> list[str]:
    rows = await db.fetchall(
        "SELECT id FROM waits WHERE thread_id = ? AND status = 'watching' ORDER BY created_at", (thread_id,)
    )
    return [r["id"] for r in rows]


async def claim(db: Database, wait_id: str, *, now: float) -> str | None:
    """A fresh fencing token for the watcher that starts now, or None if the wait has ended."""
    token = new_id("claim")
    async with db.write() as tx:
        cur = await tx.execute(
            "UPDATE waits SET claim = ?, updated_at = ? WHERE id = ? AND status = 'watching'",
            (token, now, wait_id),
        )
        taken = cur.rowcount == 1
    return token if taken else None


def snapshot_json(snapshot: Snapshot) -> str:
    return json.dumps({"pr": asdict(snapshot.pr), "checks": [asdict(c) for c in snapshot.checks]})


async def polled(
    db: Database,
    wait_id: str,
    token: str,
    watch: Watch,
    *,
    snapshot: Snapshot | None,
    error: str | None,
    delay_s: float,
    now: float,
) -> bool:
    """What a poll saw (or its error) and when the next one is; False if the claim was lost."""
    async with db.write() as tx:
        cur = await tx.execute(
            "UPDATE waits SET polls = polls + 1, failures = ?, rate_limited = ?, baseline = ?, last_error = ?,"
            " seen = coalesce(?, seen), next_at = ?, delay_s = ?, updated_at = ?"
            " WHERE id = ? AND status = 'watching' AND claim = ?",
            (
                watch.failures,
                watch.rate_limited,
                watch.baseline,
                error,
                None if snapshot is None else snapshot_json(snapshot),
                now + delay_s,
                delay_s,
                now,
                wait_id,
                token,
            ),
        )
        return cur.rowcount == 1


async def deliver(
    db: Database,
    wait_id: str,
    token: str,
    outcome: Outcome,
    detail: str,
    text: str,
    *,
    snapshot: Snapshot | None,
    now: float,
) -> WaitRow | None:
    """End the wait `delivered` and queue its wake run on the thread that asked, in one transaction;
    None (and nothing changed) if it ended already or another watcher holds it (the fence)."""
    async with db.write() as tx:
        row = await _one(tx, "SELECT * FROM waits WHERE id = ?", (wait_id,))
        if row is None or row["status"] != "watching" or row["claim"] != token:
            return None
        thread = await _one(tx, "SELECT status, queue_held FROM threads WHERE id = ?", (row["thread_id"],))
        woken = None
        if thread is not None and thread["status"] == "active" and not thread["queue_held"]:
            woken = await threads.insert_run(tx, row["thread_id"], text, now, origin="wake")
        ended_at = max(now, float(row["created_at"]))
        await tx.execute(
            "UPDATE waits SET status = 'delivered', outcome = ?, detail = ?, seen = coalesce(?, seen),"
            " woken_run_id = ?, next_at = NULL, delay_s = NULL, ended_at = ?, updated_at = ? WHERE id = ?",
            (
                outcome,
                detail or None,
                None if snapshot is None else snapshot_json(snapshot),
                woken,
                ended_at,
                ended_at,
                wait_id,
            ),
        )
        await threads.event(
            tx, row["thread_id"], "wait.updated", {"waitId": wait_id, "status": "delivered"}, now
        )
        ended = await _one(tx, "SELECT * FROM waits WHERE id = ?", (wait_id,))
    return None if ended is None else _row(ended)


async def cancel(db: Database, wait_id: str, reason: str, *, now: float) -> WaitRow | None:
    """End the wait `cancelled`; None if it had ended already (it stays as it ended)."""
    async with db.write() as tx:
        row = await _one(tx, "SELECT * FROM waits WHERE id = ?", (wait_id,))
        if row is None:
            raise WaitNotFound(f"Wait {wait_id} was not found; `peerd wait list` shows the waits here.")
        if row["status"] != "watching":
            return None
        ended_at = max(now, float(row["created_at"]))
        await tx.execute(
            "UPDATE waits SET status = 'cancelled', detail = ?, claim = NULL, next_at = NULL, delay_s = NULL,"
            " ended_at = ?, updated_at = ? WHERE id = ?",
            (reason, ended_at, ended_at, wait_id),
        )
        await threads.event(
            tx, row["thread_id"], "wait.updated", {"waitId": wait_id, "status": "cancelled"}, now
        )
        ended = await _one(tx, "SELECT * FROM waits WHERE id = ?", (wait_id,))
    return None if ended is None else _row(ended)
