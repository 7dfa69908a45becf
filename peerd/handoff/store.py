"""The `moves` table (migration 16) and the thread writes a move makes: each change one
transaction, a thread change with its event row (as every thread change in `peerd.store.threads`).

On the machine a thread moves from: one row per move, recorded `waiting` before anything leaves;
at most one open-or-done move per thread (`moves_open`); a client request id names one move
(`moves_request`). The commit point holds the thread's queue in the same transaction that makes the
move `moving`; `finish` ends the thread here `moved` with its pointer (`threads.moved_to`) in the
same transaction that ends the move. On the machine a thread moved to: `threads.moved_from`.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Literal

import aiosqlite

from peerd.contracts import ThreadStatus
from peerd.core.moves import FIRST, HELD, UNFINISHED, MoveState, check_transition
from peerd.errors import Conflict, MoveNotFound
from peerd.handoff.machine import Message, may_commit
from peerd.handoff.wire import MovedRef, MoveInfo
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.store.sqltext import sql_list
from peerd.store.threads.rows import add_event, fetch_one

Commit = Literal["committed", "busy", "gone"]
THREAD_MOVED: ThreadStatus = "moved"  # the thread's status here once its move is done (not a move state)
_FIELDS = frozenset(
    {"remote_project", "base_commit", "snapshot", "there_branch", "kept_ref", "prompt", "there_thread_id",
     "there_run_id", "error"}
)  # fmt: skip
# States are named in SQL only from core/moves.py's constants, in their order: SQLite uses the
# partial indexes `moves_open` (HELD) and `moves_unfinished` (UNFINISHED) only for these very lists.
_HELD = f"state IN {sql_list(HELD)}"
_UNFINISHED = f"state IN {sql_list(UNFINISHED)}"
_STATE_COLUMNS = frozenset({"error", "held_before"})  # what a change of state may write with it


async def _move_to(tx: Tx, move: aiosqlite.Row, new: MoveState, *, now: float, **columns: Any) -> None:
    """The one statement that changes a move's state: the change must be in core/moves.py's
    table (`check_transition`, else `InvalidTransition`), and it applies only to the move in the
    state this transaction read it in."""
    current: MoveState = move["state"]
    check_transition(current, new)
    unknown = set(columns) - _STATE_COLUMNS
    if unknown:
        raise ValueError(f"not a column a change of state writes: {sorted(unknown)}")
    sets = "".join(f"{name} = ?, " for name in columns)
    cur = await tx.execute(
        f"UPDATE moves SET state = ?, {sets}updated_at = ? WHERE id = ? AND state = ?",  # noqa: S608  # names checked
        (new, *columns.values(), now, move["id"], current),
    )
    if cur.rowcount != 1:  # the row was read before this transaction, and has changed since
        raise Conflict(f"Move {move['id']} changed while it was being moved to {new}; retry.")


def info(row: aiosqlite.Row, *, replayed: bool = False) -> MoveInfo:
    moved_to = None
    if row["state"] == "moved" and row["there_thread_id"]:
        moved_to = MovedRef(environment_id=row["environment_id"], thread_id=row["there_thread_id"])
    branch = row["there_branch"] or None  # "" records "one of its own" (decided, not yet known)
    return MoveInfo(
        move_id=row["id"],
        thread_id=row["thread_id"],
        environment_id=row["environment_id"],
        state=row["state"],
        started_by=row["started_by"],
        message=row["message"],
        snapshot=row["snapshot"],
        branch_there=branch,
        kept_ref=row["kept_ref"],
        moved_to=moved_to,
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        replayed=replayed,
    )


async def get(db: Database, move_id: str) -> aiosqlite.Row:
    row = await db.fetchone("SELECT * FROM moves WHERE id = ?", (move_id,))
    if row is None:
        raise MoveNotFound(f"Move {move_id} was not found here; `peerd thread show` names a thread's move.")
    return row


async def current(db: Database, thread_id: str) -> aiosqlite.Row | None:
    """The thread's open or done move (at most one), else None."""
    return await db.fetchone(f"SELECT * FROM moves WHERE thread_id = ? AND {_HELD}", (thread_id,))  # noqa: S608


async def unfinished(db: Database) -> list[aiosqlite.Row]:
    return await db.fetchall(f"SELECT * FROM moves WHERE {_UNFINISHED} ORDER BY created_at")  # noqa: S608


async def record(
    db: Database,
    *,
    thread_id: str,
    environment_id: str,
    message: str | None,
    interrupt: bool,
    started_by: str,
    request_key: str | None,
    now: float,
) -> tuple[aiosqlite.Row, bool]:
    """A new `waiting` move, or the one this request (or this thread's open move to the same
    environment) already made: (row, replayed). Another environment while one is open: conflict."""
    async with db.write() as tx:
        if request_key is not None:
            found = await fetch_one(tx, "SELECT * FROM moves WHERE request_key = ?", (request_key,))
            if found is not None:
                return found, True
        open_ = await fetch_one(tx, f"SELECT * FROM moves WHERE thread_id = ? AND {_HELD}", (thread_id,))  # noqa: S608
        if open_ is not None:
            if open_["environment_id"] == environment_id:
                return open_, True
            raise Conflict(
                f"Thread {thread_id} already has move {open_['id']} to {open_['environment_id']} "
                f"({open_['state']}); a thread moves to one place."
            )
        move_id = new_id("mov")
        try:
            await tx.execute(
                "INSERT INTO moves (id, thread_id, environment_id, state, message, interrupt, started_by,"
                " request_key, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    move_id,
                    thread_id,
                    environment_id,
                    FIRST,
                    message,
                    int(interrupt),
                    started_by,
                    request_key,
                    now,
                    now,
                ),
            )
        except sqlite3.IntegrityError as exc:  # the unique indexes: a concurrent twin won
            raise Conflict(f"Thread {thread_id} is being moved by another request; retry to see it.") from exc
        await add_event(tx, thread_id, "move.updated", {"moveId": move_id, "state": FIRST}, now)
        row = await fetch_one(tx, "SELECT * FROM moves WHERE id = ?", (move_id,))
    assert row is not None  # noqa: S101  # written in this transaction
    return row, False


async def cancel_waiting(db: Database, thread_id: str, *, reason: str, now: float) -> str | None:
    """Cancel the thread's move if it has not passed its commit point; the move's id, else None."""
    async with db.write() as tx:
        # `_HELD` too: the one index on a thread's moves is `moves_open`, for that list only.
        row = await fetch_one(tx, f"SELECT * FROM moves WHERE thread_id = ? AND {_HELD}", (thread_id,))  # noqa: S608
        if row is None or row["state"] != "waiting":
            return None
        await _move_to(tx, row, "cancelled", now=now, error=reason)
        await add_event(tx, thread_id, "move.updated", {"moveId": row["id"], "state": "cancelled"}, now)
    return str(row["id"])


async def commit_point(db: Database, move_id: str, *, now: float) -> Commit:
    """`waiting` -> `moving` when the thread has no live or queued run, holding its queue in the
    same transaction (so nothing starts here and no send slips in between): 'committed'; 'busy'
    when a run is live or queued; 'gone' when the move is no longer waiting (cancelled), or is
    cancelled now because a message (a user run) reached the thread after the move was asked."""
    async with db.write() as tx:
        move = await fetch_one(tx, "SELECT * FROM moves WHERE id = ?", (move_id,))
        if move is None or move["state"] != "waiting":
            return "committed" if move is not None and move["state"] in ("moving", "moved") else "gone"
        thread_id = move["thread_id"]
        live = await fetch_one(
            tx,
            "SELECT coalesce(sum(status IN ('starting', 'running')), 0) AS live,"
            " coalesce(sum(status = 'queued'), 0) AS queued FROM runs WHERE thread_id = ?",
            (thread_id,),
        )
        thread = await fetch_one(tx, "SELECT queue_held, status FROM threads WHERE id = ?", (thread_id,))
        if thread is None or thread["status"] != "active":  # archived (or gone) meanwhile: it stays
            reason = "The thread was archived before the move committed."
            await _move_to(tx, move, "cancelled", now=now, error=reason)
            return "gone"
        said = await fetch_one(
            tx,
            "SELECT count(*) AS n FROM runs WHERE thread_id = ? AND origin = 'user' AND created_at > ?",
            (thread_id, move["created_at"]),
        )
        if said is not None and said["n"]:  # a message reached it after the request: it stays here
            reason = "A message to the thread before the move committed kept it here."
            await _move_to(tx, move, "cancelled", now=now, error=reason)
            await add_event(tx, thread_id, "move.updated", {"moveId": move_id, "state": "cancelled"}, now)
            return "gone"
        if not may_commit(live_run=bool(live and live["live"]), queued_run=bool(live and live["queued"])):
            return "busy"
        await _move_to(tx, move, "moving", now=now, held_before=int(thread["queue_held"]))
        await tx.execute("UPDATE threads SET queue_held = 1, updated_at = ? WHERE id = ?", (now, thread_id))
        await add_event(tx, thread_id, "move.updated", {"moveId": move_id, "state": "moving"}, now)
        await add_event(tx, thread_id, "thread.updated", {"queueHeld": True}, now)
    return "committed"


async def set_fields(db: Database, move_id: str, *, now: float, **values: Any) -> None:
    unknown = set(values) - _FIELDS
    if unknown:
        raise ValueError(f"not a move field: {sorted(unknown)}")
    columns = ", ".join(f"{name} = ?" for name in values)
    async with db.write() as tx:
        await tx.execute(
            f"UPDATE moves SET {columns}, updated_at = ? WHERE id = ?",  # noqa: S608  # names checked above
            (*values.values(), now, move_id),
        )


async def fail(db: Database, move_id: str, *, error: str, now: float) -> None:
    """A final refusal before a thread there exists: the move fails, the thread here is released
    (its queue as it was before the commit point)."""
    async with db.write() as tx:
        move = await fetch_one(tx, "SELECT * FROM moves WHERE id = ?", (move_id,))
        if move is None or move["state"] not in UNFINISHED:
            return
        await _move_to(tx, move, "failed", now=now, error=error)
        if move["state"] == "moving":
            await tx.execute(
                "UPDATE threads SET queue_held = ?, updated_at = ? WHERE id = ?",
                (move["held_before"], now, move["thread_id"]),
            )
        await add_event(tx, move["thread_id"], "move.updated", {"moveId": move_id, "state": "failed"}, now)


async def finish(db: Database, move_id: str, *, now: float) -> None:
    """The move is done: the thread here ends `moved`, pointing at the thread there."""
    async with db.write() as tx:
        move = await fetch_one(tx, "SELECT * FROM moves WHERE id = ?", (move_id,))
        if move is None or move["state"] != "moving" or not move["there_thread_id"]:
            return
        pointer = MovedRef(environment_id=move["environment_id"], thread_id=move["there_thread_id"])
        await _move_to(tx, move, "moved", now=now)
        await tx.execute(
            "UPDATE threads SET status = ?, queue_held = 1, moved_to = ?, updated_at = ? WHERE id = ?",
            (THREAD_MOVED, json.dumps(pointer.wire()), now, move["thread_id"]),
        )
        await add_event(tx, move["thread_id"], "move.updated", {"moveId": move_id, "state": "moved"}, now)
        await add_event(
            tx, move["thread_id"], "thread.updated", {"status": "moved", "movedTo": pointer.wire()}, now
        )


async def set_moved_from(db: Database, thread_id: str, ref: MovedRef, *, now: float) -> None:
    """On the machine a thread moved to: where it came from (idempotent)."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE threads SET moved_from = ?, updated_at = ? WHERE id = ?",
            (json.dumps(ref.wire()), now, thread_id),
        )
        await add_event(tx, thread_id, "thread.updated", {"movedFrom": ref.wire()}, now)


async def last_messages(db: Database, thread_id: str, count: int) -> list[Message]:
    """The thread's last `count` user and assistant messages, oldest first (one indexed read
    backwards from the newest item)."""
    rows = await db.fetchall(
        "SELECT kind, text FROM items WHERE thread_id = ? AND kind IN ('user_message', 'assistant_message')"
        " ORDER BY position DESC LIMIT ?",
        (thread_id, count),
    )
    return [
        Message("user" if r["kind"] == "user_message" else "assistant", str(r["text"]))
        for r in reversed(rows)
    ]
