"""The store file is the store (issue 26 case 5, design invariant 11): a `peerd.db` replaced,
removed or truncated under an open `Database` stops its writes with `storage_unavailable`, on real
SQLite files. Nothing is written into the file now at the path, and the store the daemon had open
(every write it acknowledged) is saved beside it."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.errors import StorageUnavailable
from peerd.store import health
from peerd.store.db import Database
from peerd.store.fileguard import StoreFile


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


async def put(db: Database, name: str) -> None:
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES (?, ?, ?, 0)", (name, name, f"/{name}")
        )


def names_in(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM projects")}


def displaced(home: Path) -> list[Path]:
    return sorted(p for p in home.iterdir() if ".displaced-" in p.name and not p.name.endswith(".partial"))


async def test_a_store_renamed_over_refuses_the_next_write_and_keeps_what_it_acknowledged(
    db: Database, tmp_path: Path
) -> None:
    await put(db, "before")
    backup = tmp_path / "backup.db"
    health.backup(db.path, backup)
    await put(db, "acknowledged")  # answered after the backup was made: only the daemon's store has it
    backup.rename(db.path)  # the backup put back under the running daemon
    replaced = db.path.read_bytes()

    with pytest.raises(StorageUnavailable) as refused:
        await put(db, "after")
    assert refused.value.code == "storage_unavailable"
    message = refused.value.message
    assert f"{db.path} was replaced by another file" in message and "stopped writing" in message
    [saved] = displaced(tmp_path)
    assert f"peerd restore {saved}" in message and "peerd serve" in message

    assert db.path.read_bytes() == replaced, "nothing was written into the file now at the path"
    assert names_in(db.path) == {"before"}
    assert names_in(saved) == {"before", "acknowledged"}, "no acknowledged write is lost"
    assert health.inspect(saved).ok
    wal = tmp_path / "peerd.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "no frame of the old store is left to replay"

    # Sticky, for every later write; reads go on from the store the daemon had open.
    with pytest.raises(StorageUnavailable):
        await put(db, "later")
    assert {r[0] for r in await db.fetchall("SELECT id FROM projects")} == {"before", "acknowledged"}
    lost = await db.verify()
    assert lost is not None and lost.kind == "replaced" and lost.saved_as == saved
    assert len(displaced(tmp_path)) == 1, "saved once"


async def test_a_removed_store_refuses_the_next_write(db: Database, tmp_path: Path) -> None:
    await put(db, "acknowledged")
    db.path.unlink()
    with pytest.raises(StorageUnavailable) as refused:
        await put(db, "after")
    assert f"{db.path} was removed" in refused.value.message
    assert "--new-store" in refused.value.message
    assert not db.path.exists(), "the daemon did not make a new file at the path"
    [saved] = displaced(tmp_path)
    assert names_in(saved) == {"acknowledged"}


async def test_a_truncated_store_refuses_the_next_write(db: Database, tmp_path: Path) -> None:
    for n in range(50):
        await put(db, f"p{n}")
    with contextlib.closing(sqlite3.connect(db.path)) as conn:  # fold the log into the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert await db.verify() is None  # it looked, and saw the file's size
    size = db.path.stat().st_size
    os.truncate(db.path, size // 2)
    with pytest.raises(StorageUnavailable) as refused:
        await put(db, "after")
    assert f"{db.path} was truncated ({size // 2} bytes, where it had {size})" in refused.value.message
    assert db.path.stat().st_size == size // 2, "nothing more was written into it"


async def test_an_untouched_store_writes_on(db: Database, tmp_path: Path) -> None:
    """A file that only grows, or is copied elsewhere, is still the store."""
    for n in range(20):
        await put(db, f"p{n}")
    shutil.copy(db.path, tmp_path / "copy.db")
    await put(db, "more")
    assert await db.verify() is None
    assert displaced(tmp_path) == []


def test_the_guard_tells_the_three_apart(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    guard = StoreFile(path)
    assert guard.look() is None
    path.write_bytes(b"x" * 200)  # grew: fine
    assert guard.look() is None
    path.write_bytes(b"x" * 150)
    lost = guard.look()
    assert lost is not None and lost.kind == "truncated"
    assert guard.look() is lost, "kept"

    other = tmp_path / "g"
    other.write_bytes(b"y")
    guard = StoreFile(other)
    (tmp_path / "h").write_bytes(b"y")
    (tmp_path / "h").rename(other)
    assert (found := guard.look()) is not None and found.kind == "replaced"
    guard = StoreFile(other)
    other.unlink()
    assert (found := guard.look()) is not None and found.kind == "removed"


async def test_a_read_that_faults_on_a_store_cut_short_says_it_was_cut(db: Database, tmp_path: Path) -> None:
    """Cut to its first page, the store's reads fault (SQLite: malformed): the error says what
    happened to the file, not only that it is damaged, and the store is detached."""
    for n in range(200):
        await put(db, f"p{n}")
    with contextlib.closing(sqlite3.connect(db.path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert await db.verify() is None
    os.truncate(db.path, 4096)
    with pytest.raises(StorageUnavailable) as refused:
        await db.fetchall("SELECT * FROM projects ORDER BY name")
    assert f"{db.path} was truncated" in refused.value.message
    with pytest.raises(StorageUnavailable) as refused:
        await put(db, "after")
    assert f"{db.path} was truncated" in refused.value.message
    assert db.path.stat().st_size == 4096


async def test_every_connection_caps_its_page_cache(db: Database) -> None:
    """Issue 26 case 11: SQLite's default cache (2000 KiB a connection) filled as the store grew,
    ~7 kB a delegation on each daemon; each connection's cache is bounded by `CACHE_KIB`."""
    from peerd.store.db import CACHE_KIB  # noqa: PLC0415

    def size(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA cache_size").fetchone()[0])

    assert size(db._w.connection) == -CACHE_KIB["writer"]
    assert size(db._p) == -CACHE_KIB["point"]
    for name, conn in (("reader", db._r), ("keeper", db._keeper)):
        async with conn.execute("PRAGMA cache_size") as cur:
            row = await cur.fetchone()
        assert row is not None and row[0] == -CACHE_KIB[name], name
