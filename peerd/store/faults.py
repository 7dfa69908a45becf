"""Which SQLite errors are storage faults, and the sentence each is refused with
(`storage_unavailable`), decided on SQLite's result code, never on its message. Used by
`store/db.py` for every read and write, and by `peerd backup`/`restore`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from peerd.errors import StorageUnavailable

BUSY_TIMEOUT_MS = 5000  # store/db.py's (re-exported there): how long a locked store is waited for

# SQLite primary result codes (`sqlite_errorcode & 0xFF`) that are storage faults.
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR = 5, 6, 8, 10
SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 11, 13, 14, 26


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
