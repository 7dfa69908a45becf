"""Where the threads this machine started on other machines live: one lookup over every record of it.

A thread lives on a linked machine when this machine launched it there (`--env BOX`, recorded here
as `launched`), placed it there (`--env auto`: `placements`), delegated to it (`tasks.target_env`),
moved it there (`moves.there_thread_id`), or found it there by asking the links (`found`, recorded
here so the next lookup asks nobody). `elsewhere` reads all of them, by a whole id or by the start of
one (`thr_` and hex digits), so `peerd thread show ID` follows any of them there
(`Operations.thread_where`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peerd.store.db import Database

__all__ = ["Home", "Via", "elsewhere", "record"]

Via = Literal["launched", "placed", "delegated", "moved", "found"]


@dataclass(frozen=True)
class Home:
    thread_id: str
    environment_id: str
    via: Via


async def record(db: Database, thread_id: str, environment_id: str, via: Via, now: float) -> None:
    """This thread lives on that machine. The first record of a thread stands (a launch replayed
    or found again says the same)."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO thread_homes (thread_id, environment_id, via, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (thread_id) DO NOTHING",
            (thread_id, environment_id, via, now),
        )


_ELSEWHERE = """
    SELECT thread_id, environment_id, via FROM thread_homes WHERE thread_id >= ? AND thread_id < ?
    UNION
    SELECT thread_id, environment_id, ? FROM placements
     WHERE thread_id >= ? AND thread_id < ? AND environment_id IS NOT NULL
    UNION
    SELECT child_thread_id, target_env, ? FROM tasks
     WHERE child_thread_id >= ? AND child_thread_id < ? AND target_env IS NOT NULL
    UNION
    SELECT there_thread_id, environment_id, ? FROM moves
     WHERE there_thread_id >= ? AND there_thread_id < ?
    ORDER BY 1 LIMIT ?
"""


async def elsewhere(db: Database, ref: str, *, limit: int) -> list[Home]:
    """Threads on other machines whose id is `ref` or starts with it, one row per thread (the first
    record of it), in id order, at most `limit`. `ref` is `thr_` and hex digits: `ref + "~"` is past
    every id that starts with it."""
    span = (ref, ref + "~")
    params = (*span, "placed", *span, "delegated", *span, "moved", *span, limit * 4)
    rows = await db.fetchall(_ELSEWHERE, params)
    seen: dict[str, Home] = {}
    for r in rows:
        tid = str(r[0])
        if tid not in seen:
            seen[tid] = Home(tid, str(r[1]), r[2])
    return list(seen.values())[:limit]
