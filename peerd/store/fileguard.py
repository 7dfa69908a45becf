"""Is the file at the store's path still the store this daemon opened? (design invariant 11)

SQLite writes through the file descriptors it opened, not through the path: when `peerd.db` is
renamed over (a backup put back while the daemon runs), removed, or truncated, the daemon would
go on answering writes into a file nobody will open again (renamed over, removed) or into a file
that lost its pages (truncated), and a restart would lose every one of them. So `Database.write`
asks `StoreFile.look` just before each COMMIT: one `os.stat` of the path (about 2 us of CPU,
4-5% of the cheapest write transaction, a one-row insert at 45-53 us; `bench/store_guard.py`), its
(st_dev, st_ino) against the file opened, and its size against the largest seen (without VACUUM
or auto_vacuum, which peerd never runs, SQLite never shrinks a database file). What it finds is
kept: once lost, the store stays lost for this process (a restart decides, with `store/health.py`).

What the daemon then does is `Database._detach`: it refuses every write with
`storage_unavailable` (this module's sentence: what happened, what was kept, what to do), keeps
answering reads from the store it had open (what it acknowledged), and saves that store once, with
SQLite's online backup through its own connection, as `peerd.db.displaced-<time>` beside the path.
For a file replaced or removed it then empties its own write-ahead log into the file it opened
(`wal_checkpoint(TRUNCATE)`), so that no frame of the old store is ever replayed into the file now
at the path (SQLite replays a `-wal` it finds beside a database whatever the database), even if the
daemon is then killed. A truncated file is the same inode: nothing more is written into it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["replaced", "removed", "truncated"]


@dataclass(frozen=True)
class Lost:
    """How the file at the store's path stopped being the store the daemon opened."""

    kind: Kind
    path: Path
    detail: str  # what was found, completing "<path> was ..."
    saved_as: Path | None = None  # the daemon's copy of the store it had open
    save_error: str | None = None  # why the copy could not be made

    def sentence(self) -> str:
        """The one message every refused write carries (and `status`, and `peerd doctor`)."""
        path = self.path
        what = f"peerd's store {path} was {self.detail} while the daemon ran, so the daemon stopped writing"
        if self.saved_as is not None and self.kind == "truncated":
            kept = f"; what it could still read of the store is saved as {self.saved_as}"
            restore = f"`peerd restore {self.saved_as}`"
        elif self.saved_as is not None:
            kept = f"; the store it was writing (every change it acknowledged) is saved as {self.saved_as}"
            restore = f"`peerd restore {self.saved_as}`"
        else:
            why = f" ({self.save_error})" if self.save_error else ""
            kept = f"; the store it was writing could not be saved{why}"
            restore = "`peerd restore BACKUP` (a file made by `peerd backup`)"
        if self.kind == "replaced":
            todo = (
                f"Stop the daemon, then {restore} and start it again to keep that work, or start it "
                f"again with `peerd serve` to use the file now at {path}"
            )
        elif self.kind == "removed":
            todo = (
                f"Stop the daemon, then {restore} and start it again (`peerd serve`), or start with a new, "
                "empty store (no projects, threads, tasks or links) with `peerd serve --new-store`"
            )
        else:
            todo = (
                f"Stop the daemon, then {restore} (it checks the copy first) and start it again; "
                f"`peerd doctor` says what is left of {path}"
            )
        return f"{what}{kept}. {todo}."


class StoreFile:
    """The identity and the largest size of the file the daemon opened as its store."""

    def __init__(self, path: Path) -> None:
        st = path.stat()
        self.path = path
        self._where = os.fsencode(path)  # bytes: `os.stat` converts nothing on each look
        self.dev, self.ino = st.st_dev, st.st_ino
        self.size = st.st_size
        self.lost: Lost | None = None

    def look(self) -> Lost | None:
        """One `os.stat` of the path; the first change found is kept (`lost`)."""
        if self.lost is not None:
            return self.lost
        try:
            st = os.stat(self._where)  # noqa: PTH116  # a bytes path: nothing converted per write
        except FileNotFoundError:
            self.lost = Lost("removed", self.path, "removed")
            return self.lost
        except OSError:
            return None  # cannot tell (a directory's permission): SQLite's own error says it
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            self.lost = Lost("replaced", self.path, "replaced by another file")
        elif st.st_size < self.size:
            self.lost = Lost(
                "truncated", self.path, f"truncated ({st.st_size} bytes, where it had {self.size})"
            )
        else:
            self.size = st.st_size
        return self.lost

    def kept(self, saved_as: Path | None, save_error: str | None) -> Lost:
        assert self.lost is not None  # noqa: S101  # called once it is lost
        self.lost = Lost(self.lost.kind, self.path, self.lost.detail, saved_as, save_error)
        return self.lost


def displaced_name(path: Path, *, now: float | None = None) -> Path:
    """`<path>.displaced-<UTC time>`, a name not taken yet."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    candidate = path.with_name(f"{path.name}.displaced-{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.displaced-{stamp}-{n}")
    return candidate


def save_copy(conn: sqlite3.Connection, dest: Path) -> None:
    """A consistent single-file copy (0600) of what `conn` reads, made beside `dest`, then renamed.

    Run in a worker thread while the caller holds the writer (no transaction open on `conn`)."""
    partial = dest.with_name(dest.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    try:
        with contextlib.closing(sqlite3.connect(partial)) as out:
            conn.backup(out)
            out.execute("PRAGMA journal_mode = DELETE")
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


def empty_log(conn: sqlite3.Connection, *, tries: int = 50) -> bool:
    """Fold the write-ahead log into the file `conn` opened and cut the log to 0 bytes (a worker
    thread). A reader in the middle of a read makes SQLite answer busy: tried again, a while."""
    for _ in range(tries):
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if not busy:
            return True
        time.sleep(0.02)
    return False
