"""The follower, the I/O shell: one per link, it drives every open remote task on that link to its
end, as the pure `FollowerMachine` (`peerd.tasks.machine`) decides.

It reads the link's open tasks once when it starts (only the columns it needs) and keeps them in
the machine; afterwards it re-reads only a task it is told changed (`FollowerPool.notify(env,
task)`) or acted on. Each turn asks the machine for the next step and performs it: re-send
launches the box has not answered, deliver owed stops, tell the box which runs to follow (the
change feed's subscription: changes only, or a hash after a restart), and keep ONE long-poll per
link for changes after a cursor (`POST /v1/feed/changes`, one request per chunk whatever the
number of tasks). The poll runs beside the other steps: a new task joins the subscription with
a short request and the poll in flight is not restarted.

What the machine is told: every answer from the box (the peer client's `PeerAnswered` event, so a
forwarded call, a launch, a refresh or a probe ends a backoff at once and wakes a follower that
was sleeping it out), a failed call's typed code, a poll left unanswered past its deadline (a
black hole), and this daemon's store failing. No failure stops a follower: a store fault anywhere,
its own error handling included, is retried with backoff; a bug is logged and retried in 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from peerd.approvals import store as approvals_store
from peerd.approvals.service import ANY_KEY as APPROVALS_CHANGED
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.errors import PeerdError
from peerd.events import CapacityReported, Events, LinkForgotten, PeerAnswered, RemoteTaskChanged
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store
from peerd.tasks import feedstore
from peerd.tasks import store as tasks
from peerd.tasks.delegation import Delegation
from peerd.tasks.feedclient import feed_code, feed_message, poll_body, read_reply, subscription_body
from peerd.tasks.feedwire import CHANGES_PATH, SUBSCRIPTION_PATH, FeedChanges, FeedSubscribed
from peerd.tasks.machine import (
    Action,
    AwaitPoll,
    CheckLink,
    DeliverStops,
    DropStop,
    EndTask,
    Exit,
    FollowerMachine,
    NoteError,
    NoteQuiet,
    Poll,
    PollAnswer,
    ReadResult,
    Relaunch,
    RunReport,
    SaveBackoff,
    Sleep,
    StopPoll,
    Subscribe,
)
from peerd.tasks.rules import classify, is_store_fault
from peerd.tasks.store import TaskRow
from peerd.tasks.subscription import Delta
from peerd.tasks.watchfeed import FeedTransport

log = structlog.get_logger(__name__)

WATCH_CHUNK_S = 50.0


class FollowerPool:
    def __init__(
        self,
        db: Database,
        delegation: Delegation,
        *,
        clock: Clock | None = None,
        jitter: Callable[[], float] = random.random,
        watch_chunk_s: float = WATCH_CHUNK_S,
        events: Events | None = None,
    ) -> None:
        self.db = db
        self.delegation = delegation
        self.clock = clock or SYSTEM_CLOCK
        self.jitter = jitter
        self.watch_chunk_s = watch_chunk_s
        self._followers: dict[str, Follower] = {}
        self._closing = False
        self.feed = FeedTransport(db, delegation.forwarder)  # an older box: through its watch
        # `CapacityReported` goes out with each box's report a feed answer brings (placement).
        self.events = events or Events()

    # What the pool listens to (the daemon subscribes these: peerd/daemon.py:Daemon._subscribe).

    def task_changed(self, event: RemoteTaskChanged) -> None:
        self.notify(event.env_id, event.task_id)

    def link_forgotten(self, event: LinkForgotten) -> None:
        self.notify(event.env_id)  # its follower ends the link's open tasks now, not after a poll

    def peer_answered(self, event: PeerAnswered) -> None:
        self.answered(event.env_id)  # any answer from a box ends its backoff

    def notify(self, env_id: str, task_id: str | None = None) -> None:
        """New work on this link (this task changed, or, without one, the link itself): start its
        follower, or tell it; a poll in flight goes on."""
        if self._closing:
            return
        follower = self._followers.get(env_id)
        if follower is None or follower.done:
            follower = Follower(self, env_id)
            self._followers[env_id] = follower
            follower.start()
        follower.touch(task_id)
        follower.poke()

    def answered(self, env_id: str) -> None:
        """The box answered something: its follower's backoff is over (it is woken if sleeping)."""
        follower = self._followers.get(env_id)
        if follower is not None and not follower.done:
            follower.note_answered()

    async def start(self) -> None:
        """Resume every open remote task (and every owed stop) after a restart: one follower per
        link, each checking the box's subscription with one request."""
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
        self._poll: asyncio.Task[Any] | None = None
        self._loaded = False  # the link's open tasks were read once
        self._reload = True  # read them all again (the link changed here)
        self._touched: set[str] = set()  # tasks to read again
        self._mirroring: set[asyncio.Future[None]] = set()  # writes of the box's pending approvals
        self._mirrored: str | None = None  # what was last written of them
        self.requests = 0  # polls sent: idle traffic is measured by this
        self.syncs = 0  # subscription requests sent

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"follower:{self.env_id}")

    def touch(self, task_id: str | None) -> None:
        if task_id is None:
            self._reload = True
        else:
            self._touched.add(task_id)

    def poke(self) -> None:
        self._wakeup.set()

    def note_answered(self) -> None:
        self._answered = True
        if self._sleeping:  # a poll in flight is not cut short by the box answering
            self._wakeup.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        poll, self._poll = self._poll, None
        if poll is not None:
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await poll

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        restored = False
        while True:
            try:
                if not restored:
                    clock = self.pool.clock
                    attempts, wait = await tasks.backoff_wait(
                        self.pool.db, self.env_id, wall_now=clock.wall()
                    )
                    self.machine.restore(attempts, clock.monotonic() + wait if attempts else 0.0)
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
            await self._do(self.machine.answered(self.pool.clock.monotonic()))
        if await self._refresh():
            await self._do([CheckLink()])  # the link changed here: forgotten or revoked ends its tasks now
        self.machine.chunk_s = self.pool.watch_chunk_s
        actions = self.machine.plan(self.pool.clock.monotonic())
        done = await self._do(actions)
        if not isinstance(actions[0], Sleep):
            self.machine.step_done()  # a step went through: the store works (again)
        return done

    async def _refresh(self) -> bool:
        """Read what changed here into the machine; True after a reload that was not the first."""
        db = self.pool.db
        if self._reload:
            self._reload, touched = False, self._touched
            self._touched = set()
            try:
                self.machine.load(await feedstore.open_tasks(db, self.env_id))
            except BaseException:
                self._reload, self._touched = True, touched | self._touched
                raise
            again, self._loaded = self._loaded, True
            return again
        while self._touched:
            task_id = self._touched.pop()
            try:
                row = await feedstore.open_task(db, task_id)
            except BaseException:
                self._touched.add(task_id)
                raise
            if row is None:
                self.machine.drop(task_id)
            else:
                self.machine.upsert(row)
        return False

    async def _trouble(self, exc: Exception) -> None:
        """A step raised: a store fault waits with backoff (nothing is written: the store is what
        fails); anything else is a bug, logged and retried in 5 s. Never raises."""
        now = self.pool.clock.monotonic()
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
        db, delegation = self.pool.db, self.pool.delegation
        now, wall = self.pool.clock.monotonic, self.pool.clock.wall
        if isinstance(action, Sleep):
            return await self._sleep(action.until)
        if isinstance(action, Subscribe):
            return await self._subscribe(action.delta)
        if isinstance(action, Poll):
            self._start_poll(action)
        elif isinstance(action, AwaitPoll):
            return await self._await_poll(action.deadline)
        elif isinstance(action, StopPoll):
            await self._drop_poll()
        elif isinstance(action, Relaunch):
            return await self._each(
                action.task_ids, lambda t: t.child_thread_id is None, delegation.launch_remote
            )
        elif isinstance(action, DeliverStops):
            return await self._each(
                action.task_ids,
                lambda t: t.stop_owed and t.child_thread_id is not None,
                delegation.deliver_stop,
            )
        elif isinstance(action, ReadResult):
            try:
                reply = await read_reply(delegation.forwarder, self.env_id, action)
            except PeerdError as exc:
                if is_store_fault(exc):
                    raise
                return self.machine.failed(now(), exc.code, exc.message, task_id=action.task_id)
            return self.machine.result_read(action, reply)
        elif isinstance(action, EndTask):
            self._touched.add(action.task_id)
            if action.usage is not None:  # before the end: the woken parent may read it at once
                await usage_store.set_task_usage(db, action.task_id, action.usage)
            await delegation.end(action.task_id, action.status, action.result)
        elif isinstance(action, DropStop):
            self._touched.add(action.task_id)
            await tasks.set_stop(db, action.task_id, owed=False, reason=None, now=wall())
            await tasks.set_error(db, action.task_id, action.error, now=wall())
        elif isinstance(action, SaveBackoff):
            if action.attempts:
                log.info("follower.backoff", env_id=self.env_id, attempts=action.attempts)
            # Stored relative: the delay, and the wall time of the next try it makes now.
            await tasks.set_backoff(
                db,
                self.env_id,
                attempts=action.attempts,
                next_at=wall() + action.delay_s if action.attempts else 0.0,
                delay_s=action.delay_s,
                error=action.error,
            )
        elif isinstance(action, NoteQuiet):
            quiet_s = round(action.chunks * self.machine.chunk_s)
            # A child may just run long; a result the box never reports shows here (issue 26, case 8).
            log.info(
                "follower.task_quiet", env_id=self.env_id, task_ids=list(action.task_ids), quiet_s=quiet_s
            )
        elif isinstance(action, NoteError):
            await feedstore.note_error(db, self.env_id, action.error, now=wall())
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
            await self.pool.clock.sleep(until - self.pool.clock.monotonic(), self._wakeup)
        finally:
            self._sleeping = False
        if self._wakeup.is_set() and not self._answered:
            return self.machine.poked(self.pool.clock.monotonic())
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
            self._touched.add(task_id)  # whatever happens, the machine reads it again
            task = await tasks.get(self.pool.db, task_id)
            if not still(task):
                continue
            try:
                await send(task, for_follower=True)
            except PeerdError as exc:
                if is_store_fault(exc):
                    raise
                outcome = self.machine.failed(
                    self.pool.clock.monotonic(), exc.code, exc.message, task_id=task_id
                )
                if classify(exc.code) != "task":
                    return actions + outcome
                actions += outcome
        return actions

    # --- the change feed ---------------------------------------------------------------------------

    async def _subscribe(self, delta: Delta) -> list[Action]:
        self.syncs += 1
        body = subscription_body(delta)
        try:
            data = await self.pool.feed.call(self.env_id, SUBSCRIPTION_PATH, body)
            answer = FeedSubscribed.model_validate(data)
        except PeerdError as exc:
            if is_store_fault(exc):
                self.machine.sub.unconfirmed()
                raise
            message = feed_message(exc, self.machine.label)
            return self.machine.failed(self.pool.clock.monotonic(), feed_code(exc), message, subscribing=True)
        except BaseException:
            self.machine.sub.unconfirmed()
            raise
        return self.machine.subscribed(self.pool.clock.monotonic(), answer.in_sync)

    def _start_poll(self, action: Poll) -> None:
        self.requests += 1
        body = poll_body(action)
        call = self.pool.feed.call(self.env_id, CHANGES_PATH, body)  # the feed, or an old box's watch
        self._poll = asyncio.ensure_future(call)
        self._poll.add_done_callback(lambda _: self._wakeup.set())

    async def _await_poll(self, deadline: float) -> list[Action]:
        """Wait for the poll in flight; new work (a poke) returns at once to plan beside it."""
        poll = self._poll
        if poll is None:  # nothing in flight after all (it was dropped): plan a new one
            self.machine.poll_deadline = None
            return []
        if not poll.done():  # its end sets `_wakeup` too (`_start_poll`)
            await self.pool.clock.sleep(deadline - self.pool.clock.monotonic(), self._wakeup)
        if poll.done():
            self._poll = None
            return self._polled(poll)
        if self._wakeup.is_set() and self.pool.clock.monotonic() < deadline:
            return []  # new work: go round again with the poll still in flight
        await self._drop_poll()
        return self.machine.overdue(max(self.pool.clock.monotonic(), deadline))

    def _polled(self, poll: asyncio.Future[Any]) -> list[Action]:
        now = self.pool.clock.monotonic()
        try:
            data = poll.result()
            answer = FeedChanges.model_validate(data)
            if answer.approvals is not None:
                self._mirror_approvals(answer)
            if answer.capacity is not None and self.pool.events.subscribers(CapacityReported):
                self._background(self.pool.events.publish(CapacityReported(self.env_id, answer.capacity)))
        except PeerdError as exc:
            if is_store_fault(exc):
                self.machine.poll_deadline = None
                raise
            return self.machine.poll_failed(now, feed_code(exc), feed_message(exc, self.machine.label))
        except BaseException:
            self.machine.poll_deadline = None
            raise
        reports = tuple(
            RunReport(
                r.run_id,
                r.found,
                r.settled,
                r.status,
                r.reason,
                r.result_run_id,
                r.reply,
                r.reply_inline,
                None if r.usage is None else r.usage.model_dump_json(by_alias=True),
            )
            for r in answer.runs
        )
        return self.machine.polled(now, PollAnswer(answer.cursor, reports, answer.resynced, answer.set_hash))

    def _mirror_approvals(self, answer: FeedChanges) -> None:
        """Keep what the box says its pending approvals for our work are (`peerd approval list`
        shows them, marked on box); the poll is answered whatever becomes of this write."""
        bodies = [a.model_dump(mode="json", by_alias=True) for a in answer.approvals or []]
        same = json.dumps(bodies, sort_keys=True)
        if same == self._mirrored:
            return  # unchanged (most answers): no write to queue beside the answer's wake
        db, feed, env_id = self.pool.db, self.pool.delegation.feed, self.env_id

        async def write() -> None:
            await approvals_store.mirror(db, env_id, bodies, now=self.pool.clock.wall())
            self._mirrored = same
            feed.changed(APPROVALS_CHANGED)

        self._background(write())

    def _background(self, write: Coroutine[Any, Any, None]) -> None:
        """A write the poll's answer is not held up by (its store faults are the write's own)."""

        async def guarded() -> None:
            try:
                await write
            except Exception as exc:  # a store fault (typed or raw sqlite) is this write's own
                if not isinstance(exc, PeerdError) and not is_store_fault(exc):
                    log.exception("follower.background_write_failed", env_id=self.env_id)
                # else: the next answer writes again; never a task exception nobody retrieves

        task = asyncio.ensure_future(guarded())
        self._mirroring.add(task)
        task.add_done_callback(self._mirroring.discard)

    async def _drop_poll(self) -> None:
        """Abandon the poll in flight; the box cancels the abandoned long-poll."""
        poll, self._poll = self._poll, None
        if poll is None or poll.done():
            return
        poll.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await poll
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise asyncio.CancelledError  # a stop that landed meanwhile is ours, not the poll's
