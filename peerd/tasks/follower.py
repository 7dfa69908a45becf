"""The follower, the I/O shell: one per link, it drives every open remote task on that link to its
end, as the pure `FollowerMachine` (`peerd.tasks.machine`) decides.

Each turn reads the link's open tasks, asks the machine for the next step and performs it:
re-send launches the box has not answered, deliver owed stops, or watch all running tasks with
ONE batched long-poll (`POST /v1/watch`, one request per link per chunk, whatever the number of
tasks). New work (a new task, a cancel) interrupts the watch at once.

What the machine is told: every answer from the box (the peer client's `on_answer` hook, so a
forwarded call, a launch, a refresh or a probe ends a backoff at once and wakes a follower that
was sleeping it out), a failed call's typed code, a watch left unanswered past its deadline (a
black hole), and this daemon's store failing. No failure stops a follower: a store fault anywhere,
its own error handling included, is retried with backoff; a bug is logged and retried in 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from peerd import contracts as c
from peerd.errors import PeerdError
from peerd.store.db import Database
from peerd.tasks import store as tasks
from peerd.tasks.delegation import Delegation
from peerd.tasks.machine import (
    Action,
    CheckLink,
    DeliverStops,
    DropStop,
    EndTask,
    Exit,
    FollowerMachine,
    NoteError,
    OpenTask,
    ReadResult,
    Relaunch,
    RunReport,
    SaveBackoff,
    Sleep,
    Watch,
    WatchRef,
)
from peerd.tasks.rules import classify, is_store_fault
from peerd.tasks.store import TaskRow
from peerd.tasks.timing import Clock

log = structlog.get_logger(__name__)

WATCH_CHUNK_S = 50.0


def open_task(row: TaskRow) -> OpenTask:
    return OpenTask(
        id=row.id,
        status=row.status,
        child_thread_id=row.child_thread_id,
        child_run_id=row.child_run_id,
        stop_owed=row.stop_owed,
        label=row.target_label or row.target_env or "the linked environment",
    )


class FollowerPool:
    def __init__(
        self,
        db: Database,
        delegation: Delegation,
        *,
        clock: Clock | None = None,
        jitter: Callable[[], float] = random.random,
        watch_chunk_s: float = WATCH_CHUNK_S,
    ) -> None:
        self.db = db
        self.delegation = delegation
        self.clock = clock or Clock()
        self.jitter = jitter
        self.watch_chunk_s = watch_chunk_s
        self._followers: dict[str, Follower] = {}
        self._closing = False
        delegation.followers = self
        delegation.forwarder.peers.on_answer = self.answered  # any answer from a box ends its backoff

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

    def answered(self, env_id: str) -> None:
        """The box answered something: its follower's backoff is over (it is woken if sleeping)."""
        follower = self._followers.get(env_id)
        if follower is not None and not follower.done:
            follower.note_answered()

    async def start(self) -> None:
        """Resume every open remote task (and every owed stop) after a restart."""
        for env_id in await tasks.envs_with_open_tasks(self.db):
            self.notify(env_id)

    async def close(self) -> None:
        """Stop the followers and the delegation's store retries (what is owed is in the store)."""
        self._closing = True
        for follower in list(self._followers.values()):
            await follower.stop()
        self._followers.clear()
        await self.delegation.ender.retries.close()


class Follower:
    def __init__(self, pool: FollowerPool, env_id: str) -> None:
        self.pool = pool
        self.env_id = env_id
        self.machine = FollowerMachine(chunk_s=pool.watch_chunk_s, jitter=pool.jitter)
        self._wakeup = asyncio.Event()
        self._answered = False
        self._sleeping = False
        self._task: asyncio.Task[None] | None = None
        self.requests = 0  # watch requests sent: idle traffic is measured by this

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"follower:{self.env_id}")

    def poke(self) -> None:
        self._wakeup.set()

    def note_answered(self) -> None:
        self._answered = True
        if self._sleeping:  # a watch in flight is not cut short by the box answering
            self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        restored = False
        while True:
            try:
                if not restored:
                    self.machine.restore(*await tasks.backoff(self.pool.db, self.env_id))
                    restored = True
                if await self._turn():
                    return  # nothing to follow: `notify` starts a new follower for new work
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # nothing may end a follower but its link's work ending
                await self._trouble(exc)

    async def _turn(self) -> bool:
        """One step; True when the follower is done."""
        self._wakeup.clear()
        if self._answered:
            self._answered = False
            await self._do(self.machine.answered(self.pool.clock.now()))
        rows = await tasks.open_for_env(self.pool.db, self.env_id)
        self.machine.chunk_s = self.pool.watch_chunk_s
        actions = self.machine.plan(self.pool.clock.now(), [open_task(r) for r in rows])
        done = await self._do(actions)
        if not isinstance(actions[0], Sleep):
            self.machine.step_done()  # a step went through: the store works (again)
        return done

    async def _trouble(self, exc: Exception) -> None:
        """A step raised: a store fault waits with backoff (nothing is written: the store is what
        fails); anything else is a bug, logged and retried in 5 s. Never raises."""
        now = self.pool.clock.now()
        if is_store_fault(exc):
            log.warning("follower.store_failed", env_id=self.env_id, error=str(exc))
            self.machine.store_failed(now)
            return
        log.exception("follower.crashed", env_id=self.env_id)
        actions = self.machine.crashed(now)
        try:
            await self._do(actions)
        except asyncio.CancelledError:
            raise
        except Exception as again:
            if not is_store_fault(again):
                log.exception("follower.crashed_again", env_id=self.env_id)
            self.machine.store_failed(now)

    async def _do(self, actions: list[Action]) -> bool:
        """Perform actions, and the actions their outcomes lead to; True on Exit."""
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, Exit):
                if not self._wakeup.is_set():
                    return True
                continue  # new work arrived meanwhile: look again instead of leaving it unfollowed
            queue[0:0] = await self._perform(action)
        return False

    async def _perform(self, action: Action) -> list[Action]:
        db, delegation, now = self.pool.db, self.pool.delegation, self.pool.clock.now
        if isinstance(action, Sleep):
            return await self._sleep(action.until)
        if isinstance(action, Relaunch):
            return await self._each(
                action.task_ids, lambda t: t.child_thread_id is None, delegation.launch_remote
            )
        if isinstance(action, DeliverStops):
            return await self._each(
                action.task_ids,
                lambda t: t.stop_owed and t.child_thread_id is not None,
                delegation.deliver_stop,
            )
        if isinstance(action, Watch):
            return await self._watch(action)
        if isinstance(action, ReadResult):
            try:
                reply = await self._reply(action)
            except PeerdError as exc:
                if is_store_fault(exc):
                    raise
                return self.machine.failed(now(), exc.code, exc.message, task_id=action.task_id)
            return self.machine.result_read(action, reply)
        if isinstance(action, EndTask):
            await delegation.end(action.task_id, action.status, action.result)
        elif isinstance(action, DropStop):
            await tasks.set_stop(db, action.task_id, owed=False, reason=None, now=now())
            await tasks.set_error(db, action.task_id, action.error, now=now())
        elif isinstance(action, SaveBackoff):
            if action.attempts:
                log.info("follower.backoff", env_id=self.env_id, attempts=action.attempts)
            await tasks.set_backoff(
                db, self.env_id, attempts=action.attempts, next_at=action.next_at, error=action.error
            )
        elif isinstance(action, NoteError):
            for task_id in action.task_ids:
                await tasks.set_error(db, task_id, action.error, now=now())
        elif isinstance(action, CheckLink):
            try:
                await delegation.forwarder.peers.load_link(self.env_id)
            except PeerdError as exc:
                if is_store_fault(exc):
                    raise
                return self.machine.failed(now(), exc.code, exc.message)
        return []

    async def _sleep(self, until: float) -> list[Action]:
        self._sleeping = True
        try:
            await self.pool.clock.sleep(until - self.pool.clock.now(), self._wakeup)
        finally:
            self._sleeping = False
        if self._wakeup.is_set() and not self._answered:
            return self.machine.poked(self.pool.clock.now())
        return []

    async def _each(
        self,
        task_ids: tuple[str, ...],
        still: Callable[[TaskRow], bool],
        send: Callable[..., Awaitable[object]],
    ) -> list[Action]:
        """A per-task call for each task (re-read first): a refusal about one task ends it and the
        others go on; a transient or link-wide failure ends the step."""
        actions: list[Action] = []
        for task_id in task_ids:
            task = await tasks.get(self.pool.db, task_id)
            if not still(task):
                continue
            try:
                await send(task, for_follower=True)
            except PeerdError as exc:
                if is_store_fault(exc):
                    raise
                outcome = self.machine.failed(self.pool.clock.now(), exc.code, exc.message, task_id=task_id)
                if classify(exc.code) != "task":
                    return actions + outcome
                actions += outcome
        return actions

    async def _watch(self, action: Watch) -> list[Action]:
        self.requests += len(action.batches)
        delegation = self.pool.delegation

        async def one(batch: tuple[WatchRef, ...]) -> c.RunWatchResult:
            body = {
                "runs": [{"threadId": r.thread_id, "runId": r.run_id} for r in batch],
                "timeout": action.timeout,
            }
            data = await delegation.forwarder.call(self.env_id, "POST", "/v1/watch", body=body)
            return c.RunWatchResult.model_validate(data)

        request: asyncio.Future[list[c.RunWatchResult]] = asyncio.ensure_future(
            asyncio.gather(*(one(b) for b in action.batches))
        )
        woken: asyncio.Future[Any] = asyncio.ensure_future(self._wakeup.wait())
        wait_s = max(action.deadline - self.pool.clock.now(), 0.0)
        try:
            await asyncio.wait({request, woken}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            request.cancel()  # the follower is stopping: the long-poll must not outlive it unowned
            raise
        finally:
            woken.cancel()
        if not request.done():
            request.cancel()  # new work, or no answer in time; the box cancels the abandoned poll
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await request
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise asyncio.CancelledError  # a stop that landed meanwhile is ours, not the poll's
            if self._wakeup.is_set():
                return []  # new work: go round again at once
            return self.machine.overdue(max(self.pool.clock.now(), action.deadline))
        try:
            results = request.result()
        except PeerdError as exc:
            if is_store_fault(exc):
                raise
            return self.machine.failed(self.pool.clock.now(), exc.code, exc.message)
        reports = [
            RunReport(r.run_id, r.found, r.settled, r.status, r.reason, r.result_run_id)
            for result in results
            for r in result.runs
        ]
        refs = [ref for batch in action.batches for ref in batch]
        return self.machine.watched(self.pool.clock.now(), reports, refs)

    async def _reply(self, read: ReadResult) -> str | None:
        """The settled run's last reply, read whole (paged, long text by itemId + textOffset)."""
        forwarder = self.pool.delegation.forwarder
        path = f"/v1/threads/{read.thread_id}/items"
        reply: dict[str, Any] | None = None
        after: int | None = None
        while True:
            params: dict[str, Any] = {"runId": read.result_run_id, "limit": 100}
            if after is not None:
                params["afterPosition"] = after
            page = await forwarder.call(self.env_id, "GET", path, params=params)
            for item in page["items"]:
                if item["kind"] == "assistant_message":
                    reply = item
            if not page["hasMore"]:
                break
            after = page["nextPosition"]
        if reply is None:
            return None
        text, part = str(reply["text"]), reply
        while part["textTruncated"]:
            more = await forwarder.call(
                self.env_id, "GET", path, params={"itemId": reply["id"], "textOffset": part["nextTextOffset"]}
            )
            part = more["items"][0]
            text += part["text"]
        return text
