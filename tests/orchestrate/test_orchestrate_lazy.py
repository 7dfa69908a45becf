"""Orchestration loads on first need (issue 33): what the store owes decides whether the engine
loads at start (`orchestrate/lazy.py:owes_work`), a superset of what `Engine.recover` resumes.
The daemon-level half (idle, first use, a restart that resumes) is tests/integration/test_lazy_parts.py."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import get_args

import pytest

from peerd.orchestrate import store as ostore
from peerd.orchestrate.lazy import owes_work
from peerd.orchestrate.states import TERMINAL_RUN, RunState
from peerd.store.db import Database
from tests.support.orchestrate import packet


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    async with database.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/nonexistent', ?)",
            (time.time(),),
        )
    yield database
    await database.close()


async def orchestration(db: Database, status: str) -> str:
    run = await ostore.create(db, project_id="prj_1", task="t", request={}, base_commit="0" * 40, now=1.0)
    await ostore.add_packets(db, run.id, [packet("p", "goal", ["a.py"], "true")], now=1.0)
    async with db.write() as tx:
        await tx.execute("UPDATE orchestrations SET status = ? WHERE id = ?", (status, run.id))
    return run.id


async def test_nothing_owed_in_an_empty_store_nor_for_ended_orchestrations(db: Database) -> None:
    assert not await owes_work(db)
    for status in sorted(TERMINAL_RUN):
        await orchestration(db, status)
    assert not await owes_work(db)


@pytest.mark.parametrize("status", sorted(set(get_args(RunState)) - TERMINAL_RUN))
async def test_an_orchestration_not_ended_is_owed(db: Database, status: str) -> None:
    await orchestration(db, status)
    assert await owes_work(db)


async def test_a_cancelled_orchestration_owing_a_stop_is_owed_until_it_is_delivered(db: Database) -> None:
    run_id = await orchestration(db, "cancelled")
    assert not await owes_work(db)
    memo = {"content": 1, "stop_owed": [["thr_coder", "env_box"]]}
    async with db.write() as tx:
        await tx.execute(
            "UPDATE orchestration_packets SET retries = ? WHERE orchestration_id = ?",
            (json.dumps(memo), run_id),
        )
    assert any(p.memo.stop_owed for p in (await ostore.get(db, run_id)).packets)  # what Engine.recover reads
    assert await owes_work(db)
    async with db.write() as tx:  # delivered: the memo drops the key (written without its default)
        await tx.execute("UPDATE orchestration_packets SET retries = '{\"content\": 1}'")
    assert not await owes_work(db)
