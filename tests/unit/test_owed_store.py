"""Start-up recovery judges a cut run's budget from its recorded usage (issue 26, case 6), the
store side: a run cut past its `usd` budget on an estimated cost (the price table) fails and is
not continued; one within it is continued; the sweep's start-up withdrawal takes only questions
whose run is not live. A real SQLite file."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.core.runs import BUDGET_EXCEEDED
from peerd.core.usage import Price
from peerd.store import sweep as sweep_store
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store
from peerd.store.threads.recovery import recover


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


async def child_with_live_run(db: Database, thread_id: str, *, tokens: int, budget: dict[str, float]) -> str:
    run_id = f"run_{thread_id}"
    usage = {"inputTokens": tokens, "outputTokens": 0, "wallMs": 1000}
    async with db.write() as tx:
        await tx.execute(
            "INSERT OR IGNORE INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', 0)"
        )
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode, in_place,"
            " worktree_path, provider_session, delegated_from, created_at, updated_at)"
            " VALUES (?, 'prj_1', 't', 'codex', 'auto', 'default', 0, '/w', 's1', '{}', 0, 0)",
            (thread_id,),
        )
        await tx.execute(
            "INSERT INTO runs (id, thread_id, number, status, prompt, created_at, started_at, usage, budget)"
            " VALUES (?, ?, 1, 'running', 'go', 0, 0, ?, ?)",
            (run_id, thread_id, json.dumps(usage), json.dumps(budget)),
        )
    return run_id


async def test_a_cut_run_past_its_usd_budget_on_an_estimate_fails_and_one_within_goes_on(
    db: Database,
) -> None:
    usage_store.use_prices(db, {"codex": Price(input_per_mtok=10.0, output_per_mtok=10.0)}, {})
    over = await child_with_live_run(db, "thr_over", tokens=200_000, budget={"usd": 1.0})  # ~$2
    within = await child_with_live_run(db, "thr_within", tokens=50_000, budget={"usd": 1.0})  # ~$0.50
    await recover(db, now=10.0, label="box", continue_children=True)
    rows = {
        r["id"]: r
        for r in await db.fetchall(
            "SELECT id, thread_id, status, reason, origin, continues FROM runs ORDER BY id"
        )
    }
    assert rows[over]["status"] == "failed" and rows[over]["reason"] == "budget exceeded: ~$2.0000 of $1.0000"
    assert not any(r["continues"] == over for r in rows.values())
    assert rows[within]["status"] == "interrupted"
    assert any(r["continues"] == within and r["status"] == "queued" for r in rows.values())
    codes = await db.fetchall("SELECT run_id, data FROM items WHERE kind = 'error'")
    assert {r["run_id"]: json.loads(r["data"])["code"] for r in codes}[over] == BUDGET_EXCEEDED


async def test_the_start_up_withdrawal_takes_only_questions_of_runs_not_live(db: Database) -> None:
    live = await child_with_live_run(db, "thr_a", tokens=1, budget={"tokens": 10})
    async with db.write() as tx:
        for approval_id, run_id in (("ap_live", live), ("ap_gone", "run_gone")):
            await tx.execute(
                "INSERT INTO approvals (id, run_id, thread_id, ask_key, kind, tool, summary, detail, digest,"
                " status, created_at, deadline_at) VALUES (?, ?, 'thr_a', 'k', 'command', 'run', 's', '{}',"
                " 'd', 'pending', 0, 100)",
                (approval_id, run_id),
            )
    assert await sweep_store.withdraw_orphaned_questions(db, now=5.0) == ["ap_gone"]
    statuses = {r["id"]: r["status"] for r in await db.fetchall("SELECT id, status FROM approvals")}
    assert statuses == {"ap_live": "pending", "ap_gone": "cancelled"}
