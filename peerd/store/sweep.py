"""The store side of the sweep of open work (`peerd/core/liveness.py`): one snapshot of the open
rows, read with indexed queries (`runs_status`, `approvals_pending`, `tasks_status`,
`moves_unfinished`), and the start-up withdrawal of questions whose run a restart cut."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peerd.core.liveness import (
    ORPHAN_QUESTION,
    OpenApproval,
    OpenMove,
    OpenRun,
    OpenTask,
    OpenWait,
    Snapshot,
)
from peerd.core.moves import UNFINISHED
from peerd.store.db import Database
from peerd.store.sqltext import sql_list

_RUNS = (
    "SELECT r.id, r.thread_id, r.status, coalesce(r.started_at, r.created_at) AS since,"
    " t.queue_held, t.status AS thread_status"
    " FROM runs r JOIN threads t ON t.id = r.thread_id WHERE r.status IN ('queued', 'starting', 'running')"
)
_APPROVALS = (
    "SELECT a.id, a.run_id, r.status AS run_status FROM approvals a LEFT JOIN runs r ON r.id = a.run_id"
    " WHERE a.status = 'pending'"
)
_TASKS = (
    "SELECT k.id, k.status, k.target_env, k.child_thread_id,"
    " EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = k.child_thread_id"
    "         AND r.status IN ('queued', 'starting', 'running'))"
    " OR EXISTS (SELECT 1 FROM tasks g WHERE g.parent_thread_id = k.child_thread_id"
    "            AND g.status IN ('pending', 'running'))"
    " OR EXISTS (SELECT 1 FROM waits w WHERE w.thread_id = k.child_thread_id AND w.status = 'watching') AS busy,"
    " k.target_env IS NULL OR EXISTS (SELECT 1 FROM links l WHERE l.env_id = k.target_env) AS linked"
    " FROM tasks k WHERE k.status IN ('pending', 'running')"
)
_ORPHANED = (
    "status = 'pending' AND NOT EXISTS"
    " (SELECT 1 FROM runs r WHERE r.id = approvals.run_id AND r.status IN ('starting', 'running'))"
)
_MOVES = f"SELECT id, state FROM moves WHERE state IN {sql_list(UNFINISHED)}"  # noqa: S608  # moves_unfinished


_WAITS = "SELECT id FROM waits WHERE status = 'watching'"  # waits_open


QUERIES = (_RUNS, _APPROVALS, _TASKS, _WAITS, _MOVES)


def build(now: float, rows: Sequence[Sequence[Any]]) -> Snapshot:
    """The snapshot from the rows of `QUERIES`, in that order (any mapping-like rows)."""
    run_rows, approval_rows, task_rows, wait_rows, move_rows = rows
    runs = [
        OpenRun(
            id=r["id"],
            thread_id=r["thread_id"],
            status=r["status"],
            since=float(r["since"]),
            queue_held=bool(r["queue_held"]),
            archived=r["thread_status"] != "active",
        )
        for r in run_rows
    ]
    approvals = [
        OpenApproval(id=r["id"], run_id=r["run_id"], run_status=r["run_status"]) for r in approval_rows
    ]
    tasks = [
        OpenTask(
            id=r["id"],
            status=r["status"],
            target_env=r["target_env"],
            child_thread_id=r["child_thread_id"],
            child_busy=bool(r["busy"]),
            link_known=bool(r["linked"]),
        )
        for r in task_rows
    ]
    moves = [OpenMove(id=r["id"], state=r["state"]) for r in move_rows]
    waits = [OpenWait(id=r["id"]) for r in wait_rows]
    return Snapshot(now=now, runs=runs, approvals=approvals, tasks=tasks, moves=moves, waits=waits)


async def snapshot(db: Database, *, now: float) -> Snapshot:
    """The open runs, questions, tasks and moves of this store, as the sweep decides on them."""
    return build(now, [await db.fetchall(sql) for sql in QUERIES])


async def withdraw_orphaned_questions(db: Database, *, now: float) -> list[str]:
    """At start-up, right after the cut runs are recovered and before anything is served: every
    pending question whose run is not live is withdrawn (`cancelled`, by `run_ended`), in one
    transaction. Returns their ids."""
    async with db.write() as tx:
        rows = await tx.execute_fetchall(f"SELECT id FROM approvals WHERE {_ORPHANED}")  # noqa: S608
        ids = [r["id"] for r in rows]
        if ids:
            await tx.execute(
                f"UPDATE approvals SET status = 'cancelled', reason = ?, decided_by = 'run_ended', decided_at = ? WHERE {_ORPHANED}",  # noqa: S608, E501
                (ORPHAN_QUESTION, now),
            )
    return ids
