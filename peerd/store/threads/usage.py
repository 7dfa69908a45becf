"""What runs spent and the budgets that stop them: the `usage` and `budget` columns of `runs`
(migration 10), stored as `peerd.core.usage` JSON."""

from __future__ import annotations

import json
from typing import Any

import aiosqlite

from peerd import contracts as c
from peerd.core.usage import Budget, Usage, total
from peerd.store.db import Database


def usage_of(column: str | None) -> c.Usage | None:
    """A stored `usage` column as the contract's model (None: unknown)."""
    if not column:
        return None
    return wire_usage(Usage.from_json(json.loads(column)))


def wire_usage(usage: Usage | None) -> c.Usage | None:
    return None if usage is None else c.Usage.model_validate(usage.to_json())


async def set_run_usage(db: Database, run_id: str, usage: Usage) -> None:
    """The run's usage so far (a snapshot: it replaces the last one)."""
    async with db.write() as tx:
        await tx.execute("UPDATE runs SET usage = ? WHERE id = ?", (json.dumps(usage.to_json()), run_id))


async def set_run_budget(db: Database, run_id: str, budget: Budget | None) -> None:
    stored = None if budget is None or budget.empty else json.dumps(budget.to_json())
    async with db.write() as tx:
        await tx.execute("UPDATE runs SET budget = ? WHERE id = ?", (stored, run_id))


async def run_budget(db: Database, run_id: str) -> Budget | None:
    column = await db.scalar("SELECT budget FROM runs WHERE id = ?", (run_id,))
    return Budget.from_json(json.loads(column)) if isinstance(column, str) and column else None


async def thread_usage(db: Database, thread_id: str) -> Usage | None:
    """The sum of the thread's runs' usage; None when no run reported any."""
    rows = await db.fetchall("SELECT usage FROM runs WHERE thread_id = ? AND usage IS NOT NULL", (thread_id,))
    return total(Usage.from_json(json.loads(row["usage"])) for row in rows)


async def thread_total(db: Database, thread_id: str) -> c.Usage | None:
    """`thread_usage` as the contract's model."""
    return wire_usage(await thread_usage(db, thread_id))


# How deep a task's delegations are followed: far more than any real tree (a loop is not possible:
# each child thread is new), a bound all the same.
TASK_DEPTH_MAX = 32


async def task_usage(db: Database, child_thread_id: str | None) -> Usage | None:
    """A local task's usage: its child thread's runs and, recursively, the local tasks that thread
    delegated (tasks it sent to a linked box are not counted here). None: unknown."""
    found: list[Usage] = []
    level = [child_thread_id] if child_thread_id else []
    seen: set[str] = set()
    for _ in range(TASK_DEPTH_MAX):
        level = [t for t in level if t not in seen]
        if not level:
            break
        seen.update(level)
        marks = ",".join("?" * len(level))
        rows = await db.fetchall(
            f"SELECT usage FROM runs WHERE thread_id IN ({marks}) AND usage IS NOT NULL",  # noqa: S608
            tuple(level),
        )
        found += [Usage.from_json(json.loads(row["usage"])) for row in rows]
        children = await db.fetchall(
            f"SELECT child_thread_id FROM tasks WHERE parent_thread_id IN ({marks})"  # noqa: S608
            " AND target_env IS NULL AND child_thread_id IS NOT NULL",
            tuple(level),
        )
        level = [row["child_thread_id"] for row in children]
    return total(found)


async def set_task_usage(db: Database, task_id: str, usage: str) -> None:
    """A remote task's usage as its box reported it (the wire's camelCase JSON)."""
    stored = json.dumps(Usage.from_json(json.loads(usage)).to_json())
    async with db.write() as tx:
        await tx.execute("UPDATE tasks SET usage = ? WHERE id = ?", (stored, task_id))


async def remote_task_usage(db: Database, task_id: str) -> Usage | None:
    column = await db.scalar("SELECT usage FROM tasks WHERE id = ?", (task_id,))
    return Usage.from_json(json.loads(column)) if isinstance(column, str) and column else None


LINK_SPEND_SQL = (
    "SELECT r.usage FROM threads t JOIN runs r ON r.thread_id = t.id"
    " WHERE t.link_origin = ? AND r.created_at >= ?"
)


async def link_spend(db: Database, client_id: str, since: float) -> tuple[int, float]:
    """Runs of threads a link started here since `since`, and what they cost (as reported)."""
    return _spend(await db.fetchall(LINK_SPEND_SQL, (client_id, since)))


async def link_spend_in(tx: aiosqlite.Connection, client_id: str, since: float) -> tuple[int, float]:
    """`link_spend` inside a write transaction: checked and spent in one step."""
    async with tx.execute(LINK_SPEND_SQL, (client_id, since)) as cur:
        return _spend(list(await cur.fetchall()))


def _spend(rows: list[Any]) -> tuple[int, float]:
    usd = sum(Usage.from_json(json.loads(row["usage"])).cost_usd or 0.0 for row in rows if row["usage"])
    return len(rows), usd
