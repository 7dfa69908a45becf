"""Rows to contract models, and the statements every thread change shares (a row this
transaction just wrote, the event row that goes with each change)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiosqlite

from peerd.contracts import Item, Run, Thread
from peerd.core.runs import RunView
from peerd.core.text import slice_text
from peerd.store.db import Tx
from peerd.store.threads.usage import usage_of

# A thread with its latest run in one statement (`thread_from_joined`): the latest run is the one
# with the highest number, found through the runs (thread_id, number) unique index.
LATEST_RUN_COLUMNS = ", ".join(
    f"r.{name} AS lr_{name}"
    for name in (
        "id",
        "thread_id",
        "number",
        "status",
        "reason",
        "exit_code",
        "created_at",
        "started_at",
        "ended_at",
        "usage",
    )
)
THREAD_WITH_LATEST = (
    f"SELECT t.rowid AS page_rowid, t.*, {LATEST_RUN_COLUMNS} FROM threads t"  # noqa: S608  # fixed names
    " LEFT JOIN runs r ON r.thread_id = t.id"
    " AND r.number = (SELECT max(number) FROM runs WHERE thread_id = t.id)"
)


# A thread's runs as the core's queue rules see them (`view_from_row`), oldest first.
RUN_VIEWS = "SELECT id, number, status, origin, continues FROM runs WHERE thread_id = ? ORDER BY number"


@dataclass(frozen=True)
class NewThread:
    project_id: str
    title: str
    provider: str
    model: str | None
    runtime_mode: str
    interaction_mode: str
    in_place: bool
    worktree_path: str
    branch: str | None
    link_origin: str | None = None  # the client id of the link that started it (the fence)
    link_label: str | None = None
    delegated_from: dict[str, Any] | None = None
    started_by: str | None = None  # see `Operations.started_by`
    base_commit: str | None = None


@dataclass(frozen=True)
class Idempotency:
    """Who asked and under which key; `command_id` None means the command is not retry-safe."""

    namespace: str
    command_id: str | None
    request_hash: str


def run_from_row(row: aiosqlite.Row) -> Run:
    return Run(
        id=row["id"],
        thread_id=row["thread_id"],
        number=row["number"],
        status=row["status"],
        reason=row["reason"],
        exit_code=row["exit_code"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        usage=usage_of(row["usage"]),
    )


def thread_from_row(row: aiosqlite.Row, latest: Run | None) -> Thread:
    return Thread(
        id=row["id"],
        project_id=row["project_id"],
        title=row["title"],
        provider=row["provider"],
        model=row["model"],
        runtime_mode=row["runtime_mode"],
        interaction_mode=row["interaction_mode"],
        status=row["status"],
        queue_held=bool(row["queue_held"]),
        in_place=bool(row["in_place"]),
        worktree_path=row["worktree_path"],
        branch=row["branch"],
        provider_session=row["provider_session"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        latest_run=latest,
        link_origin=row["link_origin"],
        link_label=row["link_label"],
        delegated_from=json.loads(row["delegated_from"]) if row["delegated_from"] else None,
        started_by=row["started_by"],
        base_commit=row["base_commit"],
        moved_to=json.loads(row["moved_to"]) if row["moved_to"] else None,
        moved_from=json.loads(row["moved_from"]) if row["moved_from"] else None,
    )


def item_from_row(row: aiosqlite.Row, *, text_offset: int = 0, max_chars: int | None = None) -> Item:
    text: str = row["text"]
    part = slice_text(text, offset=text_offset, max_chars=max_chars or max(len(text), 1))
    return Item(
        id=row["id"],
        thread_id=row["thread_id"],
        run_id=row["run_id"],
        position=row["position"],
        kind=row["kind"],
        text=part.text,
        text_length=len(text),
        text_offset=part.offset,
        text_truncated=part.truncated,
        next_text_offset=part.next_offset,
        data=json.loads(row["data"]),
        created_at=row["created_at"],
    )


async def add_event(tx: Tx, thread_id: str, type_: str, data: dict[str, Any], now: float) -> None:
    await tx.execute(
        "INSERT INTO events (thread_id, type, data, created_at) VALUES (?, ?, ?, ?)",
        (thread_id, type_, json.dumps(data), now),
    )


async def fetch_one(tx: Tx, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row | None:
    async with tx.execute(sql, params) as cur:
        row: aiosqlite.Row | None = await cur.fetchone()
        return row


async def fetch_must(tx: Tx, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row:
    """A row this transaction just wrote; its absence would be a bug, not user input."""
    row = await fetch_one(tx, sql, params)
    if row is None:
        raise RuntimeError(f"row vanished inside its own transaction: {sql}")
    return row


def view_from_row(row: aiosqlite.Row) -> RunView:
    return RunView(row["id"], row["number"], row["status"], row["origin"], row["continues"])


def thread_from_joined(row: aiosqlite.Row) -> Thread:
    """A row of `THREAD_WITH_LATEST`: the thread and its latest run (None before its first)."""
    latest = None
    if row["lr_id"] is not None:
        latest = Run(
            id=row["lr_id"],
            thread_id=row["lr_thread_id"],
            number=row["lr_number"],
            status=row["lr_status"],
            reason=row["lr_reason"],
            exit_code=row["lr_exit_code"],
            created_at=row["lr_created_at"],
            started_at=row["lr_started_at"],
            ended_at=row["lr_ended_at"],
            usage=usage_of(row["lr_usage"]),
        )
    return thread_from_row(row, latest)
