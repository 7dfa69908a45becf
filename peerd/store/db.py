"""The SQLite connection pair: one writer (serialised in-process), one reader (WAL snapshots).

Every state change is one `async with db.write() as tx:` block, i.e. one `BEGIN IMMEDIATE`
transaction, committed before its effect leaves the process. Readers use their own connection, so
they never observe a half-done write.

Storage faults are typed: SQLite's "database or disk is full", "attempt to write a readonly
database", "database is locked" (past the busy timeout), I/O errors and a damaged file raise
`StorageUnavailable` (`storage_unavailable`, HTTP 503) with what to do, decided on SQLite's
result code, never on its message; nothing was changed, and the next call works again once the
cause is gone (no restart). A new store is built beside its final name and moved into place, so a
crash never leaves an empty `peerd.db` behind; whether an existing file may be opened at all is
`store/health.py`'s decision, made by the daemon before it opens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import aiosqlite
import structlog

from peerd.errors import StorageUnavailable
from peerd.store.schema import MIGRATIONS

BUSY_TIMEOUT_MS = 5000
# `PRAGMA application_id` of a peerd store: "peer" in ASCII, in the file's header, so a foreign
# SQLite file is told apart from ours (stores made before it carry 0 and get it when opened).
APPLICATION_ID = 0x70656572

# SQLite primary result codes (`sqlite_errorcode & 0xFF`) that are storage faults.
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR = 5, 6, 8, 10
SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 11, 13, 14, 26

log = structlog.get_logger(__name__)


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path` (its nearest existing directory)."""
    here = path.resolve().parent
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        dev = here.stat().st_dev
        while here != here.parent and here.parent.stat().st_dev == dev:
            here = here.parent
    except OSError:
        pass
    return here


def storage_fault(exc: BaseException, path: Path) -> StorageUnavailable | None:
    """The typed error for a SQLite storage fault (by result code), else None (a bug: re-raised)."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return None
    primary = code & 0xFF
    where = f"peerd's store {path}"
    if primary == SQLITE_FULL:
        what = (
            f"{where} cannot grow: the disk is full. Free space on the filesystem mounted at "
            f"{mount_point(path)}, then retry"
        )
    elif primary == SQLITE_READONLY:
        what = (
            f"{where} is read-only: make it and {path.parent} writable by this user, or remount "
            f"{mount_point(path)} read-write, then retry"
        )
    elif primary in (SQLITE_BUSY, SQLITE_LOCKED):
        what = (
            f"{where} stayed locked by another process for over {BUSY_TIMEOUT_MS // 1000} s: close "
            "whatever else has it open (only this daemon should), then retry"
        )
    elif primary in (SQLITE_IOERR, SQLITE_CANTOPEN):
        what = (
            f"{where} hit an I/O error: check the disk and the filesystem mounted at "
            f"{mount_point(path)} (`dmesg`, free space, permissions), then retry"
        )
    elif primary in (SQLITE_CORRUPT, SQLITE_NOTADB):
        what = (
            f"{where} is damaged: stop the daemon and run `peerd doctor`, then `peerd restore BACKUP` "
            "(or move the file aside and start with `peerd serve --new-store`)"
        )
    else:
        return None
    return StorageUnavailable(f"{what}; nothing was changed ({exc.__class__.__name__}: {exc}).")


async def _connect(path: Path) -> aiosqlite.Connection:
    # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves.
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    conn.row_factory = aiosqlite.Row
    await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    await conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def create(path: Path) -> None:
    """A new, migrated store at `path`, built as `<path>.new` and renamed into place (0600).

    A crash before the rename leaves only `<path>.new`, which the next creation replaces; so no
    half-made or empty `peerd.db` is ever left for a later start to mistake for a damaged one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    for stale in (new, new.with_name(new.name + "-wal"), new.with_name(new.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    # Create the file 0600 before SQLite does, so it is never world-readable.
    os.close(os.open(new, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    conn = await _connect(new)
    try:
        await conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        await conn.execute("PRAGMA journal_mode = WAL")
        await migrate(conn)
    finally:
        await conn.close()  # the last connection: SQLite checkpoints and removes the WAL
    _fsync(new)
    new.rename(path)
    _fsync(path.parent)


class Database:
    def __init__(self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection) -> None:
        self.path = path
        self._w = writer
        self._r = reader
        self._wlock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> Database:
        """Open the store at `path`, creating it when there is none (see `create`)."""
        if not path.exists():
            await create(path)
        path.chmod(0o600)
        writer = await _connect(path)
        try:
            await writer.execute("PRAGMA journal_mode = WAL")
            await writer.execute("PRAGMA synchronous = NORMAL")
            await migrate(writer)
            async with writer.execute("PRAGMA application_id") as cur:
                row = await cur.fetchone()
            if row is not None and row[0] == 0:  # a store made before peerd marked its files
                await writer.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            reader = await _connect(path)
        except BaseException as exc:
            await writer.close()
            fault = storage_fault(exc, path)
            if fault is None:
                raise
            raise fault from exc
        return cls(path, writer, reader)

    async def close(self) -> None:
        async with self._wlock:
            await self._w.close()
        await self._r.close()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One transaction; commits on success, rolls back on any exception (cancellation too).

        A storage fault anywhere in it (BEGIN, a statement, COMMIT) is raised as
        `StorageUnavailable` after the rollback; other exceptions pass unchanged."""
        async with self._wlock:
            try:
                await self._clear_abandoned()
                await self._w.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._raise_typed(exc)
            try:
                yield self._w
            except BaseException as exc:
                await self._rollback()
                self._raise_typed(exc)
            try:
                await self._w.execute("COMMIT")
            except sqlite3.Error as exc:
                await self._rollback()
                self._raise_typed(exc)

    def _raise_typed(self, exc: BaseException) -> NoReturn:
        """Raise `exc` as `StorageUnavailable` when it is a storage fault, else unchanged."""
        fault = storage_fault(exc, self.path)
        if fault is None:
            raise exc
        raise fault from exc

    async def _rollback(self) -> None:
        """Undo the open transaction, if SQLite did not already (it does after "disk full")."""
        if self._w.in_transaction:
            try:
                await self._w.execute("ROLLBACK")
            except sqlite3.Error:
                log.warning("store.rollback_failed", exc_info=True)

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
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        try:
            return list(await self._r.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            self._raise_typed(exc)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

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
