"""The change feed's queries: the box's durable subscriptions (`feed_runs`, migration 9) and what
it reads to report followed runs; the laptop's lean reads of a link's open tasks.

Every query here is served by an index (tests/tasks/test_query_plans.py checks them with
`EXPLAIN QUERY PLAN`): `feed_runs` by its primary key (client, run); runs by their thread
(`UNIQUE (thread_id, number)`); threads by id; tasks by parent (`tasks_parent`); items by thread and
position (a run's last reply, newest first); and a link's open
tasks by the partial index `tasks_followed` (only open tasks are in it: history costs nothing).
Lists of ids are read `CHUNK` at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiosqlite

from peerd.core.runs import RunFact
from peerd.store.db import Database
from peerd.tasks.machine import OpenTask

CHUNK = 500
LOOKUP_MAX = 8  # threads looked at inline in one read (a wake); more go to the reader's thread
# Exactly the partial index's condition (migration 9), so SQLite uses it.
OPEN = "(status IN ('pending', 'running') OR stop_owed = 1)"
_COLUMNS = "id, status, child_thread_id, child_run_id, stop_owed, target_label, target_env"
# Built from the constants above only (no value is ever formatted into SQL: values are `?`).
_OPEN_FOR_ENV = f"SELECT {_COLUMNS} FROM tasks WHERE target_env = ? AND {OPEN} ORDER BY created_at"  # noqa: S608
_OPEN_TASK = f"SELECT {_COLUMNS} FROM tasks WHERE id = ? AND {OPEN}"  # noqa: S608
_NOTE_ERROR = f"UPDATE tasks SET last_error = ?, updated_at = ? WHERE target_env = ? AND {OPEN}"  # noqa: S608


_RESOLVE = (
    "SELECT runs.id AS run_id, runs.thread_id AS thread_id FROM runs"
    " JOIN threads ON threads.id = runs.thread_id WHERE "
)
_FACTS = (
    "SELECT threads.id AS thread_id, threads.queue_held AS queue_held, EXISTS (SELECT 1 FROM tasks"
    " WHERE tasks.parent_thread_id = threads.id AND tasks.status IN ('pending', 'running'))"
    " OR EXISTS (SELECT 1 FROM waits WHERE waits.thread_id = threads.id AND waits.status = 'watching') AS busy,"
    " runs.id AS id, runs.number AS number, runs.status AS status, runs.origin AS origin,"
    " runs.reason AS reason FROM threads JOIN runs ON runs.thread_id = threads.id WHERE "
)


def _chunks(ids: Iterable[str]) -> Iterable[list[str]]:
    batch: list[str] = []
    for value in ids:
        batch.append(value)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def _marks(batch: Sequence[str]) -> str:
    """`?, ?, ...`: one placeholder per value (the only text formatted into the queries below)."""
    return ", ".join("?" * len(batch))


# --- the box: subscriptions -----------------------------------------------------------------------


async def subscription(db: Database, client_id: str) -> dict[str, str | None]:
    """A link's followed runs, each with its thread (None: not a run of this link's threads)."""
    rows = await db.fetchall("SELECT run_id, thread_id FROM feed_runs WHERE client_id = ?", (client_id,))
    return {r["run_id"]: r["thread_id"] for r in rows}


async def resolve(db: Database, client_id: str, run_ids: Iterable[str]) -> dict[str, str]:
    """The threads of these runs, for the runs of threads this link started (no others)."""
    found: dict[str, str] = {}
    for batch in _chunks(run_ids):
        where = f"runs.id IN ({_marks(batch)}) AND threads.link_origin = ?"
        rows = await db.fetchall(_RESOLVE + where, (*batch, client_id))
        found.update((r["run_id"], r["thread_id"]) for r in rows)
    return found


async def save(
    db: Database, client_id: str, *, add: dict[str, str | None], remove: Iterable[str], reset: bool
) -> None:
    """A subscription change, in one transaction (made durable before it is applied in memory)."""
    async with db.write() as tx:
        if reset:
            await tx.execute("DELETE FROM feed_runs WHERE client_id = ?", (client_id,))
        else:
            await tx.executemany(
                "DELETE FROM feed_runs WHERE client_id = ? AND run_id = ?",
                [(client_id, run_id) for run_id in remove if run_id not in add],
            )
        await tx.executemany(
            "INSERT OR IGNORE INTO feed_runs (client_id, run_id, thread_id) VALUES (?, ?, ?)",
            [(client_id, run_id, thread_id) for run_id, thread_id in add.items()],
        )


@dataclass(frozen=True)
class ThreadFacts:
    queue_held: bool
    runs: list[RunFact]
    open_children: bool


async def thread_facts(db: Database, client_id: str, thread_ids: Iterable[str]) -> dict[str, ThreadFacts]:
    """What settlement needs of these threads, for those this link started: one read per `CHUNK`
    threads (their runs, the queue, and whether they wait on tasks of their own), whatever their
    number."""
    facts: dict[str, ThreadFacts] = {}
    for batch in _chunks(thread_ids):
        where = f"threads.id IN ({_marks(batch)}) AND threads.link_origin = ?"
        sql, params = _FACTS + where + " ORDER BY threads.id, runs.number", (*batch, client_id)
        # A wake looks at one thread or a few (read inline); a resync at up to `CHUNK` (the reader).
        rows = await (db.lookup_all(sql, params) if len(batch) <= LOOKUP_MAX else db.fetchall(sql, params))
        for r in rows:
            fact = facts.get(r["thread_id"])
            if fact is None:
                fact = facts[r["thread_id"]] = ThreadFacts(bool(r["queue_held"]), [], bool(r["busy"]))
            fact.runs.append(RunFact(r["id"], r["number"], r["status"], r["origin"], r["reason"]))
    return facts


async def last_reply(db: Database, thread_id: str, run_id: str) -> str | None:
    """A run's last assistant message, whole (by its thread's position index, newest first)."""
    row = await db.lookup(
        "SELECT text FROM items WHERE thread_id = ? AND run_id = ? AND kind = 'assistant_message'"
        " ORDER BY position DESC LIMIT 1",
        (thread_id, run_id),
    )
    return None if row is None or row[0] is None else str(row[0])


# --- the laptop: a link's open tasks, the columns the follower needs ----------------------------------


def _open_task(row: aiosqlite.Row) -> OpenTask:
    return OpenTask(
        id=row["id"],
        status=row["status"],
        child_thread_id=row["child_thread_id"],
        child_run_id=row["child_run_id"],
        stop_owed=bool(row["stop_owed"]),
        label=row["target_label"] or row["target_env"] or "the linked environment",
    )


async def open_tasks(db: Database, env_id: str) -> list[OpenTask]:
    """The link's open work, oldest first: read once when its follower starts."""
    rows = await db.fetchall(_OPEN_FOR_ENV, (env_id,))
    return [_open_task(r) for r in rows]


async def open_task(db: Database, task_id: str) -> OpenTask | None:
    """One task as the follower needs it, or None when it owes the follower nothing any more."""
    row = await db.lookup(_OPEN_TASK, (task_id,))
    return None if row is None else _open_task(row)


async def note_error(db: Database, env_id: str, error: str | None, *, now: float) -> None:
    """The link's trouble, on each of its open tasks (`lastError`): one statement, not one per task."""
    async with db.write() as tx:
        await tx.execute(_NOTE_ERROR, (error, now, env_id))
