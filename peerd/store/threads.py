"""Threads, runs, items and the per-thread event log.

Every change here writes its rows and one event in the same transaction, so the event cursor and
the state can never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

import aiosqlite

from peerd.contracts import Event, Item, Page, Run, RunStatus, Thread
from peerd.core.idempotency import replay
from peerd.core.runs import (
    DAEMON_STOPPED,
    CutHow,
    CutThread,
    RunView,
    check_transition,
    continuation_prompt,
    is_terminal,
    recover_at_startup,
    thread_kind,
)
from peerd.core.text import slice_text
from peerd.errors import Conflict, InvalidRequest, ItemNotFound, RunNotFound, ThreadNotFound
from peerd.store import receipts
from peerd.store.db import Database
from peerd.store.ids import new_id
from peerd.tasks.rules import RunFact


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


def _run(row: aiosqlite.Row) -> Run:
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
    )


def _thread(row: aiosqlite.Row, latest: Run | None) -> Thread:
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


async def _event(
    tx: aiosqlite.Connection, thread_id: str, type_: str, data: dict[str, Any], now: float
) -> None:
    await tx.execute(
        "INSERT INTO events (thread_id, type, data, created_at) VALUES (?, ?, ?, ?)",
        (thread_id, type_, json.dumps(data), now),
    )


async def _one(tx: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row | None:
    async with tx.execute(sql, params) as cur:
        row: aiosqlite.Row | None = await cur.fetchone()
        return row


async def _must(tx: aiosqlite.Connection, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row:
    """A row this transaction just wrote; its absence would be a bug, not user input."""
    row = await _one(tx, sql, params)
    if row is None:
        raise RuntimeError(f"row vanished inside its own transaction: {sql}")
    return row


async def _insert_item(
    tx: aiosqlite.Connection,
    thread_id: str,
    run_id: str,
    kind: str,
    text: str,
    data: dict[str, Any],
    now: float,
) -> aiosqlite.Row:
    row = await _one(tx, "SELECT next_position FROM threads WHERE id = ?", (thread_id,))
    if row is None:
        raise ThreadNotFound(f"Thread {thread_id} was not found.")
    position = int(row["next_position"])
    item_id = new_id("itm")
    await tx.execute(
        "INSERT INTO items (id, thread_id, run_id, position, kind, text, data, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (item_id, thread_id, run_id, position, kind, text, json.dumps(data), now),
    )
    await tx.execute(
        "UPDATE threads SET next_position = ?, updated_at = ? WHERE id = ?", (position + 1, now, thread_id)
    )
    await _event(
        tx,
        thread_id,
        "item.added",
        {"itemId": item_id, "runId": run_id, "kind": kind, "position": position},
        now,
    )
    return await _must(tx, "SELECT * FROM items WHERE id = ?", (item_id,))


async def insert_run(
    tx: aiosqlite.Connection, thread_id: str, prompt: str, now: float, *, origin: str = "user"
) -> str:
    """A queued run and its user message, inside the caller's transaction."""
    return await _insert_run(tx, thread_id, prompt, now, origin=origin)


async def event(
    tx: aiosqlite.Connection, thread_id: str, type_: str, data: dict[str, Any], now: float
) -> None:
    await _event(tx, thread_id, type_, data, now)


async def _insert_run(
    tx: aiosqlite.Connection,
    thread_id: str,
    prompt: str,
    now: float,
    *,
    origin: str = "user",
    continues: str | None = None,
) -> str:
    row = await _one(tx, "SELECT coalesce(max(number), 0) AS n FROM runs WHERE thread_id = ?", (thread_id,))
    number = int(row["n"]) + 1 if row else 1
    run_id = new_id("run")
    await tx.execute(
        "INSERT INTO runs (id, thread_id, number, status, prompt, created_at, origin, continues)"
        " VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)",
        (run_id, thread_id, number, prompt, now, origin, continues),
    )
    await _event(tx, thread_id, "run.updated", {"runId": run_id, "status": "queued", "number": number}, now)
    await _insert_item(tx, thread_id, run_id, "user_message", prompt, {}, now)
    return run_id


class BranchTaken(Conflict):
    code = "branch_taken"


async def launch(
    db: Database,
    *,
    key: Idempotency,
    spec: NewThread,
    prompt: str,
    now: float,
    branch_exists: Callable[[str], Awaitable[bool]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Create a thread with its first (queued) run; a retried key returns the first result.

    A branch belongs to the thread that created it: a new thread's branch must not be another
    thread's (checked in this transaction) nor exist in the repository yet (`branch_exists`)."""
    async with db.write() as tx:
        if key.command_id is not None:
            found = await receipts.find(tx, key.namespace, "thread_launch", key.command_id)
            first = replay(found, request_hash=key.request_hash)
            if first is not None:
                return first, True
        thread_id = new_id("thr")
        worktree_path = spec.worktree_path.replace("{thread}", thread_id)
        branch = spec.branch.replace("{thread}", thread_id) if spec.branch else None
        if branch is not None:
            cur = await tx.execute(
                "SELECT id FROM threads WHERE project_id = ? AND branch = ? LIMIT 1",
                (spec.project_id, branch),
            )
            owner = await cur.fetchone()
            if owner is not None or (branch_exists is not None and await branch_exists(branch)):
                whose = f"thread {owner['id']}'s" if owner is not None else "an existing branch"
                raise BranchTaken(
                    f"Branch {branch} is {whose} in this project; a new thread gets a branch of its own. "
                    "Omit branch (peerd names one) or choose a new name."
                )
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, model, runtime_mode, interaction_mode,"
            " in_place, worktree_path, branch, created_at, updated_at, link_origin, link_label, delegated_from,"
            " base_commit, started_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                thread_id,
                spec.project_id,
                spec.title,
                spec.provider,
                spec.model,
                spec.runtime_mode,
                spec.interaction_mode,
                int(spec.in_place),
                worktree_path,
                branch,
                now,
                now,
                spec.link_origin,
                spec.link_label,
                json.dumps(spec.delegated_from) if spec.delegated_from else None,
                spec.base_commit,
                spec.started_by,
            ),
        )
        await _event(tx, thread_id, "thread.created", {"threadId": thread_id}, now)
        run_id = await _insert_run(tx, thread_id, prompt, now)
        result = {"threadId": thread_id, "runId": run_id}
        if key.command_id is not None:
            await receipts.record(
                tx,
                namespace=key.namespace,
                op="thread_launch",
                command_id=key.command_id,
                request_hash=key.request_hash,
                result=result,
                now=now,
            )
    return result, False


async def send(
    db: Database, *, key: Idempotency, thread_id: str, text: str, now: float
) -> tuple[dict[str, Any], bool]:
    """Queue a new run on the thread. A new message from its owner also releases a held queue."""
    async with db.write() as tx:
        if key.command_id is not None:
            found = await receipts.find(tx, key.namespace, f"thread_send:{thread_id}", key.command_id)
            first = replay(found, request_hash=key.request_hash)
            if first is not None:
                return first, True
        row = await _one(tx, "SELECT status FROM threads WHERE id = ?", (thread_id,))
        if row is None:
            raise ThreadNotFound(f"Thread {thread_id} was not found.")
        if row["status"] == "archived":
            raise InvalidRequest(f"Thread {thread_id} is archived; launch a new thread instead.")
        await tx.execute("UPDATE threads SET queue_held = 0 WHERE id = ?", (thread_id,))
        run_id = await _insert_run(tx, thread_id, text, now)
        result = {"threadId": thread_id, "runId": run_id}
        if key.command_id is not None:
            await receipts.record(
                tx,
                namespace=key.namespace,
                op=f"thread_send:{thread_id}",
                command_id=key.command_id,
                request_hash=key.request_hash,
                result=result,
                now=now,
            )
    return result, False


async def transition_run(
    db: Database,
    run_id: str,
    new: RunStatus,
    *,
    now: float,
    reason: str | None = None,
    exit_code: int | None = None,
    pgid: int | None = None,
    token_hash: str | None = None,
    error_item: str | None = None,
) -> Run:
    """Move a run to `new` (checked by the core rules); optionally record an error item with it."""
    async with db.write() as tx:
        row = await _one(tx, "SELECT * FROM runs WHERE id = ?", (run_id,))
        if row is None:
            raise RunNotFound(f"Run {run_id} was not found.")
        check_transition(row["status"], new)
        started = now if new == "starting" else row["started_at"]
        ended = now if is_terminal(new) else None
        await tx.execute(
            "UPDATE runs SET status = ?, reason = coalesce(?, reason), exit_code = coalesce(?, exit_code),"
            " pgid = coalesce(?, pgid), token_hash = CASE WHEN ? THEN NULL ELSE coalesce(?, token_hash) END,"
            " started_at = ?, ended_at = ? WHERE id = ?",
            (new, reason, exit_code, pgid, is_terminal(new), token_hash, started, ended, run_id),
        )
        if error_item:
            await _insert_item(tx, row["thread_id"], run_id, "error", error_item, {}, now)
        await _event(
            tx, row["thread_id"], "run.updated", {"runId": run_id, "status": new, "reason": reason}, now
        )
        updated = await _must(tx, "SELECT * FROM runs WHERE id = ?", (run_id,))
    return _run(updated)


async def add_item(
    db: Database, *, thread_id: str, run_id: str, kind: str, text: str, data: dict[str, Any], now: float
) -> Item:
    async with db.write() as tx:
        row = await _insert_item(tx, thread_id, run_id, kind, text, data, now)
    return item_from_row(row)


async def set_provider_session(db: Database, thread_id: str, session: str, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE threads SET provider_session = ?, updated_at = ? WHERE id = ?", (session, now, thread_id)
        )
        await _event(tx, thread_id, "thread.updated", {"providerSession": session}, now)


async def set_queue_held(db: Database, thread_id: str, held: bool, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE threads SET queue_held = ?, updated_at = ? WHERE id = ?", (int(held), now, thread_id)
        )
        await _event(tx, thread_id, "thread.updated", {"queueHeld": held}, now)


async def archive(db: Database, thread_id: str, *, now: float) -> None:
    """Archive the thread; its queued runs will never start, so they end cancelled."""
    async with db.write() as tx:
        async with tx.execute(
            "SELECT id FROM runs WHERE thread_id = ? AND status = 'queued'", (thread_id,)
        ) as cur:
            queued = [r["id"] for r in await cur.fetchall()]
        for run_id in queued:
            await tx.execute(
                "UPDATE runs SET status = 'cancelled', reason = 'The thread was archived.', ended_at = ?"
                " WHERE id = ?",
                (now, run_id),
            )
            await _event(tx, thread_id, "run.updated", {"runId": run_id, "status": "cancelled"}, now)
        await tx.execute(
            "UPDATE threads SET status = 'archived', queue_held = 1, updated_at = ? WHERE id = ?",
            (now, thread_id),
        )
        await _event(tx, thread_id, "thread.updated", {"status": "archived"}, now)


async def live_run_groups(db: Database) -> list[tuple[str, int]]:
    """(run id, process group) of runs recorded live: at start-up, what a dead daemon left running."""
    rows = await db.fetchall(
        "SELECT id, pgid FROM runs WHERE status IN ('starting', 'running') AND pgid IS NOT NULL"
    )
    return [(r["id"], int(r["pgid"])) for r in rows]


async def recover(
    db: Database,
    *,
    now: float,
    reason: str | None = None,
    label: str | None = None,
    continue_children: bool = False,
    how: CutHow = "crash",
    only: Collection[str] | None = None,
) -> list[str]:
    """Runs a daemon stop cut (every live one, or those in `only`), in one transaction: each is
    interrupted with the reason (naming this environment: `label`) and an error item carrying the
    code `daemon_stopped`; where the run rules say so (`core.runs.recover_at_startup`) a
    continuation is queued in the same transaction, so what is owed is recorded before anything
    starts. `reason` replaces the planned reason. Returns the cut runs."""
    async with db.write() as tx:
        async with tx.execute(
            "SELECT DISTINCT thread_id FROM runs WHERE status IN ('starting', 'running')"
        ) as cur:
            thread_ids = [r["thread_id"] for r in await cur.fetchall()]
        cuts = [await _cut_thread(tx, thread_id) for thread_id in thread_ids]
        plans = recover_at_startup(cuts, label=label, continue_children=continue_children, how=how)
        owner = {
            run.id: thread_id for thread_id, cut in zip(thread_ids, cuts, strict=True) for run in cut.runs
        }
        done: list[str] = []
        for plan in plans:
            if only is not None and plan.run_id not in only:
                continue
            thread_id, why = owner[plan.run_id], reason or plan.reason
            await tx.execute(
                "UPDATE runs SET status = 'interrupted', reason = ?, ended_at = ?, token_hash = NULL WHERE id = ?",
                (why, now, plan.run_id),
            )
            await _insert_item(tx, thread_id, plan.run_id, "error", why, {"code": DAEMON_STOPPED}, now)
            data = {"runId": plan.run_id, "status": "interrupted", "reason": why}
            await _event(tx, thread_id, "run.updated", data, now)
            if plan.continued:
                repeated = None
                if plan.repeat_prompt_of is not None:
                    row = await _must(tx, "SELECT prompt FROM runs WHERE id = ?", (plan.repeat_prompt_of,))
                    repeated = str(row["prompt"])
                prompt = continuation_prompt(repeated)
                await _insert_run(tx, thread_id, prompt, now, origin="continue", continues=plan.run_id)
            done.append(plan.run_id)
    return done


async def _cut_thread(tx: aiosqlite.Connection, thread_id: str) -> CutThread:
    row = await _must(tx, "SELECT * FROM threads WHERE id = ?", (thread_id,))
    async with tx.execute(
        "SELECT id, number, status, origin, continues FROM runs WHERE thread_id = ? ORDER BY number",
        (thread_id,),
    ) as cur:
        runs = tuple(_view(r) for r in await cur.fetchall())
    return CutThread(
        kind=thread_kind(started_by=row["started_by"], delegated=row["delegated_from"] is not None),
        stopped=bool(row["queue_held"]) or row["status"] == "archived",
        has_session=row["provider_session"] is not None,
        runs=runs,
    )


def _view(row: aiosqlite.Row) -> RunView:
    return RunView(row["id"], row["number"], row["status"], row["origin"], row["continues"])


# --- reads --------------------------------------------------------------------------------------


async def get_run(db: Database, run_id: str) -> Run:
    row = await db.fetchone("SELECT * FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFound(f"Run {run_id} was not found.")
    return _run(row)


async def run_prompt(db: Database, run_id: str) -> str:
    prompt = await db.scalar("SELECT prompt FROM runs WHERE id = ?", (run_id,))
    if prompt is None:
        raise RunNotFound(f"Run {run_id} was not found.")
    return str(prompt)


async def latest_run(db: Database, thread_id: str) -> Run | None:
    row = await db.fetchone(
        "SELECT * FROM runs WHERE thread_id = ? ORDER BY number DESC LIMIT 1", (thread_id,)
    )
    return None if row is None else _run(row)


async def run_facts(db: Database, thread_id: str) -> list[RunFact]:
    rows = await db.fetchall(
        "SELECT id, number, status, origin, reason FROM runs WHERE thread_id = ? ORDER BY number",
        (thread_id,),
    )
    return [RunFact(r["id"], r["number"], r["status"], r["origin"], r["reason"]) for r in rows]


async def last_reply(db: Database, run_id: str) -> str | None:
    """The run's last assistant message, whole."""
    text = await db.scalar(
        "SELECT text FROM items WHERE run_id = ? AND kind = 'assistant_message' ORDER BY position DESC LIMIT 1",
        (run_id,),
    )
    return None if text is None else str(text)


async def run_views(db: Database, thread_id: str) -> list[RunView]:
    rows = await db.fetchall(
        "SELECT id, number, status, origin, continues FROM runs WHERE thread_id = ? ORDER BY number",
        (thread_id,),
    )
    return [_view(r) for r in rows]


async def get_thread(db: Database, thread_id: str) -> Thread:
    row = await db.fetchone("SELECT * FROM threads WHERE id = ?", (thread_id,))
    if row is None:
        raise ThreadNotFound(f"Thread {thread_id} was not found.")
    return _thread(row, await latest_run(db, thread_id))


async def page(
    db: Database, *, project_id: str | None, include_archived: bool, cursor: str | None, limit: int
) -> Page[Thread]:
    try:
        after = int(cursor) if cursor else 0
    except ValueError:
        raise InvalidRequest(f"cursor {cursor!r} is not one this API returned.") from None
    clauses, params = ["rowid > ?"], [after]
    if project_id is not None:
        clauses.append("project_id = ?")
        params.append(project_id)  # type: ignore[arg-type]  # mixed params list
    if not include_archived:
        clauses.append("status != 'archived'")
    rows = await db.fetchall(
        f"SELECT rowid, * FROM threads WHERE {' AND '.join(clauses)} ORDER BY rowid LIMIT ?",  # noqa: S608
        (*params, limit + 1),
    )
    more = len(rows) > limit
    rows = rows[:limit]
    items = [_thread(r, await latest_run(db, r["id"])) for r in rows]
    return Page[Thread](items=items, next_cursor=str(rows[-1]["rowid"]) if more else None)


async def read_items(
    db: Database, thread_id: str, *, after_position: int | None, limit: int, run_id: str | None
) -> list[aiosqlite.Row]:
    sql = "SELECT * FROM items WHERE thread_id = ? AND position > ?"
    params: list[Any] = [thread_id, -1 if after_position is None else after_position]
    if run_id is not None:
        sql += " AND run_id = ?"
        params.append(run_id)
    return await db.fetchall(sql + " ORDER BY position LIMIT ?", (*params, limit + 1))


async def get_item(db: Database, thread_id: str, item_id: str) -> aiosqlite.Row:
    row = await db.fetchone("SELECT * FROM items WHERE id = ? AND thread_id = ?", (item_id, thread_id))
    if row is None:
        raise ItemNotFound(f"Item {item_id} is not in thread {thread_id}.")
    return row


async def events_after(db: Database, thread_id: str, *, after: int, limit: int) -> list[Event]:
    rows = await db.fetchall(
        "SELECT * FROM events WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT ?", (thread_id, after, limit)
    )
    return [
        Event(
            seq=r["seq"],
            thread_id=r["thread_id"],
            type=r["type"],
            data=json.loads(r["data"]),
            created_at=r["created_at"],
        )
        for r in rows
    ]


async def queued_threads(db: Database) -> list[str]:
    rows = await db.fetchall(
        "SELECT DISTINCT r.thread_id FROM runs r JOIN threads t ON t.id = r.thread_id"
        " WHERE r.status = 'queued' AND t.queue_held = 0 AND t.status = 'active'"
    )
    return [r["thread_id"] for r in rows]


async def busy_threads_of_link(db: Database, client_id: str) -> list[str]:
    """The threads a link started that have a live or queued run (what its revocation stops)."""
    rows = await db.fetchall(
        "SELECT DISTINCT r.thread_id FROM runs r JOIN threads t ON t.id = r.thread_id"
        " WHERE t.link_origin = ? AND r.status IN ('queued', 'starting', 'running')",
        (client_id,),
    )
    return [r["thread_id"] for r in rows]


async def run_by_token_hash(db: Database, token_hash: str) -> Run | None:
    row = await db.fetchone("SELECT * FROM runs WHERE token_hash = ?", (token_hash,))
    return None if row is None else _run(row)


async def counts(db: Database) -> tuple[int, int]:
    threads = int(await db.scalar("SELECT count(*) FROM threads WHERE status = 'active'"))
    live = int(await db.scalar("SELECT count(*) FROM runs WHERE status IN ('starting', 'running')"))
    return threads, live
