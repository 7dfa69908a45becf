"""The one clock: made once by the daemon (`daemon.py:Daemon`) and passed to every part that reads
the time or waits for it, so a test can give a daemon a clock it moves itself (tests/fakeclock.py).

    clock.wall()        wall-clock seconds (epoch): what is stored and shown; it may step
    clock()             the same: every `clock: Callable[[], float] = time.time` parameter
                        (a part that only stamps what it stores) takes the clock as it is
    clock.monotonic()   seconds that only go forward: intervals, deadlines and backoffs in this
                        process, never stored (a step of the wall clock moves none of them)
    await clock.sleep(seconds, wake)
                        wait `seconds` of monotonic time, or less when `wake` is set meanwhile:
                        every backoff and timer of the daemon waits through it

The state machines (`tasks/machine.py`, `handoff/machine.py`, ...) take time as plain numbers
from their shell, which reads this clock. `SystemClock` is the only place here that reads the
system's clocks; the rest of `core/` does no I/O.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Wall-clock seconds, as `wall()`."""
        ...

    def wall(self) -> float:
        """Wall-clock seconds: for what is stored or shown (it may step back or forward)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds: for intervals and deadlines in this process only, never stored."""
        ...

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep `seconds` (monotonic), or less when `wake` is set meanwhile."""
        ...


class SystemClock:
    """The machine's clocks (read at each call, so a test that patches `time.time` reaches it)."""

    def __call__(self) -> float:
        return time.time()

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        if wake is None:
            await asyncio.sleep(max(seconds, 0))
            return
        # `asyncio.wait`, not `wait_for`: on 3.11 `wait_for` swallows a cancellation that lands as
        # `wake` is set, and a follower stopped then would never stop (its `stop` awaits it).
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({woken}, timeout=max(seconds, 0))
        finally:
            woken.cancel()


SYSTEM_CLOCK: Clock = SystemClock()  # the default of every part built outside the daemon
