"""What runs spent and the budgets that stop them: the `usage` and `budget` columns of `runs`
(migration 10), stored as `peerd.core.usage` JSON.

A run whose CLI reports no cost gets an estimate from the owner's price table (`[prices]` in
config.toml, given to this store by the daemon with `use_prices`) when its usage is stored: the
price of the thread's model, else of the provider's configured model, else of an entry named after
the provider. So everything that reads stored usage (thread and task sums, the per-link dollar
ceiling, an orchestration's budgets) counts it, marked `costEstimated`; a run's `usd` budget is
given the same price (`run_budget`), so it stops the run on the estimate as usage arrives."""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from peerd import contracts as c
from peerd.core.usage import (
    Budget,
    MeteredRun,
    Price,
    Usage,
    budget_scope,
    ceiling_spend,
    estimate,
    price_for,
    scope_budget,
    spent_before,
    total,
)
from peerd.store.db import Database, Tx


@dataclass
class _Prices:
    table: dict[str, Price]
    models: dict[str, str]  # provider -> its configured model
    runs: dict[str, Price | None] = field(default_factory=dict)  # run id -> its price, once looked up


# One price table per daemon (its store): two daemons in one process never share one.
_PRICES: weakref.WeakKeyDictionary[Database, _Prices] = weakref.WeakKeyDictionary()
_RUNS_KEPT = 512


def use_prices(db: Database, table: Mapping[str, Price], models: Mapping[str, str]) -> None:
    """The owner's price table for runs stored in `db`; an empty table estimates nothing."""
    _PRICES[db] = _Prices(dict(table), dict(models))


async def run_price(db: Database, run_id: str) -> Price | None:
    """The price of one run's model (None: not priced, or no table)."""
    prices = _PRICES.get(db)
    if prices is None or not prices.table:
        return None
    if run_id in prices.runs:
        return prices.runs[run_id]
    row = await db.fetchone(
        "SELECT t.provider, t.model FROM runs r JOIN threads t ON t.id = r.thread_id WHERE r.id = ?",
        (run_id,),
    )
    found = None
    if row is not None:
        model = row["model"] or prices.models.get(row["provider"])
        found = price_for(prices.table, model, row["provider"])
    if len(prices.runs) >= _RUNS_KEPT:
        prices.runs.clear()
    prices.runs[run_id] = found
    return found


def usage_of(column: str | None) -> c.Usage | None:
    """A stored `usage` column as the contract's model (None: unknown)."""
    if not column:
        return None
    return wire_usage(Usage.from_json(json.loads(column)))


def wire_usage(usage: Usage | None) -> c.Usage | None:
    return None if usage is None else c.Usage.model_validate(usage.to_json())


async def set_run_usage(db: Database, run_id: str, usage: Usage) -> None:
    """The run's usage so far (a snapshot: it replaces the last one), its cost estimated from the
    price table when the CLI gave none."""
    usage = estimate(usage, await run_price(db, run_id))
    async with db.write() as tx:
        await tx.execute("UPDATE runs SET usage = ? WHERE id = ?", (json.dumps(usage.to_json()), run_id))


async def set_run_budget(db: Database, run_id: str, budget: Budget | None) -> None:
    stored = None if budget is None or budget.empty else json.dumps(budget.to_json())
    async with db.write() as tx:
        await tx.execute("UPDATE runs SET budget = ? WHERE id = ?", (stored, run_id))


async def run_budget(db: Database, run_id: str) -> Budget | None:
    """The run's budget, with the run's price (a `usd` limit counts an estimated cost)."""
    row = await db.lookup("SELECT budget FROM runs WHERE id = ?", (run_id,))
    column = None if row is None else row[0]
    if not isinstance(column, str) or not column:
        return None
    budget = Budget.from_json(json.loads(column))
    return replace(budget, price=await run_price(db, run_id)) if budget.usd is not None else budget


# A run's budget scope is read from at most this many of its thread's runs before it (a scope is
# a launch and the wakes and continuations after it: a handful).
SCOPE_RUNS_MAX = 200
_SCOPE_SQL = (
    "SELECT id, number, origin, continues, budget, usage FROM runs"
    " WHERE thread_id = (SELECT thread_id FROM runs WHERE id = ?)"
    " AND number <= (SELECT number FROM runs WHERE id = ?) ORDER BY number DESC LIMIT ?"
)


def _metered(row: Any) -> MeteredRun:
    return MeteredRun(
        id=row["id"],
        number=int(row["number"]),
        origin=row["origin"] or "user",
        continues=row["continues"],
        budget=Budget.from_json(json.loads(row["budget"])) if row["budget"] else None,
        usage=Usage.from_json(json.loads(row["usage"])) if row["usage"] else None,
    )


async def scope_in(tx: Tx, run_id: str) -> list[MeteredRun]:
    """`run_id`'s budget scope (`core.usage.budget_scope`), read inside a write transaction."""
    rows = await tx.execute_fetchall(_SCOPE_SQL, (run_id, run_id, SCOPE_RUNS_MAX))
    return budget_scope(run_id, [_metered(r) for r in rows])


async def scope_of(db: Database, run_id: str) -> list[MeteredRun]:
    rows = await db.lookup_all(_SCOPE_SQL, (run_id, run_id, SCOPE_RUNS_MAX))
    return budget_scope(run_id, [_metered(r) for r in rows])


async def priced(db: Database, run_id: str, budget: Budget | None) -> Budget | None:
    """`budget` with the run's price (a `usd` limit counts an estimated cost)."""
    if budget is None or budget.usd is None:
        return budget
    return replace(budget, price=await run_price(db, run_id))


async def run_budget_scope(db: Database, run_id: str) -> tuple[Budget | None, Usage | None]:
    """The budget a run counts against (its own, or the one of the work it carries on) and what
    the earlier runs of that work spent: the live meter's stop rule."""
    scope = await scope_of(db, run_id)
    return await priced(db, run_id, scope_budget(scope)), spent_before(scope)


async def thread_usage(db: Database, thread_id: str) -> Usage | None:
    """The sum of the thread's runs' usage; None when no run reported any."""
    rows = await db.lookup_all(
        "SELECT usage FROM runs WHERE thread_id = ? AND usage IS NOT NULL", (thread_id,)
    )
    return total(Usage.from_json(json.loads(row["usage"])) for row in rows)


async def run_usages(db: Database, thread_id: str) -> list[c.RunUsage]:
    """Each of the thread's newest runs with its usage, oldest first (`c.RUN_USAGE_SHOWN` of them)."""
    rows = await db.fetchall(
        "SELECT id, number, status, reason, usage FROM runs WHERE thread_id = ? ORDER BY number DESC LIMIT ?",
        (thread_id, c.RUN_USAGE_SHOWN),
    )
    return [
        c.RunUsage(
            id=r["id"], number=r["number"], status=r["status"], usage=usage_of(r["usage"]), reason=r["reason"]
        )
        for r in reversed(rows)
    ]


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
        # Reads by key through indexes (runs by thread, tasks by parent): inline (`lookup_all`),
        # since a wake's answer on the box waits for them (issue 33: no thread hop on the wake path).
        rows = await db.lookup_all(
            f"SELECT usage FROM runs WHERE thread_id IN ({marks}) AND usage IS NOT NULL",  # noqa: S608
            tuple(level),
        )
        found += [Usage.from_json(json.loads(row["usage"])) for row in rows]
        children = await db.lookup_all(
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
    """Runs of threads a link started here since `since`, and what they cost as the ceiling counts
    it (`core.usage.ceiling_spend`: a claimed cost counts $0)."""
    return _spend(await db.fetchall(LINK_SPEND_SQL, (client_id, since)))


async def link_spend_in(tx: Tx, client_id: str, since: float) -> tuple[int, float]:
    """`link_spend` inside a write transaction: checked and spent in one step."""
    async with tx.execute(LINK_SPEND_SQL, (client_id, since)) as cur:
        return _spend(list(await cur.fetchall()))


def _spend(rows: list[Any]) -> tuple[int, float]:
    usd = ceiling_spend(Usage.from_json(json.loads(row["usage"])) for row in rows if row["usage"])
    return len(rows), usd
