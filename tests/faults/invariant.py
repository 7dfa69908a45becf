"""The "owned, owed or ending" invariant (peerd/core/liveness.py), checked on a store file at the
end of a fault trial, once the delegation settled: nothing is running, so nothing may be recorded
live, no question may wait on a run that is gone, no local task may be open with nothing left to
do, no move may be open; and no run may end before it was made."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from peerd.core.liveness import Fix, Owners, sweep
from peerd.store import sweep as sweep_store


def violations(db_path: Path, *, now: float | None = None) -> list[Fix]:
    """What the sweep would fix in the store at `db_path` when its daemon runs nothing (a settled
    trial): every open record nothing owns, owes or ends. Read-only, while the daemon runs or not."""
    uri = f"{db_path.absolute().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        rows = [conn.execute(sql).fetchall() for sql in sweep_store.QUERIES]
    return sweep(sweep_store.build(time.time() if now is None else now, rows), Owners())


def backwards_runs(db_path: Path) -> list[str]:
    uri = f"{db_path.absolute().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        rows = conn.execute("SELECT id FROM runs WHERE ended_at IS NOT NULL AND ended_at < created_at")
        return [r[0] for r in rows]


def assert_invariant(db_path: Path) -> None:
    """Fails naming every open record of a settled store that breaks the invariant."""
    found = violations(db_path)
    assert not found, f"{db_path}: open records nothing owns, owes or ends: {found}"
    assert not backwards_runs(db_path), f"{db_path}: runs that ended before they were made"
