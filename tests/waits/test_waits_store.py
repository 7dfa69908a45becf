"""The `waits` table's reads reach their rows by an index, however many waits ended: the open
ones (start-up, the sweep: the partial index `waits_open`), a thread's (its Stop, settlement,
`list_waits`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.store import sweep as sweep_store
from peerd.store.db import Database
from peerd.tasks import feedstore
from peerd.tasks import store as tasks
from peerd.waits import store
from tests.queryplans import scans, statements


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


async def test_the_waits_reads_use_their_indexes(db: Database) -> None:
    async def reads() -> None:
        await store.open_ids(db)
        await store.open_for_thread(db, "thr_1")
        await store.listing(db, thread_id="thr_1", statuses=["watching"], limit=10)
        await tasks.has_open_children(db, "thr_1")
        await feedstore.thread_facts(db, "cli_1", ["thr_1"])
        for sql in sweep_store.QUERIES:
            await db.fetchall(sql)

    ran = [sql for sql in await statements(db, reads) if "waits" in sql]
    assert len(ran) >= 5
    for sql in ran:
        # a scan of the partial index `waits_open` reads only open waits; the table itself never
        assert not [s for s in await scans(db, sql) if "waits" in s and "INDEX" not in s], sql
