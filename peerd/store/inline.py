"""The writer connection run inline on the event loop's thread (`Tx`), in aiosqlite's calling
shape: `await tx.execute(...)`, `async with tx.execute(...) as cur`. See store/db.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any


class Cursor:
    """A statement's result on the writer, in aiosqlite's calling shape (its rows are already there)."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._c = cursor

    @property
    def rowcount(self) -> int:
        return self._c.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._c.lastrowid

    async def fetchone(self) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._c.fetchone()
        return row

    async def fetchall(self) -> list[sqlite3.Row]:
        return list(self._c.fetchall())

    async def close(self) -> None:
        self._c.close()

    async def __aenter__(self) -> Cursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._c.close()


class Statement:
    """`tx.execute(...)`: already run; awaited or entered (`async with`) it gives its `Cursor`."""

    def __init__(self, cursor: Cursor) -> None:
        self._cursor = cursor

    def __await__(self) -> Generator[Any, None, Cursor]:
        return self._done().__await__()

    async def _done(self) -> Cursor:
        return self._cursor

    async def __aenter__(self) -> Cursor:
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        await self._cursor.close()


class Tx:
    """The writer connection, run inline on the event loop's thread.

    Each statement of a write is a few microseconds of SQLite work, while a hop to a connection's
    own thread (how aiosqlite runs every call) costs a thread wake-up each way and, on a VM, often
    more than the statement: a launch with its run took ~90 writer hops, most of the box's CPU. So
    the writer runs its statements here, under the same calling shape the store's code uses (`await
    tx.execute(...)`, `async with tx.execute(...) as cur`), and nothing it does can block for long:
    WAL with `synchronous = NORMAL` syncs nothing on commit, the WAL is checkpointed off the loop
    (`Database._checkpoint`), and `BEGIN IMMEDIATE` never waits on a lock here (a busy store is
    retried with asyncio sleeps). Reads that can be long stay on the reader's own thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    @property
    def in_transaction(self) -> bool:
        return self._c.in_transaction

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Statement:
        return Statement(Cursor(self._c.execute(sql, params)))

    async def executemany(self, sql: str, params: Iterable[Sequence[Any] | Mapping[str, Any]]) -> Cursor:
        return Cursor(self._c.executemany(sql, params))

    async def execute_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(self._c.execute(sql, params).fetchall())

    async def set_trace_callback(self, callback: Callable[[str], object] | None) -> None:
        self._c.set_trace_callback(callback)

    @property
    def connection(self) -> sqlite3.Connection:
        return self._c

    def close(self) -> None:
        self._c.close()
