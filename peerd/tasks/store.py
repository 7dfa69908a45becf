"""Delegated tasks in the store: recorded before their launch leaves, completed once, waking the
parent once; the link's stored backoff.

Completion and the parent's wake are one transaction: the task's status and result, and (when the
wake rules say so) the wake run on the parent thread. A crash can therefore never leave a task that
ended without its wake, nor wake twice.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, get_args

import aiosqlite

from peerd import contracts as c
from peerd.errors import IdempotencyKeyReused, NotFound
from peerd.store import threads
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.tasks.rules import Wake, complete, is_task_terminal, wake_due, wake_text
from peerd.tasks.rules import backoff_wait as backoff_wait_rule


@dataclass(frozen=True)
class TaskRow:
    id: str
    parent_thread_id: str
    parent_run_id: str
    namespace: str
    request_key: str
    title: str
    prompt: str
    target_env: str | None
    target_label: str | None
    project_id: str | None
    provider: str
    model: str | None
    runtime_mode: str | None
    interaction_mode: str | None
    launch_key: str
    child_thread_id: str | None
    child_run_id: str | None
    status: str
    result: str | None
    wake: str
    woken_run_id: str | None
    stop_owed: bool
    stop_reason: str | None
    last_error: str | None
    created_at: float
    ended_at: float | None
    budget: str | None = None  # the child run's stop rule, `Budget.to_json` as JSON

    @property
    def terminal(self) -> bool:
        return is_task_terminal(self.status)

    def info(self, *, wait_timed_out: bool | None = None) -> c.TaskInfo:
        remote = None
        if self.target_env is not None:
            remote = c.RemoteChild(
                environment_id=self.target_env,
                thread_id=self.child_thread_id,
                run_id=self.child_run_id,
                label=self.target_label or self.target_env,
            )
        return c.TaskInfo(
            task_id=self.id,
            status=self.status,
            title=self.title,
            parent_thread_id=self.parent_thread_id,
            child_thread_id=None if remote else self.child_thread_id,
            child_run_id=None if remote else self.child_run_id,
            remote_child=remote,
            result=self.result,
            stop_owed=self.stop_owed,
            last_error=self.last_error,
            wait_timed_out=wait_timed_out,
            created_at=self.created_at,
            ended_at=self.ended_at,
        )


def _row(r: aiosqlite.Row) -> TaskRow:
    return TaskRow(
        id=r["id"],
        parent_thread_id=r["parent_thread_id"],
        parent_run_id=r["parent_run_id"],
        namespace=r["namespace"],
        request_key=r["request_key"],
        title=r["title"],
        prompt=r["prompt"],
        target_env=r["target_env"],
        target_label=r["target_label"],
        project_id=r["project_id"],
        provider=r["provider"],
        model=r["model"],
        runtime_mode=r["runtime_mode"],
        interaction_mode=r["interaction_mode"],
        launch_key=r["launch_key"],
        child_thread_id=r["child_thread_id"],
        child_run_id=r["child_run_id"],
        status=r["status"],
        result=r["result"],
        wake=r["wake"],
        woken_run_id=r["woken_run_id"],
        stop_owed=bool(r["stop_owed"]),
        stop_reason=r["stop_reason"],
        last_error=r["last_error"],
        created_at=r["created_at"],
        ended_at=r["ended_at"],
        budget=r["budget"],
    )


@dataclass(frozen=True)
class NewTask:
    parent_thread_id: str
    parent_run_id: str
    namespace: str
    request_key: str
    request_hash: str
    title: str
    prompt: str
    target_env: str | None
    target_label: str | None
    project_id: str | None
    provider: str
    model: str | None
    runtime_mode: str | None
    interaction_mode: str | None
    wake: Wake
    budget: str | None = None


async def _one(tx: Tx, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row | None:
    async with tx.execute(sql, params) as cur:
        row: aiosqlite.Row | None = await cur.fetchone()
        return row


async def record(db: Database, new: NewTask, *, now: float) -> tuple[TaskRow, bool]:
    """Record the task before its launch leaves. A retry with the same key returns the first task."""
    async with db.write() as tx:
        existing = await _one(
            tx,
            "SELECT * FROM tasks WHERE namespace = ? AND request_key = ?",
            (new.namespace, new.request_key),
        )
        if existing is not None:
            if existing["request_hash"] != new.request_hash:
                raise IdempotencyKeyReused(
                    f"clientRequestId {new.request_key!r} was already used for a different delegate_task. "
                    "Use a new clientRequestId for a new task, or repeat the original call to get its task."
                )
            return _row(existing), True
        task_id = new_id("tsk")
        # The key the launch carries is fixed now, so a re-sent launch after a crash is the same launch.
        launch_key = f"delegate:{new.parent_thread_id}:{new.request_key}"
        await tx.execute(
            "INSERT INTO tasks (id, parent_thread_id, parent_run_id, namespace, request_key, request_hash, title,"
            " prompt, target_env, target_label, project_id, provider, model, runtime_mode, interaction_mode,"
            " launch_key, status, wake, created_at, updated_at, budget)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
            (
                task_id,
                new.parent_thread_id,
                new.parent_run_id,
                new.namespace,
                new.request_key,
                new.request_hash,
                new.title,
                new.prompt,
                new.target_env,
                new.target_label,
                new.project_id,
                new.provider,
                new.model,
                new.runtime_mode,
                new.interaction_mode,
                launch_key,
                new.wake,
                now,
                now,
                new.budget,
            ),
        )
        await threads.event(
            tx, new.parent_thread_id, "task.updated", {"taskId": task_id, "status": "pending"}, now
        )
        row = await _one(tx, "SELECT * FROM tasks WHERE id = ?", (task_id,))
    if row is None:
        raise RuntimeError("task vanished inside its own transaction")
    return _row(row), False


async def attach(
    db: Database, task_id: str, *, child_thread_id: str, child_run_id: str | None, now: float
) -> TaskRow:
    """The launch was answered: record the child's ids; a pending task becomes running."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE tasks SET child_thread_id = ?, child_run_id = ?, last_error = NULL, updated_at = ?,"
            " status = CASE WHEN status = 'pending' THEN 'running' ELSE status END WHERE id = ?",
            (child_thread_id, child_run_id, now, task_id),
        )
        row = await _one(tx, "SELECT * FROM tasks WHERE id = ?", (task_id,))
        if row is None:
            raise NotFound(f"Task {task_id} was not found.")
        await threads.event(
            tx, row["parent_thread_id"], "task.updated", {"taskId": task_id, "status": row["status"]}, now
        )
    return _row(row)


async def finish(
    db: Database, task_id: str, status: c.TaskStatus, result: str, *, now: float, wake: bool = True
) -> TaskRow | None:
    """Complete the task once and wake its parent in the same transaction; None if it had ended."""
    async with db.write() as tx:
        row = await _one(tx, "SELECT * FROM tasks WHERE id = ?", (task_id,))
        if row is None:
            raise NotFound(f"Task {task_id} was not found.")
        done = complete(row["status"], status, result)
        if done is None:
            return None  # first result wins: a late or duplicate report changes nothing
        live = await _one(
            tx,
            "SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('starting', 'running') LIMIT 1",
            (row["parent_thread_id"],),
        )
        woken = None
        parent = await _one(
            tx, "SELECT status, queue_held FROM threads WHERE id = ?", (row["parent_thread_id"],)
        )
        due = wake_due(
            row["wake"],
            parent_status=None if parent is None else parent["status"],
            queue_held=bool(parent is not None and parent["queue_held"]),
            parent_live=live is not None,
            wanted=wake,
        )
        if due:
            woken = await threads.insert_run(
                tx, row["parent_thread_id"], wake_text([task_id]), now, origin="wake"
            )
        # The one place a task ends: never before it was created, whatever the wall clock did
        # (a step back of 600 s made `ended_at` < `created_at`: issue 26, case 9).
        ended_at = max(now, float(row["created_at"]))
        await tx.execute(
            "UPDATE tasks SET status = ?, result = ?, ended_at = ?, updated_at = ?, woken_run_id = ? WHERE id = ?",
            (done.status, done.result, ended_at, ended_at, woken, task_id),
        )
        await threads.event(
            tx, row["parent_thread_id"], "task.updated", {"taskId": task_id, "status": done.status}, now
        )
        updated = await _one(tx, "SELECT * FROM tasks WHERE id = ?", (task_id,))
    return None if updated is None else _row(updated)


async def get(db: Database, task_id: str) -> TaskRow:
    row = await db.lookup("SELECT * FROM tasks WHERE id = ?", (task_id,))
    if row is None:
        raise NotFound(f"Task {task_id} was not found.")
    return _row(row)


async def set_wake(db: Database, task_id: str, wake: Wake, *, now: float) -> TaskRow:
    """A wait that timed out (or whose caller went away) switches the task to wake its parent
    when it ends."""
    async with db.write() as tx:
        await tx.execute("UPDATE tasks SET wake = ?, updated_at = ? WHERE id = ?", (wake, now, task_id))
        row = await _one(tx, "SELECT * FROM tasks WHERE id = ?", (task_id,))
        if row is None:
            raise NotFound(f"Task {task_id} was not found.")
    return _row(row)


async def set_stop(db: Database, task_id: str, *, owed: bool, reason: str | None, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE tasks SET stop_owed = ?, stop_reason = coalesce(?, stop_reason), updated_at = ? WHERE id = ?",
            (int(owed), reason, now, task_id),
        )


async def set_error(db: Database, task_id: str, error: str | None, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE tasks SET last_error = ?, updated_at = ? WHERE id = ?", (error, now, task_id)
        )


async def for_parent(db: Database, parent_thread_id: str) -> list[TaskRow]:
    rows = await db.fetchall(
        "SELECT * FROM tasks WHERE parent_thread_id = ? ORDER BY created_at", (parent_thread_id,)
    )
    return [_row(r) for r in rows]


# --- the task list (`GET /v1/tasks`): newest first, paged by rowid ------------------------------

TASK_STATUSES: tuple[str, ...] = get_args(c.TaskStatus)
# What a list row needs (not the prompt, which may be 120,000 characters).
_LISTED = "rowid AS rid, " + ", ".join(
    "'' AS prompt" if f.name == "prompt" else f.name for f in fields(TaskRow)
)


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks `task list` shows; `local` means the children run here (`target_env` NULL)."""

    parent_thread_id: str | None = None
    statuses: tuple[str, ...] = ()
    target_env: str | None = None
    local: bool = False


def listing_queries(f: TaskFilter, *, before: int, limit: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The queries of one page, each an index search ordered by rowid (no full scan, no sort):
    a parent's tasks through `tasks_parent` (its few rows filtered); otherwise one query per
    status, through `tasks_open (target_env, status)` or `tasks_status (status)`. The caller
    merges them newest first."""
    statuses = tuple(dict.fromkeys(f.statuses))
    where: list[str] = ["rowid < ?"]
    params: list[Any] = [before]
    # In a parent's query, `+column` keeps the planner off the other indexes.
    plus = "+" if f.parent_thread_id is not None else ""
    if f.parent_thread_id is not None:
        where.append("parent_thread_id = ?")
        params.append(f.parent_thread_id)
    if f.local:
        where.append(f"{plus}target_env IS NULL")
    elif f.target_env is not None:
        where.append(f"{plus}target_env = ?")
        params.append(f.target_env)
    per_status: tuple[str | None, ...] = (None,)
    if f.parent_thread_id is not None and statuses:
        where.append(f"+status IN ({', '.join('?' for _ in statuses)})")
        params.extend(statuses)
    elif f.parent_thread_id is None and (statuses or f.local or f.target_env is not None):
        per_status = statuses or TASK_STATUSES
    queries = []
    for status in per_status:
        clauses, args = list(where), list(params)
        if status is not None:
            clauses.append("status = ?")
            args.append(status)
        sql = f"SELECT {_LISTED} FROM tasks WHERE {' AND '.join(clauses)} ORDER BY rowid DESC LIMIT ?"  # noqa: S608
        queries.append((sql, (*args, limit + 1)))
    return queries


async def page(db: Database, f: TaskFilter, *, cursor: str | None, limit: int) -> c.Page[c.TaskInfo]:
    """One page of tasks, newest first; `cursor` is the last page's `nextCursor` (a rowid)."""
    before = int(cursor) if cursor else c.MAX_SQL_INT
    rows: list[aiosqlite.Row] = []
    for sql, params in listing_queries(f, before=before, limit=limit):
        rows.extend(await db.fetchall(sql, params))
    rows.sort(key=lambda r: int(r["rid"]), reverse=True)
    more = len(rows) > limit
    rows = rows[:limit]
    return c.Page[c.TaskInfo](
        items=[_row(r).info() for r in rows], next_cursor=str(rows[-1]["rid"]) if more else None
    )


async def open_for_env(db: Database, env_id: str) -> list[TaskRow]:
    """Remote tasks the follower owes work: not ended yet, or a stop still to deliver."""
    rows = await db.fetchall(
        "SELECT * FROM tasks WHERE target_env = ? AND (status IN ('pending', 'running') OR stop_owed = 1)"
        " ORDER BY created_at",
        (env_id,),
    )
    return [_row(r) for r in rows]


async def envs_with_open_tasks(db: Database) -> list[str]:
    rows = await db.fetchall(
        "SELECT DISTINCT target_env FROM tasks WHERE target_env IS NOT NULL"
        " AND (status IN ('pending', 'running') OR stop_owed = 1)"
    )
    return [r["target_env"] for r in rows]


async def open_local(db: Database, *, child_thread_id: str | None = None) -> list[TaskRow]:
    sql = "SELECT * FROM tasks WHERE target_env IS NULL AND status IN ('pending', 'running')"
    if child_thread_id is None:
        return [_row(r) for r in await db.fetchall(sql)]
    return [_row(r) for r in await db.fetchall(sql + " AND child_thread_id = ?", (child_thread_id,))]


async def delegated_by(db: Database, thread_id: str) -> tuple[str, str] | None:
    """Who delegated this thread here: (task id, parent thread id) of its open local task, if any
    (an approval's context says which task a question comes from)."""
    open_tasks = await open_local(db, child_thread_id=thread_id)
    return None if not open_tasks else (open_tasks[0].id, open_tasks[0].parent_thread_id)


async def has_open_children(db: Database, thread_id: str) -> bool:
    """Does this thread still wait on tasks it delegated, or on a pull request (a wait it recorded,
    peerd/waits/)? Its own result is not final until not: the wake that ends it carries it on."""
    row = await db.fetchone(
        "SELECT 1 FROM tasks WHERE parent_thread_id = ? AND status IN ('pending', 'running')"
        " UNION ALL SELECT 1 FROM waits WHERE thread_id = ? AND status = 'watching' LIMIT 1",
        (thread_id, thread_id),
    )
    return row is not None


async def backoff(db: Database, env_id: str) -> tuple[int, float]:
    """The stored attempts and the wall time of the next try (0, 0.0: none)."""
    row = await db.fetchone("SELECT attempts, next_at FROM link_backoff WHERE env_id = ?", (env_id,))
    return (0, 0.0) if row is None else (int(row["attempts"]), float(row["next_at"]))


async def backoff_wait(db: Database, env_id: str, *, wall_now: float) -> tuple[int, float]:
    """What a starting follower resumes: the attempts, and how long to wait still, bounded by
    the stored delay whatever the wall clock did meanwhile (`rules.backoff_wait`)."""
    row = await db.fetchone("SELECT attempts, next_at, delay_s FROM link_backoff WHERE env_id = ?", (env_id,))
    if row is None:
        return 0, 0.0
    attempts, delay = int(row["attempts"]), row["delay_s"]
    wait = backoff_wait_rule(
        attempts, float(row["next_at"]), None if delay is None else float(delay), wall_now
    )
    return attempts, wait


async def set_backoff(
    db: Database,
    env_id: str,
    *,
    attempts: int,
    next_at: float,
    error: str | None,
    delay_s: float | None = None,
) -> None:
    """Store a link's backoff: `next_at` is wall time (the decision's wall time + `delay_s`)."""
    async with db.write() as tx:
        if attempts == 0:
            await tx.execute("DELETE FROM link_backoff WHERE env_id = ?", (env_id,))
        else:
            await tx.execute(
                "INSERT INTO link_backoff (env_id, attempts, next_at, last_error, delay_s) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(env_id) DO UPDATE SET attempts = excluded.attempts, next_at = excluded.next_at,"
                " last_error = excluded.last_error, delay_s = excluded.delay_s",
                (env_id, attempts, next_at, error, delay_s),
            )
