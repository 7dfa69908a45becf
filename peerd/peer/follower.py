"""The follower: one per link, it drives every open remote task on that link to its end.

Each pass, for the link's open tasks: re-send launches the box has not answered (same key, so the
same launch), deliver owed stops, then watch all running tasks with ONE batched long-poll of at
most 50 s (`POST /v1/watch`), so idle traffic is one request per link, not per task. New work
(a new task, a cancel) interrupts the watch at once.

Failures: an unreachable box backs off 2 s, 4 s ... up to 5 minutes, without an attempt limit; the
attempt count and the next try time are stored, so the backoff survives restarts. A terminal
failure of the link (revoked, expired, forgotten here) ends every open task of that link with
the reason; a thread or run gone there ends that task. At start-up every link with open work
(unfinished tasks, owed stops) gets its follower again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import structlog

from peerd import contracts as c
from peerd.core.tasks import backoff_delay, task_status_from_run
from peerd.delegation import Delegation
from peerd.errors import PeerdError
from peerd.peer.client import is_transient
from peerd.store import tasks
from peerd.store.db import Database
from peerd.store.tasks import TaskRow

log = structlog.get_logger(__name__)

WATCH_CHUNK_S = 50.0
WATCH_BATCH = 1000
NO_RUN = "The thread in the linked environment has no run to follow."


class FollowerPool:
    def __init__(
        self,
        db: Database,
        delegation: Delegation,
        *,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = random.random,
        watch_chunk_s: float = WATCH_CHUNK_S,
    ) -> None:
        self.db = db
        self.delegation = delegation
        self.clock = clock
        self.jitter = jitter
        self.watch_chunk_s = watch_chunk_s
        self._followers: dict[str, Follower] = {}
        self._closing = False
        delegation.followers = self

    def notify(self, env_id: str) -> None:
        """New work on this link: start its follower, or interrupt its current wait."""
        if self._closing:
            return
        follower = self._followers.get(env_id)
        if follower is None or follower.done:
            follower = Follower(self, env_id)
            self._followers[env_id] = follower
            follower.start()
        follower.poke()

    async def start(self) -> None:
        """Resume every open remote task (and every owed stop) after a restart."""
        for env_id in await tasks.envs_with_open_tasks(self.db):
            self.notify(env_id)

    async def close(self) -> None:
        self._closing = True
        for follower in list(self._followers.values()):
            await follower.stop()
        self._followers.clear()


class Follower:
    def __init__(self, pool: FollowerPool, env_id: str) -> None:
        self.pool = pool
        self.env_id = env_id
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.requests = 0  # watch requests sent: idle traffic is measured by this

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"follower:{self.env_id}")

    def poke(self) -> None:
        self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once for new work."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout=max(seconds, 0))

    async def _run(self) -> None:
        db = self.pool.db
        while True:
            self._wakeup.clear()
            open_tasks = await tasks.open_for_env(db, self.env_id)
            if not open_tasks:
                return  # nothing to follow: `notify` starts a new follower for new work
            attempts, next_at = await tasks.backoff(db, self.env_id)
            if next_at > self.pool.clock():
                await self._sleep(next_at - self.pool.clock())
                continue
            try:
                await self._pass(open_tasks)
            except PeerdError as exc:
                if is_transient(exc):
                    attempts += 1
                    delay = backoff_delay(attempts, self.pool.jitter())
                    log.info(
                        "follower.backoff", env_id=self.env_id, attempts=attempts, delay_s=round(delay, 1)
                    )
                    await tasks.set_backoff(
                        db,
                        self.env_id,
                        attempts=attempts,
                        next_at=self.pool.clock() + delay,
                        error=exc.message,
                    )
                    for task in open_tasks:
                        await tasks.set_error(db, task.id, exc.message, now=self.pool.clock())
                    continue
                await self._fail_link(open_tasks, exc)
                continue
            except Exception:
                log.exception("follower.crashed", env_id=self.env_id)
                await tasks.set_backoff(
                    db,
                    self.env_id,
                    attempts=attempts + 1,
                    next_at=self.pool.clock() + 5,
                    error="internal error",
                )
                continue
            if attempts:
                await tasks.set_backoff(db, self.env_id, attempts=0, next_at=0, error=None)

    async def _fail_link(self, open_tasks: list[TaskRow], exc: PeerdError) -> None:
        """The link itself refuses us (revoked, expired, forgotten): end its tasks with the reason."""
        delegation = self.pool.delegation
        log.info("follower.link_failed", env_id=self.env_id, code=exc.code)
        for task in open_tasks:
            if not task.terminal:
                await delegation.end(task.id, "failed", exc.message)
            if task.stop_owed:  # nothing can be stopped through a dead link; say so and stop trying
                await tasks.set_stop(self.pool.db, task.id, owed=False, reason=None, now=self.pool.clock())
                await tasks.set_error(
                    self.pool.db,
                    task.id,
                    f"The stop could not be delivered: {exc.message}",
                    now=self.pool.clock(),
                )

    async def _pass(self, open_tasks: list[TaskRow]) -> None:
        delegation = self.pool.delegation
        for task in open_tasks:
            if task.child_thread_id is None:
                await self._task_call(task, delegation.launch_remote(task, transient="raise"))
        for task in await tasks.open_for_env(self.pool.db, self.env_id):
            if task.stop_owed and task.child_thread_id is not None:
                await self._task_call(task, delegation.deliver_stop(task, transient="raise"))
        running = [
            t
            for t in await tasks.open_for_env(self.pool.db, self.env_id)
            if t.status == "running" and t.child_thread_id and t.child_run_id and not t.stop_owed
        ]
        # One long-poll per 1,000 runs (the watch request's cap); normally that is one request.
        batches = [running[i : i + WATCH_BATCH] for i in range(0, len(running), WATCH_BATCH)]
        if batches:
            await asyncio.gather(*(self._watch(batch) for batch in batches))

    async def _task_call(self, task: TaskRow, call: Any) -> None:
        """A per-task step: a terminal refusal about this task ends it; link-wide failures propagate."""
        try:
            await call
        except PeerdError as exc:
            if is_transient(exc) or exc.code == "capability_denied" or "not linked" in exc.message:
                raise
            await self.pool.delegation.end(task.id, "failed", exc.message)

    async def _watch(self, running: list[TaskRow]) -> None:
        delegation = self.pool.delegation
        body = {
            "runs": [{"threadId": t.child_thread_id, "runId": t.child_run_id} for t in running],
            "timeout": self.pool.watch_chunk_s,
        }
        self.requests += 1
        request = asyncio.ensure_future(
            delegation.forwarder.call(self.env_id, "POST", "/v1/watch", body=body)
        )
        woken = asyncio.ensure_future(self._wakeup.wait())
        try:
            await asyncio.wait([request, woken], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            request.cancel()  # the follower is stopping: the long-poll must not outlive it unowned
            raise
        finally:
            woken.cancel()
        if not request.done():
            request.cancel()  # new work: go round again; the box cancels the abandoned long-poll
            with contextlib.suppress(asyncio.CancelledError, PeerdError):
                await request
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise asyncio.CancelledError  # a stop that landed meanwhile is ours, not the poll's
            return
        result = c.RunWatchResult.model_validate(request.result())
        by_run = {t.child_run_id: t for t in running}
        for watched in result.runs:
            task = by_run.get(watched.run_id)
            if task is None:
                continue
            if not watched.found:
                label = task.target_label or self.env_id
                await delegation.end(
                    task.id, "failed", f"The thread in {label} was not found; it may have been removed."
                )
            elif watched.settled:
                await self._task_call(task, self._settle(task, watched))

    async def _settle(self, task: TaskRow, watched: c.WatchedRun) -> None:
        result = await self._result(task, watched)
        await self.pool.delegation.end(task.id, task_status_from_run(watched.status or ""), result)

    async def _result(self, task: TaskRow, watched: c.WatchedRun) -> str:
        """The settled run's last reply, read whole (paged, long text by itemId + textOffset)."""
        forwarder = self.pool.delegation.forwarder
        path = f"/v1/threads/{task.child_thread_id}/items"
        reply: dict[str, Any] | None = None
        after: int | None = None
        while True:
            params: dict[str, Any] = {"runId": watched.result_run_id, "limit": 100}
            if after is not None:
                params["afterPosition"] = after
            page = await forwarder.call(self.env_id, "GET", path, params=params)
            for item in page["items"]:
                if item["kind"] == "assistant_message":
                    reply = item
            if not page["hasMore"]:
                break
            after = page["nextPosition"]
        text = None
        if reply is not None:
            text, part = reply["text"], reply
            while part["textTruncated"]:
                more = await forwarder.call(
                    self.env_id,
                    "GET",
                    path,
                    params={"itemId": reply["id"], "textOffset": part["nextTextOffset"]},
                )
                part = more["items"][0]
                text += part["text"]
        if watched.status == "failed":
            return watched.reason or text or "The run in the linked environment failed."
        return text or watched.reason or "(The thread in the linked environment ended without a reply.)"
