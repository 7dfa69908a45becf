"""Placement's store (migration 15): a laptop's cache of each box's capacity, and the choices.

`link_capacity`: per linked environment, its last capacity report (JSON) and when it was read,
or, when the last try failed, why (the last report is kept with its age). `placements`: each
`auto` choice keyed by its request (a retry with the same key reuses it, so it never lands
somewhere else), with the task or thread it became and its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import pydantic

from peerd import contracts as c
from peerd.store.db import Database


@dataclass(frozen=True)
class Cached:
    capacity: c.Capacity | None
    seen_at: float | None
    error: str | None
    error_at: float | None


async def save(db: Database, env_id: str, capacity: c.Capacity, *, now: float) -> None:
    body = capacity.model_dump_json(by_alias=True)
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO link_capacity (environment_id, body, seen_at, error, error_at)"
            " VALUES (?, ?, ?, NULL, NULL) ON CONFLICT (environment_id)"
            " DO UPDATE SET body = excluded.body, seen_at = excluded.seen_at, error = NULL, error_at = NULL",
            (env_id, body, now),
        )


async def failed(db: Database, env_id: str, error: str, *, now: float) -> None:
    """The last try to read it failed: say why, keep the last report (with its age)."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO link_capacity (environment_id, error, error_at) VALUES (?, ?, ?)"
            " ON CONFLICT (environment_id) DO UPDATE SET error = excluded.error, error_at = excluded.error_at",
            (env_id, error[:500], now),
        )


async def cached(db: Database) -> dict[str, Cached]:
    out: dict[str, Cached] = {}
    for r in await db.fetchall("SELECT * FROM link_capacity"):
        capacity = None
        if r["body"] is not None:
            try:
                capacity = c.Capacity.model_validate_json(r["body"])
            except pydantic.ValidationError:
                capacity = None  # written by another version: as if none was read
        out[r["environment_id"]] = Cached(capacity, r["seen_at"], r["error"], r["error_at"])
    return out


async def forget(db: Database, env_id: str) -> None:
    async with db.write() as tx:
        await tx.execute("DELETE FROM link_capacity WHERE environment_id = ?", (env_id,))


# --- the choices -------------------------------------------------------------------------------


async def recall(db: Database, key: str) -> c.Placed | None:
    """The choice made earlier for this request key, if any."""
    row = await db.fetchone("SELECT * FROM placements WHERE key = ?", (key,))
    if row is None:
        return None
    label = row["reason"].partition(":")[0]
    return c.Placed(
        environment_id=row["environment_id"], label=label, project_id=row["project_id"], reason=row["reason"]
    )


async def record(db: Database, key: str, placed: c.Placed, *, now: float) -> c.Placed:
    """Keep the choice before the work leaves; a choice already kept for the key wins."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO placements (key, environment_id, project_id, reason, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
            (key, placed.environment_id, placed.project_id, placed.reason, now),
        )
    return await recall(db, key) or placed


async def attach(db: Database, key: str, *, task_id: str | None = None, thread_id: str | None = None) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE placements SET task_id = coalesce(?, task_id), thread_id = coalesce(?, thread_id)"
            " WHERE key = ?",
            (task_id, thread_id, key),
        )


async def for_task(db: Database, task_id: str) -> str | None:
    row = await db.fetchone("SELECT reason FROM placements WHERE task_id = ? LIMIT 1", (task_id,))
    return None if row is None else str(row["reason"])


async def for_thread(db: Database, thread_id: str) -> str | None:
    row = await db.fetchone("SELECT reason FROM placements WHERE thread_id = ? LIMIT 1", (thread_id,))
    return None if row is None else str(row["reason"])
