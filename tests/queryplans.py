"""The statements a piece of store code runs, and whether SQLite plans any of them as a table scan."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from peerd.store.db import Database

SKIP = ("BEGIN", "COMMIT", "ROLLBACK", "SELECT 1", "PRAGMA", "EXPLAIN")


async def statements(db: Database, work: Callable[[], Awaitable[object]]) -> list[str]:
    """Every statement `work()` runs on either of the store's connections (transactions left out)."""
    seen: list[str] = []

    def trace(sql: str) -> None:
        if not sql.lstrip().upper().startswith(SKIP):
            seen.append(sql)

    for conn in (db._r, db._w):
        await conn.set_trace_callback(trace)
    db._p.set_trace_callback(trace)
    try:
        await work()
    finally:
        for conn in (db._r, db._w):
            await conn.set_trace_callback(None)
        db._p.set_trace_callback(None)
    return seen


async def scans(db: Database, sql: str) -> list[str]:
    """The `SCAN` steps of `sql`'s query plan (none: every table is reached by an index)."""
    plan = await db.fetchall("EXPLAIN QUERY PLAN " + sql)
    return [str(row[3]) for row in plan if str(row[3]).startswith("SCAN")]
