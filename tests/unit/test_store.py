"""The SQLite store on real files: migrations, pragmas, permissions, transactions, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
import pytest

from peerd.core.runs import RECOVERY_REASON, RunStatus
from peerd.store import projects, receipts, threads
from peerd.store.db import Database, migrate, user_version
from peerd.store.schema import MIGRATIONS
from tests.support.eventually import eventually

TABLES = {"projects", "threads", "runs", "items", "events", "receipts"}


class Boom(Exception):
    pass


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def raw_conn(tmp_path: Path) -> AsyncIterator[aiosqlite.Connection]:
    conn = await aiosqlite.connect(str(tmp_path / "raw.db"), isolation_level=None)
    try:
        yield conn
    finally:
        await conn.close()


def sqlite_file(path: Path, sql: str) -> list[tuple[object, ...]]:
    """Read the file with a separate, plain sqlite3 connection: what is really on disk."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def table_names(conn: aiosqlite.Connection) -> set[str]:
    async with conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'") as cur:
        return {r[0] for r in await cur.fetchall()} - {"sqlite_sequence"}


# --- opening and migrating -------------------------------------------------------------------------


async def test_open_migrates_an_empty_file_to_the_latest_schema(db: Database) -> None:
    assert await db.scalar("PRAGMA user_version") == len(MIGRATIONS)
    rows = await db.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
    assert {r["name"] for r in rows} >= TABLES
    on_disk = sqlite_file(db.path, "PRAGMA user_version")
    assert on_disk == [(len(MIGRATIONS),)]


async def test_reopen_is_a_no_op_and_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "peerd.db"
    first = await Database.open(path)
    added = await projects.add(first, name="demo", path="/srv/demo", repository_key=None, now=1.0)
    await first.close()

    second = await Database.open(path)
    try:
        assert await second.scalar("PRAGMA user_version") == len(MIGRATIONS)
        kept = await projects.get(second, added.id)
        assert kept == added
        assert await projects.count(second) == 1
    finally:
        await second.close()


async def test_journal_mode_is_wal(db: Database) -> None:
    assert await db.scalar("PRAGMA journal_mode") == "wal"
    assert sqlite_file(db.path, "PRAGMA journal_mode") == [("wal",)]


async def test_foreign_keys_are_enforced(db: Database) -> None:
    assert await db.scalar("PRAGMA foreign_keys") == 1
    with pytest.raises(sqlite3.IntegrityError):
        async with db.write() as tx:
            await tx.execute(
                "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
                " in_place, worktree_path, created_at, updated_at)"
                " VALUES ('thr_x', 'prj_missing', 't', 'script', 'auto', 'default', 0, '/w', 1, 1)"
            )
    assert await db.scalar("SELECT count(*) FROM threads") == 0


async def test_the_database_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "peerd.db"
    database = await Database.open(path)
    await database.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_an_existing_world_readable_file_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "peerd.db"
    path.touch(mode=0o644)
    path.chmod(0o644)
    database = await Database.open(path)
    await database.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_a_database_from_a_newer_peerd_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "peerd.db"
    database = await Database.open(path)
    await database.close()
    newer = len(MIGRATIONS) + 3
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.close()

    with pytest.raises(RuntimeError) as err:
        await Database.open(path)
    message = str(err.value)
    assert f"schema version {newer}" in message
    assert "upgrade peerd" in message
    assert sqlite_file(path, "PRAGMA user_version") == [(newer,)], "the file is left as it was"


async def test_migrate_applies_each_step_and_reports_the_version(raw_conn: aiosqlite.Connection) -> None:
    steps = [["CREATE TABLE a (x INTEGER)"], ["CREATE TABLE b (y INTEGER)", "INSERT INTO b VALUES (7)"]]
    assert await migrate(raw_conn, steps) == 2
    assert await user_version(raw_conn) == 2
    assert await table_names(raw_conn) == {"a", "b"}
    # Running again applies nothing (a re-run CREATE TABLE would fail).
    assert await migrate(raw_conn, steps) == 2
    async with raw_conn.execute("SELECT count(*) FROM b") as cur:
        assert [tuple(r) for r in await cur.fetchall()] == [(1,)]


async def test_a_failing_migration_rolls_back_and_keeps_the_version(raw_conn: aiosqlite.Connection) -> None:
    good = ["CREATE TABLE good (x INTEGER)"]
    bad = ["CREATE TABLE half (y INTEGER)", "INSERT INTO half VALUES (1)", "THIS IS NOT SQL"]
    with pytest.raises(sqlite3.OperationalError):
        await migrate(raw_conn, [good, bad])
    assert await user_version(raw_conn) == 1, "the good step stays, the bad one is undone"
    assert await table_names(raw_conn) == {"good"}
    assert not raw_conn.in_transaction


async def test_a_failing_first_migration_leaves_an_empty_database(raw_conn: aiosqlite.Connection) -> None:
    with pytest.raises(sqlite3.OperationalError):
        await migrate(raw_conn, [["CREATE TABLE t (x INTEGER)", "CREATE TABLE t (x INTEGER)"]])
    assert await user_version(raw_conn) == 0
    assert await table_names(raw_conn) == set()


# --- transactions ----------------------------------------------------------------------------------


async def test_a_failing_write_rolls_back_entirely(db: Database) -> None:
    with pytest.raises(Boom):
        async with db.write() as tx:
            await tx.execute(
                "INSERT INTO projects (id, name, path, repository_key, created_at)"
                " VALUES ('prj_1', 'one', '/one', NULL, 1)"
            )
            await tx.execute(
                "INSERT INTO projects (id, name, path, repository_key, created_at)"
                " VALUES ('prj_2', 'two', '/two', NULL, 1)"
            )
            raise Boom
    assert await projects.count(db) == 0
    assert sqlite_file(db.path, "SELECT count(*) FROM projects") == [(0,)]
    # The writer is usable again: the lock and the transaction were released.
    await projects.add(db, name="three", path="/three", repository_key=None, now=1.0)
    assert await projects.count(db) == 1


async def test_a_committed_write_is_visible_to_other_connections(db: Database) -> None:
    await projects.add(db, name="one", path="/one", repository_key=None, now=1.0)
    assert sqlite_file(db.path, "SELECT name FROM projects") == [("one",)]


# --- receipts --------------------------------------------------------------------------------------


async def test_prune_removes_only_old_receipts(db: Database) -> None:
    async with db.write() as tx:
        for command_id, created in (("old-1", 100.0), ("old-2", 199.0), ("edge", 200.0), ("new", 300.0)):
            await receipts.record(
                tx,
                namespace="local",
                op="thread_launch",
                command_id=command_id,
                request_hash="h",
                result={"id": command_id},
                now=created,
            )
    removed = await receipts.prune(db, older_than=200.0, batch=1)  # one receipt per transaction
    assert removed == 2
    rows = await db.fetchall("SELECT command_id FROM receipts ORDER BY command_id")
    assert [r["command_id"] for r in rows] == ["edge", "new"]
    async with db.write() as tx:
        kept = await receipts.find(tx, "local", "thread_launch", "new")
        gone = await receipts.find(tx, "local", "thread_launch", "old-1")
    assert kept is not None and kept.result == {"id": "new"}
    assert gone is None


# --- startup recovery ------------------------------------------------------------------------------


async def _thread_with_run(db: Database, project_id: str, title: str) -> tuple[str, str]:
    spec = threads.NewThread(
        project_id=project_id,
        title=title,
        provider="script",
        model=None,
        runtime_mode="full-access",
        interaction_mode="default",
        in_place=False,
        worktree_path="/w/{thread}",
        branch="peerd/{thread}",
    )
    key = threads.Idempotency("local", None, "h")
    result, _ = await threads.launch(db, key=key, spec=spec, prompt=f"prompt {title}", now=10.0)
    return result["threadId"], result["runId"]


async def test_recover_interrupts_live_runs_and_leaves_the_rest(db: Database) -> None:
    project = await projects.add(db, name="p", path="/p", repository_key=None, now=1.0)
    paths: dict[str, list[RunStatus]] = {
        "queued": [],
        "starting": ["starting"],
        "running": ["starting", "running"],
        "completed": ["starting", "running", "completed"],
        "failed": ["starting", "failed"],
        "cancelled": ["cancelled"],
    }
    runs: dict[str, tuple[str, str]] = {}
    for name, steps in paths.items():
        thread_id, run_id = await _thread_with_run(db, project.id, name)
        for step in steps:
            await threads.transition_run(
                db, run_id, step, now=20.0, token_hash="tok" if step == "starting" else None
            )
        runs[name] = (thread_id, run_id)
    before = {
        name: await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        for name, (_, run_id) in runs.items()
    }
    items_before = {
        name: await db.scalar("SELECT count(*) FROM items WHERE thread_id = ?", (thread_id,))
        for name, (thread_id, _) in runs.items()
    }

    recovered = await threads.recover(db, now=99.0)

    assert sorted(recovered) == sorted([runs["starting"][1], runs["running"][1]])
    for name in ("starting", "running"):
        thread_id, run_id = runs[name]
        run = await threads.get_run(db, run_id)
        assert run.status == "interrupted"
        assert run.reason == RECOVERY_REASON
        assert run.ended_at == 99.0
        assert await db.scalar("SELECT token_hash FROM runs WHERE id = ?", (run_id,)) is None
        last = await db.fetchone(
            "SELECT kind, text, run_id FROM items WHERE thread_id = ? ORDER BY position DESC LIMIT 1",
            (thread_id,),
        )
        assert last is not None
        assert (last["kind"], last["text"], last["run_id"]) == ("error", RECOVERY_REASON, run_id)
        event = await db.fetchone(
            "SELECT type, data FROM events WHERE thread_id = ? ORDER BY seq DESC LIMIT 1", (thread_id,)
        )
        assert event is not None and event["type"] == "run.updated" and "interrupted" in event["data"]
    for name in ("queued", "completed", "failed", "cancelled"):
        thread_id, run_id = runs[name]
        after = await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
        earlier = before[name]
        assert after is not None and earlier is not None
        assert dict(after) == dict(earlier), f"the {name} run must not change"
        items = await db.scalar("SELECT count(*) FROM items WHERE thread_id = ?", (thread_id,))
        assert items == items_before[name], f"the {name} run gets no error item"

    assert await threads.recover(db, now=100.0) == [], "a second recovery finds nothing"


async def test_recover_records_a_given_reason(db: Database) -> None:
    project = await projects.add(db, name="p", path="/p", repository_key=None, now=1.0)
    thread_id, run_id = await _thread_with_run(db, project.id, "t")
    await threads.transition_run(db, run_id, "starting", now=2.0)
    await threads.transition_run(db, run_id, "running", now=3.0)
    assert await threads.recover(db, now=4.0, reason="shut down") == [run_id]
    run = await threads.get_run(db, run_id)
    assert (run.status, run.reason) == ("interrupted", "shut down")
    texts = await db.fetchall("SELECT text FROM items WHERE thread_id = ? AND kind = 'error'", (thread_id,))
    assert [r["text"] for r in texts] == ["shut down"]


async def test_a_writer_cancelled_at_any_point_never_breaks_later_writes(tmp_path: Path) -> None:
    """Cancelling a writer while aiosqlite still runs its BEGIN left the connection inside a
    transaction nobody owned, and every later write failed until restart."""
    database = await Database.open(tmp_path / "cancel.db")
    try:
        async with database.write() as tx:
            await tx.execute("CREATE TABLE t (v INTEGER)")

        async def writer(value: int) -> None:
            async with database.write() as tx:
                await tx.execute("INSERT INTO t (v) VALUES (?)", (value,))

        for i in range(120):
            task = asyncio.create_task(writer(-1))
            for _ in range(i % 6):
                await asyncio.sleep(0)  # cancel at every stage: before, during and after BEGIN
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await writer(i)  # must always work
        values = [row[0] for row in await database.fetchall("SELECT v FROM t ORDER BY rowid")]
        assert [v for v in values if v >= 0] == list(range(120))
    finally:
        await database.close()


# --- the writer runs on the loop, and never makes it wait ------------------------------------------


class Ticker:
    """A task that counts its turns of the loop, every `pause` seconds: how much the loop got in."""

    def __init__(self, pause: float) -> None:
        self.ticks = 0
        self._task = asyncio.create_task(self._tick(pause))

    async def _tick(self, pause: float) -> None:
        while True:
            await asyncio.sleep(pause)
            self.ticks += 1

    def stop(self) -> None:
        self._task.cancel()


@pytest.mark.slow
async def test_a_store_busy_in_another_process_is_waited_for_without_blocking_the_loop(
    db: Database, tmp_path: Path
) -> None:
    """The writer is inline on the event loop (store/db.py:Tx): a `BEGIN IMMEDIATE` that finds
    another process's write lock is retried with asyncio sleeps, so the loop keeps serving, and the
    write lands once the lock is gone."""
    async with db.write() as tx:
        await tx.execute("CREATE TABLE t (v INTEGER)")
    other = sqlite3.connect(tmp_path / "peerd.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")

    async def write() -> None:
        async with db.write() as tx:
            await tx.execute("INSERT INTO t (v) VALUES (1)")

    ticker = Ticker(0.005)
    writing = asyncio.create_task(write())
    try:
        await asyncio.sleep(0.4)  # a window for the write to go wrongly ahead, and for the ticks
        assert not writing.done(), "the write went ahead while another process held the lock"
        assert ticker.ticks >= 20, (
            f"the loop was blocked while the write waited ({ticker.ticks} ticks in 0.4 s)"
        )
        other.execute("COMMIT")
        await asyncio.wait_for(writing, 5)
    finally:
        ticker.stop()
        other.close()
    assert sqlite_file(tmp_path / "peerd.db", "SELECT v FROM t") == [(1,)]


async def test_a_store_busy_past_the_timeout_is_a_typed_fault_and_writes_work_after(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peerd.errors import StorageUnavailable  # noqa: PLC0415
    from peerd.store import db as db_module  # noqa: PLC0415

    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_MS", 200)
    other = sqlite3.connect(tmp_path / "peerd.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageUnavailable, match="stayed locked by another process"):
            async with db.write() as tx:
                await tx.execute("CREATE TABLE t (v INTEGER)")
    finally:
        other.execute("ROLLBACK")
        other.close()
    async with db.write() as tx:
        await tx.execute("CREATE TABLE t (v INTEGER)")
    assert not db._w.in_transaction


@pytest.mark.slow
async def test_the_wal_is_checkpointed_off_the_loop_and_stays_bounded(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer never checkpoints (`wal_autocheckpoint = 0`: a checkpoint syncs, and the writer is
    on the loop); the keeper does, after writes, so the WAL is reused instead of growing with every
    write. Without those checkpoints this WAL would hold all 4 MB written."""
    from peerd.store import db as db_module  # noqa: PLC0415

    monkeypatch.setattr(db_module, "CHECKPOINT_EVERY_S", 0.01)
    async with db.write() as tx:
        await tx.execute("CREATE TABLE t (v BLOB)")
    wal = tmp_path / "peerd.db-wal"
    sizes = []
    for _ in range(20):
        async with db.write() as tx:
            await tx.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 200_000,))
        await eventually(
            lambda: db._checkpoint_due is None and db._checkpointing is None,
            what="the checkpoint this write asked for, run and ended",
            within=2,
            every=0.01,
        )
        sizes.append(wal.stat().st_size)
    assert max(sizes) < 1_500_000, f"the WAL grew with every write: {sizes}"
    assert sqlite_file(tmp_path / "peerd.db", "SELECT count(*) FROM t") == [(20,)]


async def test_lookups_see_each_committed_write_and_never_a_pending_one(db: Database) -> None:
    """The point reader (inline, like the writer) reads the last committed state: never what a
    write still open has done."""
    async with db.write() as tx:
        await tx.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        await tx.execute("INSERT INTO t (id, v) VALUES (1, 'first')")
    assert (await db.lookup("SELECT v FROM t WHERE id = 1"))["v"] == "first"  # type: ignore[index]
    async with db.write() as tx:
        await tx.execute("UPDATE t SET v = 'second' WHERE id = 1")
        seen_inside = await db.lookup("SELECT v FROM t WHERE id = 1")
        assert seen_inside is not None and seen_inside["v"] == "first"
    assert [r["v"] for r in await db.lookup_all("SELECT v FROM t")] == ["second"]
    with pytest.raises(sqlite3.OperationalError):  # query_only: it writes nothing
        await db.lookup("DELETE FROM t")


async def test_every_store_call_lets_the_loop_in(db: Database) -> None:
    """The writer and the point reader run inline, yet each call suspends once, as a hop to a
    thread did: a loop of store calls can be cancelled, and other tasks run beside it."""
    async with db.write() as tx:
        await tx.execute("CREATE TABLE t (v INTEGER)")
    ticker = Ticker(0)
    await asyncio.sleep(0)  # one turn: the ticker runs
    try:
        for i in range(50):
            await db.lookup("SELECT 1")
            async with db.write() as tx:
                await tx.execute("INSERT INTO t (v) VALUES (?)", (i,))
        assert ticker.ticks >= 90, f"other tasks ran {ticker.ticks} times beside 100 store calls"
        looping = asyncio.create_task(_lookups_forever(db))
        await asyncio.sleep(0.01)  # the loop of lookups runs a while before it is cancelled
        looping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(looping, 2)
    finally:
        ticker.stop()


async def _lookups_forever(db: Database) -> None:
    while True:
        await db.lookup("SELECT 1")
