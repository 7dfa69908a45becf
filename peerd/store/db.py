"""The SQLite connection pair: one writer (serialised in-process), one reader (WAL snapshots).

Every state change is one `async with db.write() as tx:` block, i.e. one `BEGIN IMMEDIATE`
transaction, committed before its effect leaves the process. Readers use their own connection, so
they never observe a half-done write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import structlog

from peerd.store.schema import MIGRATIONS

BUSY_TIMEOUT_MS = 5000

log = structlog.get_logger(__name__)


async def _connect(path: Path) -> aiosqlite.Connection:
    # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves.
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    conn.row_factory = aiosqlite.Row
    await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    await conn.execute("PRAGMA foreign_keys = ON")
    return conn


class Database:
    def __init__(self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection) -> None:
        self.path = path
        self._w = writer
        self._r = reader
        self._wlock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            # Create the file 0600 before SQLite does, so it is never world-readable.
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        path.chmod(0o600)
        writer = await _connect(path)
        try:
            await writer.execute("PRAGMA journal_mode = WAL")
            await writer.execute("PRAGMA synchronous = NORMAL")
            await migrate(writer)
            reader = await _connect(path)
        except BaseException:
            await writer.close()
            raise
        return cls(path, writer, reader)

    async def close(self) -> None:
        async with self._wlock:
            await self._w.close()
        await self._r.close()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One transaction; commits on success, rolls back on any exception (cancellation too)."""
        async with self._wlock:
            await self._clear_abandoned()
            await self._w.execute("BEGIN IMMEDIATE")
            try:
                yield self._w
            except BaseException:
                await self._w.execute("ROLLBACK")
                raise
            else:
                await self._w.execute("COMMIT")

    async def _clear_abandoned(self) -> None:
        """Roll back what a cancelled writer left open.

        A task cancelled while awaiting BEGIN (or ROLLBACK) gives up the lock, but aiosqlite still
        runs that statement in its thread, so the connection can be left inside a transaction
        nobody owns; the next BEGIN would then fail. A no-op queued behind it waits for it to
        finish (the thread runs statements in order), then any leftover transaction is undone:
        its writer was cancelled, so it never counted on it."""
        await self._w.execute("SELECT 1")
        if self._w.in_transaction:
            log.warning("store.abandoned_transaction_rolled_back")
            await self._w.execute("ROLLBACK")

    # Each read is one hop to the reader's thread (execute, fetch, reset): a statement left open
    # between awaits would hold the reader's WAL snapshot, and concurrent reads would then miss
    # writes committed meanwhile (under load, a thread just launched "was not found").
    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        rows = list(await self._r.execute_fetchall(sql, params))
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        return list(await self._r.execute_fetchall(sql, params))

    async def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else row[0]


async def user_version(conn: aiosqlite.Connection) -> int:
    async with conn.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def migrate(conn: aiosqlite.Connection, migrations: Iterable[Sequence[str]] = MIGRATIONS) -> int:
    """Apply the migrations past `PRAGMA user_version`, each in its own transaction."""
    steps = list(migrations)
    current = await user_version(conn)
    if current > len(steps):
        raise RuntimeError(
            f"the database is at schema version {current}, newer than this peerd knows "
            f"({len(steps)}); upgrade peerd"
        )
    for number, statements in enumerate(steps[current:], start=current + 1):
        await conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(f"PRAGMA user_version = {number}")
        except BaseException:
            await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
    return len(steps)
