"""Ways a store file gets damaged, each a function of a stopped daemon's home (shared by the fault
suite and tests/integration/test_store_faults.py)."""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

from peerd.paths import Paths


def _db(home: Path) -> Path:
    return Paths(home).db


def zero_length(home: Path) -> None:
    _db(home).write_bytes(b"")


def truncated(home: Path) -> None:
    db = _db(home)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def garbage_header(home: Path) -> None:
    db = _db(home)
    data = bytearray(db.read_bytes())
    data[:100] = random.Random(1).randbytes(100)
    db.write_bytes(bytes(data))


def garbled_middle_page(home: Path) -> None:
    """Random bytes over the root page of the `threads` table (a page in the middle of the file)."""
    db = _db(home)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        root = int(conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'threads'").fetchone()[0])
    data = bytearray(db.read_bytes())
    start = (root - 1) * page_size
    data[start : start + page_size] = random.Random(2).randbytes(page_size)
    db.write_bytes(bytes(data))


def foreign_sqlite(home: Path) -> None:
    db = _db(home)
    db.unlink()
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('shopping list')")


def identity_without_db(home: Path) -> None:
    _db(home).unlink()


DAMAGES: dict[str, Callable[[Path], None]] = {
    "zero-length": zero_length,
    "truncated": truncated,
    "garbage-header": garbage_header,
    "garbled-middle-page": garbled_middle_page,
    "foreign-sqlite": foreign_sqlite,
    "identity-without-db": identity_without_db,
}

# What the refusal sentence says about each (after the file's path).
SAID: dict[str, str] = {
    "zero-length": "is empty (0 bytes)",
    "truncated": "is truncated",
    "garbage-header": "is not an SQLite database",
    "garbled-middle-page": "is damaged",
    "foreign-sqlite": "is not a peerd database",
    "identity-without-db": "is missing although this environment's identity exists",
}


def checkpointed(home: Path) -> None:
    """Fold a stopped daemon's write-ahead log into the file, so damage to the file is all there is."""
    with contextlib.closing(sqlite3.connect(_db(home))) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
