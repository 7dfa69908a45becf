"""Start slots: how many runs may be *starting* at once (`[runs] start_slots`).

Starting a run is the costly part of its life for the machine: its worktree (git processes), its
sandbox, and its CLI's own start-up (an interpreter importing its modules, a Node CLI loading) all
want CPU at the same moment. A burst of launches (fifty at once from a linked laptop) would start
fifty processes together, and the daemon's own event loop, which answers every launch, would wait
for the CPU behind them. So a run takes a slot before its worktree is made and gives it back as
soon as its CLI has started (its first event), when it ends, or at the latest `hold_max_s` after
its process was spawned (a CLI that says nothing for a while holds no slot); queued runs take the
freed slots in the order they asked. A launch's answer never waits for a slot: the run is recorded
`starting` at once and the slot is waited for by the run's own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

HOLD_MAX_S = 5.0


def default_start_slots() -> int:
    """Half the CPUs this process may use, at least 1: the other half stays free for the daemon
    (measured in bench/launch.py: on 2 cores one slot answers about 2.5x the launches per second
    that unbounded starts did, two slots about 2x)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(1, cpus // 2)


class Slot:
    """One taken slot; `release` is idempotent (the first event, the end and the timer may race)."""

    def __init__(self, owner: StartSlots) -> None:
        self._owner = owner
        self._released = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def held(self) -> bool:
        return not self._released

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._owner._give_back()

    def release_after(self, seconds: float) -> None:
        """Give the slot back `seconds` from now, unless it was given back before."""
        if self._released or self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(seconds, self.release)


class StartSlots:
    """At most `limit` slots taken at once; waiters are served first come, first served."""

    def __init__(self, limit: int, *, hold_max_s: float = HOLD_MAX_S) -> None:
        if limit < 1:
            raise ValueError("start slots must be at least 1")
        self.limit = limit
        self.hold_max_s = hold_max_s
        self._semaphore = asyncio.Semaphore(limit)
        self.taken = 0
        self.waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """A slot for one run's start; given back on leaving at the latest."""
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.taken += 1
        taken = Slot(self)
        try:
            yield taken
        finally:
            taken.release()

    def _give_back(self) -> None:
        self.taken -= 1
        self._semaphore.release()
