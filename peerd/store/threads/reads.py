"""Reads of threads, runs, items and events. Each answers in a bounded number of statements (a
page of threads is one, with each thread's latest run joined in), on the indexes of
`store/schema.py` (tests/unit/test_thread_queries.py plans them)."""

from __future__ import annotations

import json
from typing import Any

import aiosqlite

from peerd.contracts import Event, Page, Run, Thread
from peerd.core.runs import RunFact, RunView
from peerd.errors import InvalidRequest, ItemNotFound, RunNotFound, ThreadNotFound
from peerd.store.db import Database
from peerd.store.threads.rows import (
    RUN_VIEWS,
    THREAD_WITH_LATEST,
    run_from_row,
    thread_from_joined,
    view_from_row,
)


async def get_run(db: Database, run_id: str) -> Run:
    row = await db.lookup("SELECT * FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFound(f"Run {run_id} was not found.")
    return run_from_row(row)


async def run_prompt(db: Database, run_id: str) -> str:
    row = await db.lookup("SELECT prompt FROM runs WHERE id = ?", (run_id,))
    prompt = None if row is None else row[0]
    if prompt is None:
        raise RunNotFound(f"Run {run_id} was not found.")
    return str(prompt)


async def latest_run(db: Database, thread_id: str) -> Run | None:
    row = await db.lookup("SELECT * FROM runs WHERE thread_id = ? ORDER BY number DESC LIMIT 1", (thread_id,))
    return None if row is None else run_from_row(row)


async def run_facts(db: Database, thread_id: str) -> list[RunFact]:
    rows = await db.lookup_all(
        "SELECT id, number, status, origin, reason FROM runs WHERE thread_id = ? ORDER BY number",
        (thread_id,),
    )
    return [RunFact(r["id"], r["number"], r["status"], r["origin"], r["reason"]) for r in rows]


async def last_reply(db: Database, run_id: str) -> str | None:
    """The run's last assistant message, whole."""
    text = await db.scalar(
        "SELECT text FROM items WHERE run_id = ? AND kind = 'assistant_message' ORDER BY position DESC LIMIT 1",
        (run_id,),
    )
    return None if text is None else str(text)


async def run_views(db: Database, thread_id: str) -> list[RunView]:
    rows = await db.lookup_all(RUN_VIEWS, (thread_id,))
    return [view_from_row(r) for r in rows]


async def get_thread(db: Database, thread_id: str) -> Thread:
    """The thread and its latest run, in one statement."""
    row = await db.lookup(f"{THREAD_WITH_LATEST} WHERE t.id = ?", (thread_id,))
    if row is None:
        raise ThreadNotFound(f"Thread {thread_id} was not found.")
    return thread_from_joined(row)


async def page(
    db: Database,
    *,
    project_id: str | None,
    include_archived: bool,
    cursor: str | None,
    limit: int,
    link_origin: str | None = None,
    newest_first: bool = False,
) -> Page[Thread]:
    """One page of threads in creation order (or newest first), each with its latest run: one
    statement per page (`THREAD_WITH_LATEST`), whatever the page's size."""
    try:
        after = int(cursor) if cursor else None
    except ValueError:
        raise InvalidRequest(f"cursor {cursor!r} is not one this API returned.") from None
    if newest_first:
        clauses, params = (["t.rowid < ?"], [after]) if after is not None else ([], [])
    else:
        clauses, params = ["t.rowid > ?"], [after or 0]
    if project_id is not None:
        clauses.append("t.project_id = ?")
        params.append(project_id)  # type: ignore[arg-type]  # mixed params list
    if not include_archived:
        clauses.append("t.status != 'archived'")
    if link_origin is not None:  # a signed-in agent's own threads only
        clauses.append("t.link_origin = ?")
        params.append(link_origin)  # type: ignore[arg-type]  # mixed params list
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    order = "DESC" if newest_first else "ASC"
    rows = await db.fetchall(
        f"{THREAD_WITH_LATEST}{where} ORDER BY t.rowid {order} LIMIT ?",
        (*params, limit + 1),
    )
    more = len(rows) > limit
    rows = rows[:limit]
    items = [thread_from_joined(r) for r in rows]
    return Page[Thread](items=items, next_cursor=str(rows[-1]["page_rowid"]) if more else None)


async def read_items(
    db: Database, thread_id: str, *, after_position: int | None, limit: int, run_id: str | None
) -> list[aiosqlite.Row]:
    sql = "SELECT * FROM items WHERE thread_id = ? AND position > ?"
    params: list[Any] = [thread_id, -1 if after_position is None else after_position]
    if run_id is not None:
        sql += " AND run_id = ?"
        params.append(run_id)
    return await db.fetchall(sql + " ORDER BY position LIMIT ?", (*params, limit + 1))


async def get_item(db: Database, thread_id: str, item_id: str) -> aiosqlite.Row:
    row = await db.fetchone("SELECT * FROM items WHERE id = ? AND thread_id = ?", (item_id, thread_id))
    if row is None:
        raise ItemNotFound(f"Item {item_id} is not in thread {thread_id}.")
    return row


async def events_after(db: Database, thread_id: str, *, after: int, limit: int) -> list[Event]:
    rows = await db.fetchall(
        "SELECT * FROM events WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?", (thread_id, after, limit)
    )
    return [
        Event(
            seq=r["seq"],
            thread_id=r["thread_id"],
            type=r["type"],
            data=json.loads(r["data"]),
            created_at=r["created_at"],
        )
        for r in rows
    ]


async def queued_threads(db: Database) -> list[str]:
    rows = await db.fetchall(
        "SELECT DISTINCT r.thread_id FROM runs r JOIN threads t ON t.id = r.thread_id"
        " WHERE r.status = 'queued' AND t.queue_held = 0 AND t.status = 'active'"
    )
    return [r["thread_id"] for r in rows]


async def busy_threads_of_link(db: Database, client_id: str) -> list[str]:
    """The threads a link started that have a live or queued run (what its revocation stops)."""
    rows = await db.fetchall(
        "SELECT DISTINCT r.thread_id FROM runs r JOIN threads t ON t.id = r.thread_id"
        " WHERE t.link_origin = ? AND r.status IN ('queued', 'starting', 'running')",
        (client_id,),
    )
    return [r["thread_id"] for r in rows]


async def run_by_token_hash(db: Database, token_hash: str) -> Run | None:
    row = await db.fetchone("SELECT * FROM runs WHERE token_hash = ?", (token_hash,))
    return None if row is None else run_from_row(row)


async def counts(db: Database) -> tuple[int, int]:
    threads = int(await db.scalar("SELECT count(*) FROM threads WHERE status = 'active'"))
    live = int(await db.scalar("SELECT count(*) FROM runs WHERE status IN ('starting', 'running')"))
    return threads, live
