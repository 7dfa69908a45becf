"""How the daemon gives each run at `approval-required` its gate, and how an owed decision gets a
run to land in (the store side of `ApprovalService.continue_thread`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from peerd.approvals.notify import Notifier
from peerd.approvals.service import ApprovalService, RunContext
from peerd.config import ApprovalsConfig
from peerd.contracts import Thread
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.gate import ApprovalGate
from peerd.store.db import Database
from peerd.store.threads.writes import new_run
from peerd.tasks import store as tasks_store

LIVE_OR_QUEUED = ("queued", "starting", "running")


def build(
    db: Database,
    feed: ChangeFeed,
    settings: ApprovalsConfig,
    *,
    environment: str,
    kick: Callable[[str], Awaitable[None]],
    clock: Callable[[], float] = time.time,
) -> ApprovalService:
    async def continue_thread(thread_id: str, asked_in: str, prompt: str) -> bool:
        queued = await queue_continuation(db, thread_id, asked_in, prompt, now=clock())
        if queued:
            await kick(thread_id)
        return queued

    return ApprovalService(
        db,
        feed,
        clock=clock,
        deadline_s=settings.deadline_minutes * 60.0,
        link_policy=settings.policy_for,
        notifier=Notifier(
            environment=environment, desktop=settings.desktop, webhook_url=settings.webhook_url
        ),
        continue_thread=continue_thread,
    )


async def queue_continuation(db: Database, thread_id: str, asked_in: str, prompt: str, *, now: float) -> bool:
    """A run on the thread for an owed decision, unless one is queued or live there already (it
    will ask again and inherit the decision), the thread went on since the run that asked
    (`asked_in` is no longer its latest run: the question is stale), or the thread is archived or
    held by a stop."""
    async with db.write() as tx:
        async with tx.execute("SELECT status, queue_held FROM threads WHERE id = ?", (thread_id,)) as cur:
            thread = await cur.fetchone()
        if thread is None or thread["status"] == "archived" or thread["queue_held"]:
            return False
        marks = ", ".join("?" * len(LIVE_OR_QUEUED))
        async with tx.execute(
            f"SELECT 1 FROM runs WHERE thread_id = ? AND status IN ({marks}) LIMIT 1",  # noqa: S608
            (thread_id, *LIVE_OR_QUEUED),
        ) as cur:
            if await cur.fetchone() is not None:
                return False
        async with tx.execute(
            "SELECT id FROM runs WHERE thread_id = ? ORDER BY number DESC LIMIT 1", (thread_id,)
        ) as cur:
            latest = await cur.fetchone()
        if latest is None or latest["id"] != asked_in:
            return False
        await new_run(tx, thread_id, prompt, now, origin="continue")
        return True


def gates(service: ApprovalService, db: Database) -> Callable[[Thread, str], Awaitable[ApprovalGate | None]]:
    """The run manager's hook: the gate for a run of `thread` (only asked at approval-required)."""

    async def gate_for(thread: Thread, run_id: str) -> ApprovalGate | None:
        parent_task = None
        open_tasks = await tasks_store.open_local(db, child_thread_id=thread.id)
        if open_tasks:
            parent_task = open_tasks[0]
        context = RunContext(
            run_id=run_id,
            thread_id=thread.id,
            link_origin=thread.link_origin,
            link_label=thread.link_label,
            parent_task_id=None if parent_task is None else parent_task.id,
            parent_thread_id=None if parent_task is None else parent_task.parent_thread_id,
        )
        return service.gate_for(context)

    return gate_for
