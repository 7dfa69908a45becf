"""The A2A face's store (migration 22): pages of tasks, and the tasks placed on a linked box.

- `run_page`: the runs a caller may see as tasks, newest first by (`created_at`, id), after a
  position, filtered as `ListTasks` asks (`runs_created`).
- `a2a_remote_tasks` (on a laptop): an A2A task whose run is on a linked box (a2a/remote.py). The
  launch or send is recorded before it leaves, keyed by the caller's namespace and the message's
  key; the box's thread and run are attached when it answers; the task as last seen there is kept
  (A2A JSON), so it is served after a restart of either daemon; `cancel_owed` until the box took
  the cancel.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from peerd import contracts as c
from peerd.a2a.mapping import Position
from peerd.core.runs import RunStatus
from peerd.store.db import Database
from peerd.store.threads.rows import run_from_row


@dataclass(frozen=True)
class Filter:
    """What `ListTasks` asks, as the store reads it (None: any)."""

    link_origin: str | None  # a link's or an agent's own threads only
    context_id: str | None
    statuses: Sequence[RunStatus] | None
    changed_after: float | None  # the status' time (ended, else started, else created) at or after


def _where(f: Filter, before: Position | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if f.link_origin is not None:
        clauses.append("r.thread_id IN (SELECT id FROM threads WHERE link_origin = ?)")
        params.append(f.link_origin)
    if f.context_id is not None:
        clauses.append("r.thread_id = ?")
        params.append(f.context_id)
    if f.statuses is not None:
        clauses.append(f"r.status IN ({', '.join('?' for _ in f.statuses)})")
        params += list(f.statuses)
    if f.changed_after is not None:
        clauses.append("coalesce(r.ended_at, r.started_at, r.created_at) >= ?")
        params.append(f.changed_after)
    if before is not None:
        clauses.append("(r.created_at < ? OR (r.created_at = ? AND r.id < ?))")
        params += [before.created_at, before.created_at, before.id]
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


async def run_page(db: Database, f: Filter, *, before: Position | None, limit: int) -> list[c.Run]:
    where, params = _where(f, before)
    rows = await db.fetchall(
        f"SELECT r.* FROM runs r{where} ORDER BY r.created_at DESC, r.id DESC LIMIT ?",  # noqa: S608
        (*params, limit),
    )
    return [run_from_row(r) for r in rows]


async def run_count(db: Database, f: Filter) -> int:
    where, params = _where(f, None)
    count = await db.scalar(f"SELECT COUNT(*) FROM runs r{where}", tuple(params))  # noqa: S608
    return int(count or 0)


# --- tasks on a linked box (a laptop's) ------------------------------------------------------------


@dataclass(frozen=True)
class Remote:
    namespace: str
    request_key: str
    env_id: str
    method: str  # "launch" (a new thread there) or "send" (the next run of a thread there)
    body: dict[str, Any]  # the ThreadLaunch or ThreadSend it sends (again, until the box answered)
    task_id: str | None  # the box's run, once it answered
    thread_id: str | None  # the box's thread (a send's is known before)
    state: str | None  # the A2A state last seen
    task: str | None  # the A2A task last seen (JSON)
    cancel_owed: bool
    last_error: str | None
    created_at: float
    ended_at: float | None

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.request_key

    @property
    def position(self) -> Position:
        return Position(self.created_at, self.task_id or "")


def _remote(row: Any) -> Remote:
    return Remote(
        namespace=row["namespace"],
        request_key=row["request_key"],
        env_id=row["env_id"],
        method=row["method"],
        body=json.loads(row["body"]),
        task_id=row["task_id"],
        thread_id=row["thread_id"],
        state=row["state"],
        task=row["task"],
        cancel_owed=bool(row["cancel_owed"]),
        last_error=row["last_error"],
        created_at=row["created_at"],
        ended_at=row["ended_at"],
    )


async def remote_record(
    db: Database,
    key: tuple[str, str],
    *,
    env_id: str,
    method: str,
    body: dict[str, Any],
    thread_id: str | None,
    now: float,
) -> Remote:
    """Record the request before it leaves; one recorded earlier under the key is kept as it was."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO a2a_remote_tasks (namespace, request_key, env_id, method, body, thread_id, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, request_key) DO NOTHING",
            (*key, env_id, method, json.dumps(body, sort_keys=True), thread_id, now, now),
        )
    found = await remote_get(db, key)
    assert found is not None  # noqa: S101  # just written, or kept
    return found


async def remote_get(db: Database, key: tuple[str, str]) -> Remote | None:
    row = await db.fetchone("SELECT * FROM a2a_remote_tasks WHERE namespace = ? AND request_key = ?", key)
    return None if row is None else _remote(row)


async def remote_by_task(db: Database, task_id: str) -> Remote | None:
    row = await db.fetchone("SELECT * FROM a2a_remote_tasks WHERE task_id = ?", (task_id,))
    return None if row is None else _remote(row)


async def remote_in_thread(db: Database, thread_id: str) -> Remote | None:
    """A task of a thread on a box (the thread is a context this machine follows there)."""
    row = await db.fetchone(
        "SELECT * FROM a2a_remote_tasks WHERE thread_id = ? ORDER BY created_at LIMIT 1", (thread_id,)
    )
    return None if row is None else _remote(row)


async def remote_open(db: Database) -> list[Remote]:
    rows = await db.fetchall("SELECT * FROM a2a_remote_tasks WHERE ended_at IS NULL ORDER BY created_at")
    return [_remote(r) for r in rows]


async def remote_forget(db: Database, key: tuple[str, str]) -> None:
    """A request the box refused for good before any task was made: nothing started there."""
    async with db.write() as tx:
        await tx.execute(
            "DELETE FROM a2a_remote_tasks WHERE namespace = ? AND request_key = ? AND task_id IS NULL", key
        )


async def remote_attach(
    db: Database, key: tuple[str, str], *, task_id: str, thread_id: str, now: float
) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE a2a_remote_tasks SET task_id = ?, thread_id = ?, last_error = NULL, updated_at = ? "
            "WHERE namespace = ? AND request_key = ?",
            (task_id, thread_id, now, *key),
        )


async def remote_seen(
    db: Database, key: tuple[str, str], *, state: str, task: str, ended: bool, now: float
) -> None:
    """The task as the box showed it now (`ended`: for good; nothing more is asked there)."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE a2a_remote_tasks SET state = ?, task = ?, last_error = NULL, updated_at = ?, "
            "ended_at = CASE WHEN ? THEN ? ELSE ended_at END WHERE namespace = ? AND request_key = ?",
            (state, task, now, ended, now, *key),
        )


async def remote_cancel_owed(db: Database, key: tuple[str, str], owed: bool, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE a2a_remote_tasks SET cancel_owed = ?, updated_at = ? WHERE namespace = ? AND request_key = ?",
            (int(owed), now, *key),
        )


async def remote_failed(db: Database, key: tuple[str, str], error: str, *, now: float) -> None:
    """Why the last try to reach the task there failed (it is tried again)."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE a2a_remote_tasks SET last_error = ?, updated_at = ? WHERE namespace = ? AND request_key = ?",
            (error[:500], now, *key),
        )


def _remote_where(
    namespace: str | None, context_id: str | None, states: Sequence[str] | None
) -> tuple[list[str], list[Any]]:
    clauses: list[str] = ["task_id IS NOT NULL"]
    params: list[Any] = []
    if namespace is not None:
        clauses.append("namespace = ?")
        params.append(namespace)
    if context_id is not None:
        clauses.append("thread_id = ?")
        params.append(context_id)
    if states is not None:
        clauses.append(f"coalesce(state, 'submitted') IN ({', '.join('?' for _ in states)})")
        params += list(states)
    return clauses, params


async def remote_page(
    db: Database,
    *,
    namespace: str | None,
    context_id: str | None,
    states: Sequence[str] | None,
    before: Position | None,
    limit: int,
) -> list[Remote]:
    """Tasks on boxes with a task id, newest first (`namespace` None: everyone's, the owner's view)."""
    clauses, params = _remote_where(namespace, context_id, states)
    if before is not None:
        clauses.append("(created_at < ? OR (created_at = ? AND task_id < ?))")
        params += [before.created_at, before.created_at, before.id]
    rows = await db.fetchall(
        f"SELECT * FROM a2a_remote_tasks WHERE {' AND '.join(clauses)} "  # noqa: S608
        "ORDER BY created_at DESC, task_id DESC LIMIT ?",
        (*params, limit),
    )
    return [_remote(r) for r in rows]


async def remote_count(
    db: Database, *, namespace: str | None, context_id: str | None, states: Sequence[str] | None
) -> int:
    clauses, params = _remote_where(namespace, context_id, states)
    found = await db.scalar(
        f"SELECT COUNT(*) FROM a2a_remote_tasks WHERE {' AND '.join(clauses)}",  # noqa: S608
        tuple(params),
    )
    return int(found or 0)


GIVEN_UP_WINDOW_S = 7 * 86_400.0  # `peerd status` and `peerd doctor` warn of pushes given up this recently


async def pushes_given_up(db: Database, *, now: float, window_s: float, latest: int) -> c.PushHealth:
    """The pushes given up in the last `window_s` (`peerd status`, `peerd doctor`): how many,
    and the `latest` few, newest first, each with its webhook's scheme, host and port only."""
    since = now - window_s
    count = await db.scalar(
        "SELECT COUNT(*) FROM a2a_push_owed WHERE given_up IS NOT NULL AND given_up_at >= ?", (since,)
    )
    rows = await db.fetchall(
        "SELECT o.task_id, o.state, o.given_up, o.given_up_at, p.url FROM a2a_push_owed o "
        "LEFT JOIN a2a_push_configs p ON p.task_id = o.task_id AND p.id = o.config_id "
        "WHERE o.given_up IS NOT NULL AND o.given_up_at >= ? ORDER BY o.given_up_at DESC LIMIT ?",
        (since, latest),
    )
    return c.PushHealth(
        given_up=int(count or 0),
        window_s=window_s,
        latest=[
            c.GivenUpPush(
                task_id=r["task_id"],
                webhook=_origin(r["url"]),
                state=r["state"],
                reason=r["given_up"],
                given_up_at=r["given_up_at"],
            )
            for r in rows
        ],
    )


async def owes_work(db: Database) -> bool:
    """Whether the A2A face has work to resume at start: a push config (its task's changes are
    owed as pushes), a push still to deliver, or a task on a box still followed."""
    row = await db.fetchone(
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM a2a_push_configs)"
        " OR EXISTS (SELECT 1 FROM a2a_push_owed WHERE delivered_at IS NULL AND given_up IS NULL)"
        " OR EXISTS (SELECT 1 FROM a2a_remote_tasks WHERE ended_at IS NULL)"
    )
    return row is not None


def _origin(url: str | None) -> str:
    """A webhook as a person is shown it: scheme, host and port (its path and query may hold a secret)."""
    if not url:
        return "(its config was deleted)"
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}"
