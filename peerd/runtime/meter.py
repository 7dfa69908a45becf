"""One live run's meter: its usage as the provider reports it, and its budget as a stop rule.

The run manager makes one per run (`RunMeter.open`), hands it each `UsageReported`, and asks it to
close when the run's events end. The meter stores every report (through the manager's retrying
store write) and calls `stop(why)` once the run passes its budget (`peerd.core.usage.exceeded`);
a `seconds` budget also has a timer, so a run that reports nothing is stopped all the same.

The budget is the work's, not the run's alone: a wake or a continuation counts what the earlier
runs of its work spent (`peerd.core.usage.budget_scope`), so the whole is stopped once it passes
the limit, and a run whose work is already past it is not started (`past`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from peerd.core.clock import Clock
from peerd.core.usage import Budget, Usage, scope_exceeded
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store

Write = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


class RunMeter:
    def __init__(
        self,
        db: Database,
        run_id: str,
        budget: Budget | None,
        *,
        clock: Clock,
        write: Write,
        stop: Callable[[str], None],
        before: Usage | None = None,
    ) -> None:
        self._db = db
        self._run_id = run_id
        self._budget = budget
        self._before = before  # what the earlier runs of this run's work spent
        self._clock = clock
        self._write = write
        self._stop = stop
        self._started = clock.monotonic()  # its time is monotonic: a wall clock step stops no run
        self._usage: Usage | None = None
        self._timer: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        db: Database,
        run_id: str,
        *,
        clock: Clock,
        write: Write,
        stop: Callable[[str], None],
    ) -> RunMeter:
        """The run's meter, its budget (and what its work spent before it) read from the store;
        the clock starts now."""
        budget, before = await usage_store.run_budget_scope(db, run_id)
        return cls(db, run_id, budget, clock=clock, write=write, stop=stop, before=before)

    @property
    def past(self) -> str | None:
        """Why the run's work is past its budget before the run spent anything (None: it may run)."""
        if self._budget is None or self._before is None:
            return None
        return scope_exceeded(self._budget, self._before, None, 0.0)

    def start_timer(self) -> None:
        """With a `seconds` budget: stop the run when its time is up, reports or not."""
        if self._budget is not None and self._budget.seconds is not None and self._timer is None:
            self._timer = asyncio.create_task(
                self._time_limit(self._budget.seconds), name=f"budget:{self._run_id}"
            )

    async def report(self, usage: Usage) -> None:
        """Store the run's usage so far (with peerd's wall time); stop the run past its budget."""
        wall_s = max(0.0, self._clock.monotonic() - self._started)
        self._usage = usage.with_wall(round(wall_s * 1000))
        await self._write(functools.partial(usage_store.set_run_usage, self._db, self._run_id, self._usage))
        if (
            self._budget is not None
            and (why := scope_exceeded(self._budget, self._before, self._usage, wall_s)) is not None
        ):
            self._stop(why)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def close(self) -> None:
        """The run's events ended: no more timer; the stored usage gets the whole run's wall time."""
        self.stop_timer()
        if self._usage is not None:
            wall_ms = round(max(0.0, self._clock.monotonic() - self._started) * 1000)
            final = self._usage.with_wall(wall_ms)
            await self._write(functools.partial(usage_store.set_run_usage, self._db, self._run_id, final))

    async def _time_limit(self, seconds: float) -> None:
        earlier_s = (self._before.wall_ms or 0) / 1000 if self._before is not None else 0.0
        limit = Budget(seconds=seconds)
        while True:
            wall_s = self._clock.monotonic() - self._started
            if (why := scope_exceeded(limit, self._before, None, wall_s)) is not None:
                self._stop(why)
                return
            await self._clock.sleep(max(0.05, seconds - earlier_s - wall_s + 0.01))
