"""Rules: a page of threads is one statement (each thread's latest run joined in), whatever its
size; a thread with its latest run is one; the statements thread lists, thread reads and start-up
run are planned without a table scan; a launch's branch check never runs inside the store's write
transaction, and a branch named after the new thread is not looked up at all."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.errors import BranchTaken
from peerd.store import threads
from peerd.store.db import Database
from tests.queryplans import scans, statements


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


async def seed(db: Database, n: int, runs_each: int = 3) -> list[str]:
    """`n` threads in two projects, each with `runs_each` runs (the last one queued); the
    threads with an odd index are archived."""
    now = time.time()
    ids = []
    async with db.write() as tx:
        for project in ("prj_a", "prj_b"):
            await tx.execute(
                "INSERT INTO projects (id, name, path, created_at) VALUES (?, ?, ?, ?)",
                (project, project, f"/{project}", now),
            )
        for i in range(n):
            thread_id = f"thr_{i:04d}"
            await tx.execute(
                "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode, in_place,"
                " worktree_path, status, created_at, updated_at) VALUES (?, ?, ?, 'script', 'auto', 'default', 0,"
                " '/w', ?, ?, ?)",
                (
                    thread_id,
                    "prj_a" if i % 3 else "prj_b",
                    f"t{i}",
                    "archived" if i % 2 else "active",
                    now,
                    now,
                ),
            )
            for number in range(1, runs_each + 1):
                status = "queued" if number == runs_each else "completed"
                await tx.execute(
                    "INSERT INTO runs (id, thread_id, number, status, prompt, created_at) VALUES (?, ?, ?, ?, 'p', ?)",
                    (f"run_{i:04d}_{number}", thread_id, number, status, now + number),
                )
            ids.append(thread_id)
    return ids


async def test_a_page_of_threads_is_one_statement_with_each_latest_run(db: Database) -> None:
    ids = await seed(db, 250)
    pages: list[object] = []

    async def list_all() -> None:
        cursor = None
        while True:
            found = await threads.page(db, project_id=None, include_archived=True, cursor=cursor, limit=100)
            pages.append(found)
            if (cursor := found.next_cursor) is None:
                return

    ran = await statements(db, list_all)
    assert len(pages) == 3 and len(ran) == 3, ran  # one statement per page of 100
    listed = [t for p in pages for t in p.items]  # type: ignore[attr-defined]
    assert [t.id for t in listed] == ids
    for thread in listed:
        assert thread.latest_run is not None
        assert (thread.latest_run.id, thread.latest_run.number) == (f"run_{thread.id[4:]}_3", 3)
        assert thread.latest_run.status == "queued" and thread.latest_run.thread_id == thread.id

    active_b = await threads.page(db, project_id="prj_b", include_archived=False, cursor=None, limit=100)
    assert [t.id for t in active_b.items] == [i for n, i in enumerate(ids) if n % 3 == 0 and n % 2 == 0]

    one = await statements(db, lambda: threads.get_thread(db, ids[7]))
    assert len(one) == 1
    assert (await threads.get_thread(db, ids[7])) == listed[7]


async def test_a_thread_without_runs_has_no_latest_run(db: Database) -> None:
    await seed(db, 1, runs_each=0)
    assert (await threads.get_thread(db, "thr_0000")).latest_run is None
    page = await threads.page(db, project_id=None, include_archived=True, cursor=None, limit=10)
    assert [t.latest_run for t in page.items] == [None]


async def test_thread_reads_and_start_up_statements_scan_no_table(db: Database) -> None:
    ids = await seed(db, 300)

    async def work() -> None:
        await threads.page(db, project_id=None, include_archived=False, cursor=None, limit=100)
        await threads.page(db, project_id="prj_a", include_archived=True, cursor="5", limit=100)
        await threads.get_thread(db, ids[3])
        await threads.latest_run(db, ids[3])
        await threads.run_views(db, ids[3])
        await threads.read_items(db, ids[3], after_position=None, limit=100, run_id=None)
        await threads.events_after(db, ids[3], after=0, limit=100)
        # what start-up runs, whatever the history holds
        await threads.live_run_groups(db)
        await threads.queued_threads(db)
        await threads.recover(db, now=time.time())

    ran = await statements(db, work)
    assert len(ran) >= 10, ran
    found = {sql: await scans(db, sql) for sql in ran}
    assert {sql: plan for sql, plan in found.items() if plan} == {}


async def test_a_launch_checks_a_named_branch_outside_the_transaction_and_a_generated_one_not_at_all(
    db: Database,
) -> None:
    await seed(db, 0)
    asked: list[tuple[str, bool]] = []

    async def branch_exists(branch: str) -> bool:
        asked.append((branch, db._w.in_transaction))
        return branch == "orchestrate/taken"

    def spec(branch: str | None) -> threads.NewThread:
        return threads.NewThread(
            project_id="prj_a",
            title="t",
            provider="script",
            model=None,
            runtime_mode="auto",
            interaction_mode="default",
            in_place=False,
            worktree_path="/w/{thread}",
            branch=branch,
        )

    def key(command_id: str | None) -> threads.Idempotency:
        return threads.Idempotency("owner", command_id, "h")

    first, _ = await threads.launch(
        db, key=key(None), spec=spec("peerd/{thread}"), prompt="p", now=1.0, branch_exists=branch_exists
    )
    assert asked == []  # peerd/<new thread id>: new by construction
    assert (await threads.get_thread(db, first["threadId"])).branch == f"peerd/{first['threadId']}"

    await threads.launch(
        db, key=key("k1"), spec=spec("orchestrate/free"), prompt="p", now=1.0, branch_exists=branch_exists
    )
    assert asked == [("orchestrate/free", False)]  # asked, and not while the writer was held
    with pytest.raises(BranchTaken):
        await threads.launch(
            db,
            key=key(None),
            spec=spec("orchestrate/taken"),
            prompt="p",
            now=1.0,
            branch_exists=branch_exists,
        )
    with pytest.raises(BranchTaken):  # another thread's branch: refused in the transaction
        await threads.launch(db, key=key(None), spec=spec("orchestrate/free"), prompt="p", now=1.0)
    # A retried key replays its thread although its branch now exists.
    again, replayed = await threads.launch(
        db,
        key=key("k1"),
        spec=spec("orchestrate/free"),
        prompt="p",
        now=2.0,
        branch_exists=lambda _b: _true(),
    )
    assert replayed and again["threadId"]


async def _true() -> bool:
    return True


async def test_newest_first_pages_back_through_every_thread_once(db: Database) -> None:
    """`order=newest` (what `thread list` asks): latest first, and its cursor pages backwards
    through all of them with none twice; the default stays creation order."""
    made = [t for i, t in enumerate(await seed(db, 9)) if i % 2 == 0]  # the active ones
    seen: list[str] = []
    cursor = None
    while True:
        page = await threads.page(
            db, project_id=None, include_archived=False, cursor=cursor, limit=2, newest_first=True
        )
        seen += [t.id for t in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    oldest = await threads.page(db, project_id=None, include_archived=False, cursor=None, limit=10)
    assert seen == made[::-1]
    assert [t.id for t in oldest.items] == made
