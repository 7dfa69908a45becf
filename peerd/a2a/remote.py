"""A2A tasks whose run is on a linked box: a `SendMessage` peerd placed there (`environmentId:
"auto"` choosing a box), and a message to such a task's context (the next run of that thread).

- **Recorded before it leaves**: the launch or send is committed here (`a2a_remote_tasks`, keyed by
  the caller's namespace and the message's key `a2a:<messageId>`) before it is forwarded; the box
  receives it under the forwarded key (`fwd:`, `core/idempotency.py`), so sending it again reaches
  the same thread and run. The box's thread and run are attached when it answers. A send the box
  refused for good is forgotten (nothing started there); one whose answer was lost is sent again
  by the follower until the box answers (a retry of the message gets the same task meanwhile).
- **Followed**: one follower per open task (`_follow`) asks the box about the run, a long-poll of
  `FOLLOW_CHUNK_S` at a time (`thread wait` there: at once when the run ends; at each chunk's end
  with the question a person must answer, if one waits: `input-required`), and keeps the task as
  last seen (the A2A JSON, with its answer once it ended) in the same row. A change pokes the change
  feed under the box's thread id, so a blocking send, a stream and the push notifications here
  follow it as they follow a run here. Failures back off (1 s doubling to 5 min, jitter) without
  limit while transient; a refusal for good (the link revoked, the thread gone there) ends the
  task `failed` with the reason.
- **Cancelled**: a cancel is recorded as owed, then sent (`thread interrupt` of that run there:
  live, interrupted; queued, cancelled); one the box could not be reached for is sent again by
  the follower until the box takes or refuses it.
- **Served after a restart** of either daemon: the row is the task; the follower starts again for
  every open one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from a2a.types import Task

from peerd import contracts as c
from peerd.a2a import store
from peerd.a2a.store import Remote
from peerd.a2a.view import (
    ANSWER_CHARS,
    ENDED,
    Asking,
    Facts,
    as_json,
    build_task,
    from_json,
    last_answer,
    remote_task,
    state_name,
)
from peerd.core.backoff import Backoff
from peerd.core.idempotency import request_hash
from peerd.errors import CapabilityDenied, IdempotencyKeyReused, PeerdError, classify
from peerd.operations import Caller, Operations, PlacedLaunch
from peerd.store import links

log = structlog.get_logger(__name__)

FOLLOW_CHUNK_S = 10.0  # one wait on the box; following a task is a loop of them
RETRY = Backoff(first=1.0, cap=300.0, jitter=1.0)
CANCEL_REASON = "A2A CancelTask"


def _caller(row: Remote) -> Caller:
    """Who the task's requests go as: its caller's namespace (the owner's: a link's work never
    places on this machine's links, `Forwarder.target`)."""
    return Caller(namespace=row.namespace)


class RemoteTasks:
    def __init__(self, ops: Operations, *, changed: Callable[[str], None] | None = None) -> None:
        self.ops = ops
        self.db = ops.db
        self._changed = changed or ops.feed.changed
        self._followers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._wake: dict[tuple[str, str], asyncio.Event] = {}
        self._closed = False
        self._draw: Callable[[], float] = random.random

    # --- sending ---------------------------------------------------------------------------------

    async def launch(self, caller: Caller, placed: PlacedLaunch) -> Remote:
        """A launch placed on a box: recorded, then forwarded; the task as the box answered."""
        env = placed.req.environment_id
        if caller.link is not None or env is None or placed.req.client_request_id is None:
            raise CapabilityDenied("Only this machine's owner places A2A work on linked machines.")
        body = placed.req.model_dump(mode="json", by_alias=True, exclude_none=True)
        row = await self._record(caller, placed.req.client_request_id, env, "launch", body, None)

        async def send() -> tuple[str, str]:
            launched = await self.ops.launch_placed(caller, placed)
            return launched.thread_id, launched.run_id

        return await self._first_send(row, send)

    async def send(self, caller: Caller, context: Remote, req: c.ThreadSend) -> Remote:
        """A message to a thread on a box (a context this machine follows there): its next run."""
        if req.client_request_id is None or context.thread_id is None:
            raise CapabilityDenied("A message to a thread on a linked machine needs its messageId.")
        there = req.model_copy(update={"environment_id": context.env_id})
        body = there.model_dump(mode="json", by_alias=True, exclude_none=True)
        row = await self._record(
            caller, req.client_request_id, context.env_id, "send", body, context.thread_id
        )

        async def send() -> tuple[str, str]:
            sent = await self.ops.thread_send(caller, context.thread_id or "", there)
            return sent.thread_id, sent.run_id

        return await self._first_send(row, send)

    async def _record(
        self, caller: Caller, key: str, env: str, method: str, body: dict[str, Any], thread_id: str | None
    ) -> Remote:
        row = await store.remote_record(
            self.db,
            (caller.namespace, key),
            env_id=env,
            method=method,
            body=body,
            thread_id=thread_id,
            now=self.ops.clock(),
        )
        if request_hash(method, row.body) != request_hash(method, body):
            raise IdempotencyKeyReused(
                f"messageId {key.removeprefix('a2a:')} was already used for another message; give this one its own."
            )
        return row

    async def _first_send(self, row: Remote, send: Callable[[], Awaitable[tuple[str, str]]]) -> Remote:
        if row.task_id is None:
            try:
                thread_id, run_id = await send()
            except PeerdError as err:
                if classify(err.code) != "transient":
                    await store.remote_forget(self.db, row.key)  # refused there: nothing started
                else:  # sent or not: the follower sends it again until the box answers
                    await store.remote_failed(self.db, row.key, err.message, now=self.ops.clock())
                    self._follow_later(row.key)
                raise
            await store.remote_attach(
                self.db, row.key, task_id=run_id, thread_id=thread_id, now=self.ops.clock()
            )
        found = await store.remote_get(self.db, row.key)
        assert found is not None  # noqa: S101  # recorded above
        if found.task is None:
            with contextlib.suppress(PeerdError):  # a first look; the follower keeps looking
                await self._look(found, wait_s=0.0)
            found = await store.remote_get(self.db, row.key) or found
        self._follow_later(found.key)
        return found

    # --- reading ---------------------------------------------------------------------------------

    async def cancel(self, row: Remote) -> Task:
        """Owed first, then sent; the task as it is after (still live if the box was not reached)."""
        await store.remote_cancel_owed(self.db, row.key, True, now=self.ops.clock())
        if row.task_id is not None:
            try:
                await self._deliver_cancel(row)
            except PeerdError as err:
                if classify(err.code) != "transient":
                    await store.remote_cancel_owed(self.db, row.key, False, now=self.ops.clock())
                    raise
                await store.remote_failed(self.db, row.key, err.message, now=self.ops.clock())
            else:
                with contextlib.suppress(PeerdError):
                    await self._look(row, wait_s=0.0)
        self._follow_later(row.key)
        return remote_task(await store.remote_get(self.db, row.key) or row)

    async def _deliver_cancel(self, row: Remote) -> None:
        req = c.ThreadInterrupt(reason=CANCEL_REASON, run_id=row.task_id, environment_id=row.env_id)
        await self.ops.thread_interrupt(_caller(row), row.thread_id or "", req)
        await store.remote_cancel_owed(self.db, row.key, False, now=self.ops.clock())

    # --- following -------------------------------------------------------------------------------

    async def _look(self, row: Remote, *, wait_s: float) -> Task:
        """Ask the box about the run (waiting up to `wait_s` for it to end) and keep what it said."""
        caller = _caller(row)
        thread_id, run_id = row.thread_id or "", row.task_id
        waited = await self.ops.thread_wait(
            caller, thread_id, c.ThreadWait(run_id=run_id, timeout=wait_s, environment_id=row.env_id)
        )
        status = waited.status or "queued"
        asking, answer, reason = None, "", None
        if waited.awaiting_approval is not None:
            link = await links.get(self.db, row.env_id)
            where = link.label if link is not None else row.env_id
            asking = Asking(waited.awaiting_approval.approval_id, waited.awaiting_approval.summary, where)
        if waited.terminal:
            read = await self.ops.thread_read(
                caller,
                thread_id,
                c.ThreadRead(
                    run_id=run_id,
                    limit=c.PAGE_LIMIT,
                    max_chars_per_item=ANSWER_CHARS,
                    environment_id=row.env_id,
                ),
            )
            answer = last_answer(read.items)
            latest = read.thread.latest_run
            if latest is not None and latest.id == run_id:
                reason = latest.reason
            errors = [item.text for item in read.items if item.kind == "error"]
            reason = reason or (errors[-1] if errors else None)
        seen = build_task(Facts(run_id or "", thread_id, status, row.created_at, asking, answer, reason))
        before = None if row.task is None else from_json(row.task)
        if before is not None:
            before.status.ClearField("timestamp")
            seen_now = Task()
            seen_now.CopyFrom(seen)
            seen_now.status.ClearField("timestamp")
            if before == seen_now:
                return from_json(row.task or "")
        task = build_task(Facts(run_id or "", thread_id, status, self.ops.clock(), asking, answer, reason))
        ended = task.status.state in ENDED
        await store.remote_seen(
            self.db,
            row.key,
            state=state_name(task.status.state),
            task=as_json(task),
            ended=ended,
            now=self.ops.clock(),
        )
        self._changed(thread_id)
        return task

    async def _end_failed(self, row: Remote, why: str) -> None:
        """Refused for good there: the task ends failed with the reason (once)."""
        task = build_task(
            Facts(row.task_id or "", row.thread_id or "", "failed", self.ops.clock(), reason=why)
        )
        await store.remote_seen(
            self.db, row.key, state="failed", task=as_json(task), ended=True, now=self.ops.clock()
        )
        if row.thread_id:
            self._changed(row.thread_id)

    async def _step(self, row: Remote, first: bool) -> bool:
        """One round with the box; whether the task is still open."""
        if row.task_id is None:
            if row.method == "launch":
                launched = await self.ops.thread_launch(_caller(row), c.ThreadLaunch.model_validate(row.body))
                ids = launched.thread_id, launched.run_id
            else:
                sent = await self.ops.thread_send(
                    _caller(row), row.thread_id or "", c.ThreadSend.model_validate(row.body)
                )
                ids = sent.thread_id, sent.run_id
            await store.remote_attach(
                self.db, row.key, task_id=ids[1], thread_id=ids[0], now=self.ops.clock()
            )
            return True
        if row.cancel_owed:
            await self._deliver_cancel(row)
        task = await self._look(row, wait_s=0.0 if first else FOLLOW_CHUNK_S)
        return task.status.state not in ENDED

    async def _follow(self, key: tuple[str, str]) -> None:
        attempts, first = 0, True
        wake = self._wake.setdefault(key, asyncio.Event())
        try:
            while not self._closed:
                wake.clear()
                row = await store.remote_get(self.db, key)
                if row is None or row.ended_at is not None:
                    return
                try:
                    if not await self._step(row, first):
                        return
                    attempts, first = 0, False
                    continue
                except PeerdError as err:
                    if classify(err.code) != "transient":
                        if row.task_id is None:  # refused before any task was made: nothing started
                            await store.remote_forget(self.db, key)
                        else:
                            await self._end_failed(row, err.message)
                        log.info("a2a.remote_task_ended", task_id=row.task_id, code=err.code)
                        return
                    attempts += 1
                    with contextlib.suppress(PeerdError):
                        await store.remote_failed(self.db, key, err.message, now=self.ops.clock())
                    log.info("a2a.remote_task_retry", task_id=row.task_id, code=err.code, attempts=attempts)
                except Exception:  # a bug: logged, and tried again later
                    attempts += 1
                    log.exception("a2a.remote_task_failed", task_id=row.task_id)
                await self.ops.clock.sleep(RETRY.delay(attempts, self._draw()), wake)
        finally:
            self._followers.pop(key, None)
            self._wake.pop(key, None)

    def _follow_later(self, key: tuple[str, str]) -> None:
        if self._closed:
            return
        running = self._followers.get(key)
        if running is not None and not running.done():
            wake = self._wake.get(key)
            if wake is not None:
                wake.set()
            return
        self._followers[key] = asyncio.get_running_loop().create_task(
            self._follow(key), name="peerd.a2a.remote"
        )

    async def start(self) -> None:
        """Follow every open task again (after a restart)."""
        for row in await store.remote_open(self.db):
            self._follow_later(row.key)

    async def close(self) -> None:
        self._closed = True
        followers = list(self._followers.values())
        for follower in followers:
            follower.cancel()
        for follower in followers:
            with contextlib.suppress(asyncio.CancelledError):
                await follower
