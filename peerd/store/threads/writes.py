"""Thread, run and item changes: each writes its rows and one event in the same transaction, so the
event cursor and the state can never disagree."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from peerd.contracts import Item, Run, Thread
from peerd.core.idempotency import replay
from peerd.core.ownership import owner_of_thread
from peerd.core.runs import RunStatus, check_transition, is_terminal, next_to_start
from peerd.errors import BranchTaken, InvalidRequest, NotYours, RunNotFound, ThreadNotFound
from peerd.store import ownership, receipts
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.store.threads.rows import (
    RUN_VIEWS,
    THREAD_WITH_LATEST,
    Idempotency,
    NewThread,
    add_event,
    fetch_must,
    fetch_one,
    item_from_row,
    run_from_row,
    thread_from_joined,
    view_from_row,
)

# Asked inside a launch's or send's transaction before anything is written; raises to refuse.
Admit = Callable[[Tx], Awaitable[None]]


async def insert_item(
    tx: Tx,
    thread_id: str,
    run_id: str,
    kind: str,
    text: str,
    data: dict[str, Any],
    now: float,
) -> aiosqlite.Row:
    row = await fetch_one(tx, "SELECT next_position FROM threads WHERE id = ?", (thread_id,))
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
    await add_event(
        tx,
        thread_id,
        "item.added",
        {"itemId": item_id, "runId": run_id, "kind": kind, "position": position},
        now,
    )
    return await fetch_must(tx, "SELECT * FROM items WHERE id = ?", (item_id,))


async def insert_run(tx: Tx, thread_id: str, prompt: str, now: float, *, origin: str = "user") -> str:
    """A queued run and its user message, inside the caller's transaction."""
    return await new_run(tx, thread_id, prompt, now, origin=origin)


async def event(tx: Tx, thread_id: str, type_: str, data: dict[str, Any], now: float) -> None:
    await add_event(tx, thread_id, type_, data, now)


async def new_run(
    tx: Tx,
    thread_id: str,
    prompt: str,
    now: float,
    *,
    origin: str = "user",
    continues: str | None = None,
) -> str:
    row = await fetch_one(
        tx, "SELECT coalesce(max(number), 0) AS n FROM runs WHERE thread_id = ?", (thread_id,)
    )
    number = int(row["n"]) + 1 if row else 1
    run_id = new_id("run")
    await tx.execute(
        "INSERT INTO runs (id, thread_id, number, status, prompt, created_at, origin, continues)"
        " VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)",
        (run_id, thread_id, number, prompt, now, origin, continues),
    )
    await add_event(
        tx, thread_id, "run.updated", {"runId": run_id, "status": "queued", "number": number}, now
    )
    await insert_item(tx, thread_id, run_id, "user_message", prompt, {}, now)
    return run_id


async def launch(
    db: Database,
    *,
    key: Idempotency,
    spec: NewThread,
    prompt: str,
    now: float,
    branch_exists: Callable[[str], Awaitable[bool]] | None = None,
    admit: Admit | None = None,
) -> tuple[dict[str, Any], bool]:
    """Create a thread with its first (queued) run; a retried key returns the first result.

    `admit` (a link's ceilings) is asked in the same transaction, after a retry was answered: a
    retried launch is never refused for what its own first copy spent, and two launches at once
    cannot both pass a ceiling with room for one.

    A branch belongs to the thread that created it: a new thread's branch must not be another
    thread's (checked in this transaction) nor exist in the repository yet (`branch_exists`, asked
    before the transaction: a git process never runs while the store's one writer is held). A
    branch named after the new thread (`{thread}` in it, the default `peerd/{thread}`) is new by
    construction: the thread's id is 80 fresh random bits, so neither check runs for it."""
    named = spec.branch is not None and "{thread}" not in spec.branch
    in_repo = bool(named and branch_exists is not None and spec.branch and await branch_exists(spec.branch))
    async with db.write() as tx:
        if key.command_id is not None:
            found = await receipts.find(tx, key.namespace, "thread_launch", key.command_id)
            first = replay(found, request_hash=key.request_hash)
            if first is not None:
                return first, True
        if admit is not None:
            await admit(tx)
        thread_id = new_id("thr")
        worktree_path = spec.worktree_path.replace("{thread}", thread_id)
        branch = spec.branch.replace("{thread}", thread_id) if spec.branch else None
        if named and branch is not None:
            cur = await tx.execute(
                "SELECT id FROM threads WHERE project_id = ? AND branch = ? LIMIT 1",
                (spec.project_id, branch),
            )
            owner = await cur.fetchone()
            if owner is not None or in_repo:
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
        if not spec.in_place:
            await _claim_thread_state(tx, spec, thread_id, branch, worktree_path, now)
        await add_event(tx, thread_id, "thread.created", {"threadId": thread_id}, now)
        run_id = await new_run(tx, thread_id, prompt, now)
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


async def _claim_thread_state(
    tx: Tx, spec: NewThread, thread_id: str, branch: str | None, worktree_path: str, now: float
) -> None:
    """The ledger's records of a new thread's branch and worktree (`store/ownership.py`), in the
    launch's transaction, before git makes either: the thread's owner (its link, its
    orchestration, or the person) owns them."""
    owner = owner_of_thread(spec.link_origin, spec.started_by)
    try:
        if branch:
            await ownership.claim(
                tx,
                project_id=spec.project_id,
                holding="ref",
                name=f"refs/heads/{branch}",
                owner=owner,
                purpose="thread-branch",
                thread_id=thread_id,
                now=now,
            )
        await ownership.claim(
            tx,
            project_id=spec.project_id,
            holding="worktree",
            name=worktree_path,
            owner=owner,
            purpose="thread-worktree",
            thread_id=thread_id,
            now=now,
        )
    except NotYours as taken:
        raise BranchTaken(
            f"{taken.message} A new thread gets a branch and a worktree of its own: omit branch "
            "(peerd names one) or choose a new name."
        ) from None


async def send(
    db: Database,
    *,
    key: Idempotency,
    thread_id: str,
    text: str,
    now: float,
    admit: Admit | None = None,
) -> tuple[dict[str, Any], bool]:
    """Queue a new run on the thread. A new message from its owner also releases a held queue.
    `admit` as for `launch`: after a retry was answered, in the same transaction."""
    async with db.write() as tx:
        if key.command_id is not None:
            found = await receipts.find(tx, key.namespace, f"thread_send:{thread_id}", key.command_id)
            first = replay(found, request_hash=key.request_hash)
            if first is not None:
                return first, True
        if admit is not None:
            await admit(tx)
        row = await fetch_one(tx, "SELECT status FROM threads WHERE id = ?", (thread_id,))
        if row is None:
            raise ThreadNotFound(f"Thread {thread_id} was not found.")
        if row["status"] == "archived":
            raise InvalidRequest(f"Thread {thread_id} is archived; launch a new thread instead.")
        await tx.execute("UPDATE threads SET queue_held = 0 WHERE id = ?", (thread_id,))
        run_id = await new_run(tx, thread_id, text, now)
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
    notice_item: tuple[str, str] | None = None,
) -> Run:
    """Move a run to `new` (checked by the core rules); optionally record with it an error item, or
    a notice item (`(code, text)`: an interrupt's, so the conversation shows where the run stopped)."""
    async with db.write() as tx:
        updated = await _transition(
            tx,
            run_id,
            new,
            now=now,
            reason=reason,
            exit_code=exit_code,
            pgid=pgid,
            token_hash=token_hash,
            error_item=error_item,
            notice_item=notice_item,
        )
    return run_from_row(updated)


async def start_next(
    db: Database, thread_id: str, *, now: float, token_hash: str
) -> tuple[Thread, str] | None:
    """The thread's next queued run moved to `starting` (the core's `next_to_start` decides), with
    the thread as it is then; None when nothing may start. One transaction, so the choice and the
    move see the same runs."""
    async with db.write() as tx:
        row = await fetch_one(tx, f"{THREAD_WITH_LATEST} WHERE t.id = ?", (thread_id,))
        if row is None:
            raise ThreadNotFound(f"Thread {thread_id} was not found.")
        thread = thread_from_joined(row)
        cur = await tx.execute(RUN_VIEWS, (thread_id,))
        views = [view_from_row(r) for r in await cur.fetchall()]
        run_id = next_to_start(views, queue_held=thread.queue_held, archived=thread.status == "archived")
        if run_id is None:
            return None
        await _transition(tx, run_id, "starting", now=now, token_hash=token_hash)
    return thread, run_id


async def _transition(
    tx: Tx,
    run_id: str,
    new: RunStatus,
    *,
    now: float,
    reason: str | None = None,
    exit_code: int | None = None,
    pgid: int | None = None,
    token_hash: str | None = None,
    error_item: str | None = None,
    notice_item: tuple[str, str] | None = None,
) -> aiosqlite.Row:
    row = await fetch_one(tx, "SELECT * FROM runs WHERE id = ?", (run_id,))
    if row is None:
        raise RunNotFound(f"Run {run_id} was not found.")
    check_transition(row["status"], new)
    # A wall clock stepped back never makes a run end before it began (issue 26, case 9).
    started = max(now, row["created_at"]) if new == "starting" else row["started_at"]
    ended = max(now, started or row["created_at"]) if is_terminal(new) else None
    await tx.execute(
        "UPDATE runs SET status = ?, reason = coalesce(?, reason), exit_code = coalesce(?, exit_code),"
        " pgid = coalesce(?, pgid), token_hash = CASE WHEN ? THEN NULL ELSE coalesce(?, token_hash) END,"
        " started_at = ?, ended_at = ? WHERE id = ?",
        (new, reason, exit_code, pgid, is_terminal(new), token_hash, started, ended, run_id),
    )
    if error_item:
        await insert_item(tx, row["thread_id"], run_id, "error", error_item, {}, now)
    if notice_item is not None:
        code, text = notice_item
        await insert_item(tx, row["thread_id"], run_id, "notice", text, {"code": code}, now)
    await add_event(
        tx, row["thread_id"], "run.updated", {"runId": run_id, "status": new, "reason": reason}, now
    )
    return await fetch_must(tx, "SELECT * FROM runs WHERE id = ?", (run_id,))


async def add_item(
    db: Database, *, thread_id: str, run_id: str, kind: str, text: str, data: dict[str, Any], now: float
) -> Item:
    async with db.write() as tx:
        row = await insert_item(tx, thread_id, run_id, kind, text, data, now)
    return item_from_row(row)


async def set_provider_session(db: Database, thread_id: str, session: str, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE threads SET provider_session = ?, updated_at = ? WHERE id = ?", (session, now, thread_id)
        )
        await add_event(tx, thread_id, "thread.updated", {"providerSession": session}, now)


async def set_queue_held(db: Database, thread_id: str, held: bool, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "UPDATE threads SET queue_held = ?, updated_at = ? WHERE id = ?", (int(held), now, thread_id)
        )
        await add_event(tx, thread_id, "thread.updated", {"queueHeld": held}, now)


async def archive(db: Database, thread_id: str, *, now: float) -> None:
    """Archive the thread; its queued runs will never start, so they end cancelled."""
    async with db.write() as tx:
        async with tx.execute(
            "SELECT id FROM runs WHERE thread_id = ? AND status = 'queued'", (thread_id,)
        ) as cur:
            queued = [r["id"] for r in await cur.fetchall()]
        for run_id in queued:
            await tx.execute(
                "UPDATE runs SET status = 'cancelled', reason = 'The thread was archived.',"
                " ended_at = max(?, created_at) WHERE id = ?",
                (now, run_id),
            )
            await add_event(tx, thread_id, "run.updated", {"runId": run_id, "status": "cancelled"}, now)
        await tx.execute(
            "UPDATE threads SET status = 'archived', queue_held = 1, updated_at = ? WHERE id = ?",
            (now, thread_id),
        )
        await add_event(tx, thread_id, "thread.updated", {"status": "archived"}, now)
