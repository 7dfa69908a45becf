"""Is this file a healthy peerd store? Asked before the daemon opens it, by `peerd doctor`, and by
`peerd restore` of its candidate; and `backup`, a consistent copy of a store (SQLite's online
backup API, so it works while the daemon writes).

`inspect` looks without changing anything a peerd could need: the size, the header, the
page count the header claims, `PRAGMA quick_check`, the file's `application_id` and tables, and
the schema version. `refusal` is the pure rule that turns what it found into the one sentence a
start is refused with (design invariant 11: never start over a damaged or foreign store), or None.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from peerd.errors import InvalidRequest, StorageUnavailable, StoreRefused
from peerd.store.db import APPLICATION_ID
from peerd.store.schema import MIGRATIONS

HEADER = b"SQLite format 3\x00"
PEERD_TABLES = frozenset({"projects", "threads", "runs", "items", "events", "receipts"})
CHECK_TIMEOUT_S = 5.0

State = Literal[
    "ok", "missing", "empty", "not_sqlite", "truncated", "damaged", "foreign", "newer", "unreadable"
]


@dataclass(frozen=True)
class StoreHealth:
    path: str
    state: State
    detail: str = ""  # what was found, completing "<path> ..."
    version: int = 0  # the schema version (PRAGMA user_version), when it could be read
    size: int = 0

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _header_pages(header: bytes) -> tuple[int, int | None]:
    """(page size, the page count the header vouches for, or None where it does not)."""
    raw = int.from_bytes(header[16:18], "big")
    page_size = 65536 if raw == 1 else raw
    pages = int.from_bytes(header[28:32], "big")
    valid = pages > 0 and header[24:28] == header[92:96]  # "version-valid-for" matches the counter
    return page_size, pages if valid else None


@contextlib.contextmanager
def _read_only(path: Path, *, still: bool = False) -> Iterator[sqlite3.Connection]:
    """A read-only connection. `still`: without a write-ahead log beside it, open the file as
    immutable, so looking leaves no -wal and -shm files behind (a daemon writing it has a log)."""
    immutable = still and not sidecar(path.resolve(), "-wal").exists()
    uri = f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}"
    conn = sqlite3.connect(uri, uri=True, timeout=CHECK_TIMEOUT_S)
    try:
        yield conn
    finally:
        conn.close()


def inspect(path: Path, *, known_version: int = len(MIGRATIONS)) -> StoreHealth:
    """What `path` is, looked at read-only."""
    where = str(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return StoreHealth(where, "missing", "does not exist")
    except OSError as exc:
        return StoreHealth(where, "unreadable", f"cannot be looked at ({exc.strerror or exc})")
    if not path.is_file():
        return StoreHealth(where, "not_sqlite", "is not a regular file")
    size = st.st_size
    wal = sidecar(path.resolve(), "-wal")  # SQLite keeps its log beside the file a symlink names
    wal_size = wal.stat().st_size if wal.exists() else 0
    if size == 0:
        return StoreHealth(where, "empty", "is empty (0 bytes)", size=size)
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as exc:
        return StoreHealth(where, "unreadable", f"cannot be read ({exc.strerror or exc})", size=size)
    if len(header) < 100 or not header.startswith(HEADER):
        return StoreHealth(
            where, "not_sqlite", "is not an SQLite database (its header is not SQLite's)", size=size
        )
    page_size, pages = _header_pages(header)
    # With a write-ahead log beside it the file may lag its header until the next checkpoint.
    if wal_size == 0 and pages is not None and size < pages * page_size:
        return StoreHealth(
            where,
            "truncated",
            f"is truncated ({size} bytes, where its header counts {pages} pages of {page_size} bytes)",
            size=size,
        )
    try:
        with _read_only(path, still=True) as conn:
            problems = [str(row[0]) for row in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                said = [
                    p for line in problems for p in line.splitlines() if not p.startswith("*** in database")
                ]
                first = said[0] if said else "no answer"
                return StoreHealth(
                    where, "damaged", f"is damaged (its integrity check says: {first})", size=size
                )
            application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code in (5, 6):  # busy, locked: another process holds it
            return StoreHealth(where, "unreadable", f"is locked by another process ({exc})", size=size)
        if code == 26:  # SQLITE_NOTADB
            return StoreHealth(where, "not_sqlite", f"is not an SQLite database ({exc})", size=size)
        return StoreHealth(where, "damaged", f"is damaged ({exc})", size=size)
    if application_id not in (0, APPLICATION_ID):
        return StoreHealth(
            where, "foreign", f"is another program's SQLite database (application id {application_id:#x})"
        )
    if not tables - {"sqlite_sequence"}:
        return StoreHealth(where, "empty", "is an SQLite database with no tables", version=version, size=size)
    if not tables >= PEERD_TABLES or version == 0:
        shown = ", ".join(sorted(tables - {"sqlite_sequence"})[:5])
        return StoreHealth(
            where, "foreign", f"is not a peerd database (its tables: {shown})", version=version, size=size
        )
    if version > known_version:
        return StoreHealth(
            where,
            "newer",
            f"was written by a newer peerd (schema version {version}; this one knows {known_version})",
            version=version,
            size=size,
        )
    return StoreHealth(where, "ok", f"healthy, schema version {version}", version=version, size=size)


def refusal(found: StoreHealth, *, identity_exists: bool, new_store: bool) -> str | None:
    """Why a start must not go on with this store (one sentence naming it and the way out), or None.

    A missing store is made anew only where there is no identity yet (a first start) or the user
    said `--new-store`; an existing file is never replaced, whatever the flags."""
    path = found.path
    if found.state == "ok":
        return None
    if found.state == "missing":
        wal = sidecar(Path(path).resolve(), "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return (
                f"{path} is missing but its write-ahead log {wal} is still there: put the database back, "
                f"or move {wal} aside too before starting with `peerd serve --new-store`."
            )
        if not identity_exists or new_store:
            return None
        return (
            f"{path} is missing although this environment's identity exists: restore the store with "
            "`peerd restore BACKUP`, or start with a new, empty one (no projects, threads, tasks or links) "
            "with `peerd serve --new-store`."
        )
    if found.state == "newer":
        return f"{path} {found.detail}: upgrade peerd, or `peerd restore` a backup made by this version."
    if found.state == "unreadable":
        return f"{path} {found.detail}: fix that (see `peerd doctor`), then start again."
    aside = f"{path}.damaged"
    return (
        f"{path} {found.detail}, so peerd will not start over it: restore a backup with "
        f"`peerd restore BACKUP`, or move it aside (`mv {path} {aside}`, with any {Path(path).name}-wal "
        "and -shm files) and start with `peerd serve --new-store`."
    )


def check(path: Path, *, identity_exists: bool, new_store: bool) -> None:
    """Raise `StoreRefused` unless a daemon may open (or create) the store at `path`."""
    reason = refusal(inspect(path), identity_exists=identity_exists, new_store=new_store)
    if reason is not None:
        raise StoreRefused(reason)


def backup(source: Path, dest: Path) -> StoreHealth:
    """A consistent snapshot of `source` in the new file `dest` (0600), checked; returns its health.

    SQLite's online backup API copies the pages of one read transaction, so a daemon writing at
    the same time is neither blocked for long nor seen half-way. The copy is made beside `dest`
    and renamed into place once it passed `inspect`; it uses a rollback journal, so it is one file."""
    if dest.exists():
        raise InvalidRequest(f"{dest} exists; choose a new file name, or remove it first.")
    partial = sidecar(dest, ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        with _read_only(source) as src, contextlib.closing(sqlite3.connect(partial)) as out:
            src.backup(out)
            out.execute("PRAGMA journal_mode = DELETE")
        found = inspect(partial)
        if not found.ok:
            raise StorageUnavailable(
                f"the copy of {source} is not a healthy peerd store: it {found.detail}; run `peerd doctor`."
            )
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        partial.rename(dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    return StoreHealth(str(dest), found.state, found.detail, version=found.version, size=dest.stat().st_size)


def restore(candidate: Path, dest: Path, *, stamp: str) -> Path | None:
    """Put a copy of the healthy peerd store `candidate` at `dest`; the store that was there (and its
    -wal and -shm files) is kept aside as `<dest>.before-restore-<stamp>`, which is returned.

    The caller holds the home lock, so no daemon has `dest` open."""
    found = inspect(candidate)
    if not found.ok:
        raise InvalidRequest(
            f"{candidate} {found.detail}; nothing was restored. Choose a backup made by `peerd backup`."
        )
    staged = sidecar(dest, ".restoring")
    for stale in (staged, sidecar(staged, "-journal")):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    backup(candidate, staged)  # a checked, consistent single-file copy of the candidate
    aside: Path | None = None
    if dest.exists():
        aside = sidecar(dest, f".before-restore-{stamp}")
        dest.rename(aside)
    for suffix in ("-wal", "-shm"):  # a log left beside the new file would be replayed into it
        if sidecar(dest, suffix).exists():
            if aside is None:
                aside = sidecar(dest, f".before-restore-{stamp}")
            sidecar(dest, suffix).rename(sidecar(aside, suffix))
    staged.rename(dest)
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return aside
