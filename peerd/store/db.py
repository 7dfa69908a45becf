"""The store's SQLite connections: one writer (serialised in-process), one reader (WAL snapshots),
one keeper (migrations and WAL checkpoints).

Every state change is one `async with db.write() as tx:` block, i.e. one `BEGIN IMMEDIATE`
transaction, committed before its effect leaves the process. The writer runs on the event loop's
thread (`store/inline.py:Tx`: its statements are microseconds, a hop to another thread costs more); reads and
checkpoints run on their connections' own threads (aiosqlite), since they can be long. Readers use
their own connection, so they never observe a half-done write.

Storage faults are typed (`store/faults.py`): SQLite's "database or disk is full", "attempt to write a readonly
database", "database is locked" (past the busy timeout), I/O errors and a damaged file raise
`StorageUnavailable` (`storage_unavailable`, HTTP 503) with what to do, decided on SQLite's
result code, never on its message; nothing was changed, and the next call works again once the
cause is gone (no restart). A new store is built beside its final name and moved into place, so a
crash never leaves an empty `peerd.db` behind; whether an existing file may be opened at all is
`store/health.py`'s decision, made by the daemon before it opens it.

The file at the path must stay the file opened: before each COMMIT one `os.stat` checks it was not
replaced, removed or truncated (`store/fileguard.py`); once it was, every write is refused with
`storage_unavailable` saying so (sticky until a restart), reads go on from the store the daemon had
open, and that store is saved once beside the path (`Database._detach`).
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

from peerd.core.backoff import Backoff
from peerd.errors import StorageUnavailable
from peerd.store.faults import (
    BUSY_TIMEOUT_MS,
    SQLITE_BUSY,
    SQLITE_LOCKED,
    SQLITE_READONLY,
    storage_fault,
)
from peerd.store.fileguard import Lost, StoreFile, displaced_name, empty_log, save_copy
from peerd.store.inline import Tx
from peerd.store.schema import MIGRATIONS

# Each connection's page cache, in KiB (`PRAGMA cache_size = -N`). SQLite's default, 2000 KiB per
# connection, is filled as the store grows: with four connections a daemon grew by ~7 kB of cache
# per delegation, linearly until ~8 MB (issue 26 case 11; bench/mem_delegation.py). The file's
# pages stay in the OS's cache, so a page not cached here is a pread, a few microseconds.
CACHE_KIB = {"writer": 512, "reader": 256, "point": 256, "keeper": 64}
CHECKPOINT_EVERY_S = 1.0  # the WAL is checkpointed at most this long after a write
# `PRAGMA application_id` of a peerd store: "peer" in ASCII, in the file's header, so a foreign
# SQLite file is told apart from ours (stores made before it carry 0 and get it when opened).
APPLICATION_ID = 0x70656572

__all__ = [  # Tx and storage_fault live in inline.py and faults.py; the store's modules import them here
    "APPLICATION_ID",
    "BUSY_TIMEOUT_MS",
    "CACHE_KIB",
    "CHECKPOINT_EVERY_S",
    "Database",
    "Tx",
    "create",
    "migrate",
    "storage_fault",
    "user_version",
]

log = structlog.get_logger(__name__)

# Another process holds the write lock: 1 ms doubling to 100 ms between tries (waited on the loop,
# not the daemon's clock: a lock held by another process), until `BUSY_TIMEOUT_MS` in all.
BUSY_BACKOFF = Backoff(first=0.001, cap=0.1)


async def _connect(path: Path, *, cache_kib: int = CACHE_KIB["keeper"]) -> aiosqlite.Connection:
    # isolation_level=None: no implicit transactions; we BEGIN/COMMIT ourselves.
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    conn.row_factory = aiosqlite.Row
    await conn.execute(f"PRAGMA cache_size = -{cache_kib}")
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


async def _let_the_loop_in() -> None:
    """Every store call suspends once (a turn of the loop, ~20 us), as it did when each one was a
    hop to a thread. Without it a loop of store calls would never let the loop in: it could not be
    cancelled (an orchestration's wait spun at shutdown) and would hold up every other task for as
    long as it ran."""
    await asyncio.sleep(0)


def _point_reader(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB['point']}")
    conn.execute("PRAGMA busy_timeout = 0")  # never wait on the loop: `Database.lookup` falls back
    conn.execute("PRAGMA query_only = ON")
    return conn


def _inline_writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB['writer']}")
    conn.execute("PRAGMA busy_timeout = 0")  # never wait on the loop: `Database._begin` retries
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints run off the loop
    return conn


class Database:
    def __init__(
        self,
        path: Path,
        writer: Tx,
        reader: aiosqlite.Connection,
        keeper: aiosqlite.Connection,
        point: sqlite3.Connection,
        guard: StoreFile | None = None,
    ) -> None:
        self.path = path
        self._guard = guard or StoreFile(path)  # is the file at `path` still the one opened?
        self._detached = False  # the store it had open was saved and its log emptied
        self._w = writer
        self._r = reader
        self._p = point  # `lookup`'s: inline reads of a few rows by key
        self._keeper = keeper  # migrated the store; runs the WAL checkpoints, on its own thread
        self._wlock = asyncio.Lock()
        self._checkpoint_due: asyncio.TimerHandle | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(cls, path: Path) -> Database:
        """Open the store at `path`, creating it when there is none (see `create`)."""
        if not path.exists():
            await create(path)
        path.chmod(0o600)
        keeper = await _connect(path)
        try:
            await keeper.execute("PRAGMA journal_mode = WAL")
            await keeper.execute("PRAGMA synchronous = NORMAL")
            await migrate(keeper)
            async with keeper.execute("PRAGMA application_id") as cur:
                row = await cur.fetchone()
            if row is not None and row[0] == 0:  # a store made before peerd marked its files
                await keeper.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            reader = await _connect(path, cache_kib=CACHE_KIB["reader"])
            writer: Tx | None = None
            try:
                writer = Tx(await asyncio.to_thread(_inline_writer, path))
                point = await asyncio.to_thread(_point_reader, path)
                guard = StoreFile(path)
            except BaseException:
                if writer is not None:
                    writer.close()
                await reader.close()
                raise
        except BaseException as exc:
            await keeper.close()
            fault = storage_fault(exc, path)
            if fault is None:
                raise
            raise fault from exc
        return cls(path, writer, reader, keeper, point, guard)

    async def close(self) -> None:
        async with self._wlock:
            self._closed = True
            if self._checkpoint_due is not None:
                self._checkpoint_due.cancel()
            if self._checkpointing is not None:
                with contextlib.suppress(Exception):
                    await self._checkpointing
            await self._r.close()
            await self._keeper.close()
            self._p.close()
            self._w.close()  # the last connection: SQLite checkpoints and removes the WAL

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """One transaction; commits on success, rolls back on any exception (cancellation too).

        A storage fault anywhere in it (BEGIN, a statement, COMMIT) is raised as
        `StorageUnavailable` after the rollback; other exceptions pass unchanged."""
        async with self._wlock:
            await _let_the_loop_in()
            if self._guard.lost is not None:
                raise StorageUnavailable((await self._detach()).sentence())
            await self._begin()
            try:
                yield self._w
            except BaseException as exc:
                self._rollback()
                faulted = isinstance(exc, StorageUnavailable) or storage_fault(exc, self.path) is not None
                if faulted and self._guard.look() is not None:
                    raise StorageUnavailable((await self._detach()).sentence()) from exc  # say why
                self._raise_typed(exc)
            if self._guard.look() is not None:  # the path no longer names the file written
                self._rollback()
                raise StorageUnavailable((await self._detach()).sentence())
            try:
                self._w.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                self._raise_typed(exc)
            self._committed()

    async def verify(self) -> Lost | None:
        """Whether the file at the path is still the store opened (one `os.stat`), and if not,
        what happened and what was kept (the store it had open is saved the first time)."""
        if self._guard.look() is None:
            return None
        async with self._wlock:
            return await self._detach()

    async def _detach(self) -> Lost:
        """Once the path no longer names the store opened: save that store beside the path (every
        write it acknowledged) and, where the path now names another file or none, empty the
        write-ahead log into the file it opened, so no frame of it is replayed into another file.
        Called holding the writer, with no transaction open."""
        lost = self._guard.lost
        assert lost is not None  # noqa: S101  # called once `look` found it
        if self._detached:
            return lost
        self._detached = True
        if self._checkpoint_due is not None:
            self._checkpoint_due.cancel()
            self._checkpoint_due = None
        conn = self._w.connection
        dest = displaced_name(self.path)
        saved: Path | None = dest
        error: str | None = None
        try:
            await asyncio.to_thread(save_copy, conn, dest)
        except (sqlite3.Error, OSError) as exc:
            saved, error = None, f"{type(exc).__name__}: {exc}"
        if lost.kind != "truncated":  # a truncated file is the store's own: nothing more goes into it
            try:
                await asyncio.to_thread(empty_log, conn)
            except sqlite3.Error:
                log.warning("store.log_not_emptied", exc_info=True)
        lost = self._guard.kept(saved, error)
        log.error("store.lost", path=str(self.path), kind=lost.kind, saved_as=str(saved), error=error)
        return lost

    async def _begin(self) -> None:
        """`BEGIN IMMEDIATE`; while another process holds the store's write lock, retried with
        asyncio sleeps (never blocking the loop) for up to `BUSY_TIMEOUT_MS`."""
        waited = 0.0
        tries = 0
        while True:
            try:
                self._w.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.Error as exc:
                code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
                if code not in (SQLITE_BUSY, SQLITE_LOCKED) or waited >= BUSY_TIMEOUT_MS / 1000:
                    self._raise_typed(exc)
            tries += 1
            pause = BUSY_BACKOFF.delay(tries)
            await asyncio.sleep(pause)
            waited += pause

    def _committed(self) -> None:
        """Checkpoint the WAL off the loop, at most once per `CHECKPOINT_EVERY_S` of writing."""
        if self._checkpoint_due is None and self._checkpointing is None and not self._closed:
            self._checkpoint_due = asyncio.get_running_loop().call_later(
                CHECKPOINT_EVERY_S, self._start_checkpoint
            )

    def _start_checkpoint(self) -> None:
        self._checkpoint_due = None
        if not self._closed:
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        if self._guard.look() is not None:  # never into a file that is not (all) the store any more
            self._checkpointing = None
            return
        try:
            # PASSIVE: copies what no reader still needs, takes no lock a writer waits on.
            await self._keeper.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            log.warning("store.checkpoint_failed", exc_info=True)
        finally:
            self._checkpointing = None

    def _raise_typed(self, exc: BaseException) -> NoReturn:
        """Raise `exc` as `StorageUnavailable` when it is a storage fault, else unchanged."""
        fault = storage_fault(exc, self.path)
        if fault is None:
            raise exc
        raise fault from exc

    def _rollback(self) -> None:
        """Undo the open transaction, if SQLite did not already (it does after "disk full")."""
        if self._w.in_transaction:
            try:
                self._w.execute("ROLLBACK")
            except sqlite3.Error:
                log.warning("store.rollback_failed", exc_info=True)

    # Each read is one hop to the reader's thread (execute, fetch, reset): a statement left open
    # between awaits would hold the reader's WAL snapshot, and concurrent reads would then miss
    # writes committed meanwhile (under load, a thread just launched "was not found").
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        try:
            return list(await self._r.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            await self._read_fault(exc)

    async def _read_fault(self, exc: sqlite3.Error) -> NoReturn:
        """A read's storage fault, said as what happened to the file when it was replaced or cut
        under the daemon (then detached, unless a write holds the writer: it detaches itself)."""
        if storage_fault(exc, self.path) is not None and (lost := self._guard.look()) is not None:
            if not self._detached and not self._wlock.locked():
                async with self._wlock:
                    lost = await self._detach()
            raise StorageUnavailable(lost.sentence()) from exc
        self._raise_typed(exc)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else row[0]

    # A read of a few rows reached through an index (one thread, its runs, a project, a client) is
    # run inline on its own connection: microseconds, where a hop to the reader's thread costs a
    # thread wake-up each way. Never a scan, a page or a listing: those can be long, and stay on the
    # reader's thread (`fetchall`). WAL readers never wait on the writer; should SQLite still say
    # busy (a recovery by another process), the read goes to the reader's thread, which waits.
    async def lookup_all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        await _let_the_loop_in()
        try:
            return list(self._p.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code in (SQLITE_BUSY, SQLITE_LOCKED):
                return await self.fetchall(sql, params)
            if code == SQLITE_READONLY:  # `query_only`: a write sent here is a bug, not the disk
                raise
            await self._read_fault(exc)

    async def lookup(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self.lookup_all(sql, params)
        return rows[0] if rows else None


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
