"""The tasks package's one clock/sleep seam, and work retried while this daemon's store fails.

`Clock` is the process's time: `now()` is monotonic (every backoff, sleep and deadline in the
process: a step of the wall clock, back or forward, changes none of them), `wall()` the wall
clock for what is stored and shown (`updated_at`, and the wall time a stored backoff was decided
at, which a restart only uses bounded: `rules.backoff_wait`). Its sleep can be cut short by new
work. Tests replace it to drive the follower without real time, and to step the wall clock.

`Retrier.run(name, work)` tries `work` once; when it fails with a store fault (full disk,
read-only, locked: `storage_unavailable`, or a raw SQLite operational error) it is retried in the
background with backoff (2 s ... 30 s) until it goes through, so a task's ending and its parent's wake are never
dropped because the disk was full for a while. Any other failure is raised (a bug stays visible).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable

import structlog

from peerd.tasks.rules import is_store_fault, store_retry_delay

log = structlog.get_logger(__name__)


class Clock:
    def now(self) -> float:
        """Monotonic seconds: for intervals and deadlines in this process only, never stored."""
        return time.monotonic()

    def wall(self) -> float:
        """Wall-clock seconds: for what is stored or shown (it may step back or forward)."""
        return time.time()

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep `seconds`, or less when `wake` is set meanwhile."""
        if wake is None:
            await asyncio.sleep(max(seconds, 0))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=max(seconds, 0))


class Retrier:
    def __init__(self, *, clock: Clock | None = None, jitter: Callable[[], float] = random.random) -> None:
        self.clock = clock or Clock()
        self.jitter = jitter
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def run(self, name: str, work: Callable[[], Awaitable[object]]) -> bool:
        """Do `work` now; True if it went through, False if a store fault left it to the retries."""
        try:
            await work()
            return True
        except Exception as exc:
            if not is_store_fault(exc) or self._closed:
                raise
            log.warning("task.retry_later", what=name, error=str(exc))
        task = asyncio.create_task(self._retry(name, work), name=f"retry:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return False

    async def _retry(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        failures = 1
        while True:
            await self.clock.sleep(store_retry_delay(failures, self.jitter()))
            try:
                await work()
                log.info("task.retried", what=name, attempts=failures + 1)
                return
            except Exception as exc:
                if not is_store_fault(exc):
                    log.exception("task.retry_failed", what=name)
                    return
                failures += 1

    async def close(self) -> None:
        """At shutdown: what is still owed is in the store, and start-up recovery redoes it."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
