"""Waits on a pull request, the I/O shell (`machine.py` holds the rules): record, watch, deliver.

`wait_for` records the wait (`store.record`) and answers: the tool call returns only once the wait
is committed, so it is recorded before the asking turn ends; the agent ends its turn and no turn
is spent while it waits. One watcher task per open wait polls `gh` (`gh.py:poll`) on the daemon's
clock, feeds the machine what it saw, stores each poll and its backoff, and on `Deliver` commits
the delivery (the wait's end and its wake run, one transaction fenced by the watcher's claim)
before it starts the wake (`kick`); a crash after the commit leaves a queued wake run, started at
the next start-up by `RunManager.kick_all`. At start-up `start` resumes every open wait, each
waiting at most its stored backoff. A thread's Stop or archive (`ThreadStopped`) cancels its
waits (`cancel_for_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from peerd.core.clock import Clock
from peerd.core.idempotency import request_hash
from peerd.errors import InvalidRequest, ParentNotActive, PeerdError, ProjectNotFound, WaitNotFound
from peerd.operations import Caller
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.gh import run_gh
from peerd.store import projects, threads
from peerd.store.db import Database
from peerd.waits import gh as ghio
from peerd.waits import store
from peerd.waits.machine import (
    Deliver,
    Event,
    NextPoll,
    Polled,
    PollFailed,
    Snapshot,
    Watch,
    first_delay,
    scope_pr,
    step,
    wake_text,
)
from peerd.waits.pace import GhPace
from peerd.waits.store import WaitRow
from peerd.waits.wire import WaitCheck, WaitFor, WaitInfo, WaitList, WaitPage

log = structlog.get_logger(__name__)

POLL_S = 30.0  # `[waits] poll_seconds`: how often an open wait asks GitHub
STORE_RETRY_S = 5.0  # a poll whose store write failed is tried again after this


def info(row: WaitRow) -> WaitInfo:
    seen = row.seen or {}
    pr = seen.get("pr") or {}
    return WaitInfo(
        wait_id=row.id,
        status=row.status,
        thread_id=row.thread_id,
        pr=row.pr,
        until=row.until,
        outcome=row.outcome,
        detail=row.detail,
        pr_url=pr.get("url") or None,
        pr_state=pr.get("state") or None,
        review_decision=pr.get("review_decision") or None,
        checks=[
            WaitCheck(name=c["name"], state=c["state"], bucket=c["bucket"], link=c.get("link") or None)
            for c in seen.get("checks") or []
        ],
        polls=row.polls,
        last_error=row.last_error,
        next_poll_at=row.next_at if row.status == "watching" else None,
        woken_run_id=row.woken_run_id,
        deadline_at=row.deadline_at,
        created_at=row.created_at,
        ended_at=row.ended_at,
    )


class Waits:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        *,
        kick: Callable[[str], Awaitable[None]],
        clock: Clock,
        poll_s: float = POLL_S,
        gh: ghio.GhRunner = run_gh,
        draw: Callable[[], float] = random.random,
        pace: GhPace | None = None,
    ) -> None:
        self.db = db
        self.feed = feed
        self.kick = kick
        self.clock = clock
        self.poll_s = poll_s
        self.gh = gh
        self.draw = draw
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        # One gh login answers every wait here (and every orchestration waiting on its pull
        # request): a rate limit one hit pauses them all, not only the wait that asked.
        self.pace = pace or GhPace(clock)

    # --- the operations (agent tools, owner API) ----------------------------------------------------

    async def wait_for(self, caller: Caller, req: WaitFor) -> WaitInfo:
        if caller.run_id is None or caller.thread_id is None:
            raise ParentNotActive(
                "wait_for_github wakes the run that asked, and this agent was not started by peerd: "
                "poll `gh pr checks` yourself instead."
            )
        thread = await threads.get_thread(self.db, caller.thread_id)
        project = await projects.get(self.db, thread.project_id)
        try:
            pr, _ = scope_pr(req.pr, project.repository_key)
        except ValueError as exc:
            raise InvalidRequest(f"{exc}.") from None
        now = self.clock()
        body = req.model_dump(mode="json", by_alias=True, exclude={"client_request_id"})
        row, _ = await store.record(
            self.db,
            store.NewWait(
                thread_id=thread.id,
                run_id=caller.run_id,
                project_id=thread.project_id,
                namespace=caller.namespace,
                request_key=req.client_request_id,
                request_hash=request_hash("wait_for_github", body),
                pr=pr,
                until=req.until,
                deadline_at=now + req.timeout_hours * 3600.0,
            ),
            now=now,
        )
        log.info("wait.recorded", wait_id=row.id, thread_id=row.thread_id, until=row.until)
        self._ensure(row.id)
        return info(row)

    async def listing(self, caller: Caller, req: WaitList) -> WaitPage:
        thread_id = req.thread_id if caller.thread_id is None else caller.thread_id
        rows = await store.listing(self.db, thread_id=thread_id, statuses=list(req.status), limit=req.limit)
        return WaitPage(items=[info(r) for r in rows])

    async def show(self, caller: Caller, wait_id: str) -> WaitInfo:
        return info(await self._own(caller, wait_id))

    async def cancel(self, caller: Caller, wait_id: str, reason: str | None) -> WaitInfo:
        row = await self._own(caller, wait_id)
        why = reason or (
            "cancelled by its agent" if caller.thread_id is not None else "cancelled by the owner"
        )
        ended = await store.cancel(self.db, row.id, why, now=self.clock())
        if ended is None:
            return info(await store.get(self.db, row.id))  # it had ended: returned as it ended
        self._drop(row.id)
        self.feed.changed(row.thread_id)
        log.info("wait.cancelled", wait_id=row.id)
        return info(ended)

    async def cancel_for_thread(self, thread_id: str, reason: str | None) -> None:
        """The thread was stopped or archived: its waits end with it (nobody to wake)."""
        why = f"its thread was stopped or archived{f': {reason}' if reason else ''}"
        for wait_id in await store.open_for_thread(self.db, thread_id):
            if await store.cancel(self.db, wait_id, why, now=self.clock()) is not None:
                self._drop(wait_id)
                log.info("wait.cancelled", wait_id=wait_id, reason="thread_stopped")
        self.feed.changed(thread_id)

    async def _own(self, caller: Caller, wait_id: str) -> WaitRow:
        row = await store.get(self.db, wait_id)
        if caller.thread_id is not None and row.thread_id != caller.thread_id:
            raise WaitNotFound(f"Wait {wait_id} was not found among this thread's waits (list_waits).")
        return row

    # --- watching -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """At start-up: every open wait is watched again."""
        for wait_id in await store.open_ids(self.db):
            self._ensure(wait_id)

    async def stop(self) -> None:
        self._closing = True
        tasks = list(self._watchers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watchers.clear()

    def watching(self) -> set[str]:
        """The waits a watcher of this daemon drives (what the sweep counts as owned)."""
        return {wait_id for wait_id, task in self._watchers.items() if not task.done()}

    def _ensure(self, wait_id: str) -> None:
        if self._closing or (wait_id in self._watchers and not self._watchers[wait_id].done()):
            return
        task = asyncio.create_task(self._watch(wait_id), name=f"peerd.wait.{wait_id}")
        self._watchers[wait_id] = task
        task.add_done_callback(
            lambda t: self._watchers.pop(wait_id, None) if self._watchers.get(wait_id) is t else None
        )

    def _drop(self, wait_id: str) -> None:
        task = self._watchers.pop(wait_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _watch(self, wait_id: str) -> None:
        while True:
            try:
                await self._drive(wait_id)
                return
            except asyncio.CancelledError:
                raise
            except PeerdError as exc:  # the store failing: the wait stays owed, tried again
                log.warning("wait.retry", wait_id=wait_id, code=exc.code)
            except Exception:
                log.exception("wait.crashed", wait_id=wait_id)
            await self.clock.sleep(STORE_RETRY_S)

    async def _drive(self, wait_id: str) -> None:
        """Watch one wait until it is delivered or cancelled (or this watcher loses its claim)."""
        token = await store.claim(self.db, wait_id, now=self.clock())
        if token is None:
            return  # ended meanwhile
        row = await store.get(self.db, wait_id)
        try:
            project = await projects.get(self.db, row.project_id)
        except ProjectNotFound:  # removed with its threads: nobody is left to wake
            await store.cancel(self.db, wait_id, "its project was removed from peerd", now=self.clock())
            log.info("wait.cancelled", wait_id=wait_id, reason="project_removed")
            return
        repo = Path(project.path)
        _, slug = scope_pr(row.pr, project.repository_key)
        watch = row.watch()
        delay = first_delay(
            delay_s=row.delay_s, next_at=row.next_at, wall_now=self.clock(), poll_s=self.poll_s
        )
        self.pace.join(wait_id)
        try:
            await self._poll(wait_id, token, row, watch, delay, repo, slug)
        finally:
            self.pace.leave(wait_id)

    async def _poll(
        self, wait_id: str, token: str, row: WaitRow, watch: Watch, delay: float, repo: Path, slug: str | None
    ) -> None:
        while True:
            await self.clock.sleep(delay)
            await self.pace.ready()
            seen = await ghio.poll(repo, row.pr, slug, gh=self.gh)
            now = self.clock()
            event: Event = (
                Polled(seen, now) if isinstance(seen, Snapshot) else PollFailed(seen.kind, seen.detail, now)
            )
            interval = self.pace.interval(self.poll_s)
            watch, actions = step(watch, event, poll_s=interval, draw=self.draw())
            snapshot = seen if isinstance(seen, Snapshot) else None
            for action in actions:
                if isinstance(action, NextPoll):
                    error = event.detail if isinstance(event, PollFailed) else None
                    if not await store.polled(
                        self.db,
                        wait_id,
                        token,
                        watch,
                        snapshot=snapshot,
                        error=error,
                        delay_s=action.delay,
                        now=now,
                    ):
                        return  # cancelled, or another watcher holds it now
                    if isinstance(event, PollFailed):
                        log.info(
                            "wait.backoff", wait_id=wait_id, kind=event.kind, delay_s=round(action.delay, 1)
                        )
                        if event.kind == "rate_limited":  # the same gh login: every wait pauses
                            self.pace.rate_limited(action.delay)
                    delay = action.delay
                elif isinstance(action, Deliver):
                    await self._deliver(row, token, action, snapshot, repo, slug)
                    return

    async def _deliver(
        self,
        row: WaitRow,
        token: str,
        action: Deliver,
        snapshot: Snapshot | None,
        repo: Path,
        slug: str | None,
    ) -> None:
        tail = ""
        if action.outcome == "failed" and snapshot is not None:
            tail = await ghio.failing_log_tail(repo, snapshot, slug, gh=self.gh)
        text = wake_text(row.id, row.pr, row.until, action.outcome, action.detail, snapshot, tail)
        ended = await store.deliver(
            self.db, row.id, token, action.outcome, action.detail, text, snapshot=snapshot, now=self.clock()
        )
        if ended is None:
            return  # ended already, or fenced off: nobody is woken twice
        log.info("wait.delivered", wait_id=row.id, outcome=action.outcome, woken_run_id=ended.woken_run_id)
        self.feed.changed(row.thread_id)
        if ended.woken_run_id is not None:
            await self.kick(row.thread_id)  # committed first: a crash here leaves it queued (kick_all)


__all__ = ["Waits", "info"]
