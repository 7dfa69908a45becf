"""Work retried while this daemon's store fails, waiting on the daemon's one clock
(`core/clock.py`).

`Retrier.run(name, work)` tries `work` once; when it fails with a store fault (full disk,
read-only, locked: `storage_unavailable`, or a raw SQLite operational error) it is retried in the
background with backoff (`rules.STORE_RETRY`: 2 s ... 30 s) until it goes through, so a task's
ending and its parent's wake are never dropped because the disk was full for a while. Any other
failure is raised (a bug stays visible).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

import structlog

from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.tasks.rules import STORE_RETRY, is_store_fault

log = structlog.get_logger(__name__)


class Retrier:
    def __init__(self, *, clock: Clock | None = None, jitter: Callable[[], float] = random.random) -> None:
        self.clock = clock or SYSTEM_CLOCK
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
            await self.clock.sleep(STORE_RETRY.delay(failures, self.jitter()))
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
