"""The one fake of the daemon's clock (`peerd/core/clock.py`): time moves only when a test moves it.

    clock = FakeClock()                 wall T0, monotonic 1000.0
    clock() / clock.wall()              what every `clock: Callable[[], float]` part reads
    clock.monotonic()                   intervals, deadlines, backoffs
    clock.advance(30)                   both move 30 s; sleepers due by then wake
    clock.step_wall(-600)               only the wall clock steps (as an NTP correction would)
    await clock.jump()                  wait until something sleeps on the clock, then move to the
                                        earliest sleeper's end (its delay is returned)
    clock.slept                         every delay asked of `sleep`, in order

A sleep asked with a `wake` event also ends when the event is set, as `SystemClock.sleep`. Give
it to a part (`clock=`), or to a whole daemon (`Daemon(config, clock=...)`) to drive its backoffs
and timers without waiting for them. Kept out of `tests/support/` (another change is building
that package): this one module is all of it.
"""

from __future__ import annotations

import asyncio

from tests.support.eventually import eventually

T0 = 1_800_000_000.0  # a wall time in 2027: far from 0, so nothing confuses it with a delay


class FakeClock:
    def __init__(self, wall: float = T0, monotonic: float = 1000.0) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self.slept: list[float] = []
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self._wall

    def wall(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        seconds = max(seconds, 0.0)
        self.slept.append(seconds)
        if wake is not None and wake.is_set():
            return
        if seconds == 0.0:
            await asyncio.sleep(0)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._monotonic + seconds, done)
        self._sleepers.append(entry)
        try:
            if wake is None:
                await done
                return
            woken = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait({done, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Both clocks move on `seconds`; every sleep due by then ends."""
        if seconds < 0:
            raise ValueError("monotonic time only goes forward: step_wall steps the wall clock")
        self._wall += seconds
        self._monotonic += seconds
        for until, done in list(self._sleepers):
            if until <= self._monotonic and not done.done():
                done.set_result(None)

    def step_wall(self, seconds: float) -> None:
        """The wall clock alone steps (back with a negative `seconds`); monotonic time does not."""
        self._wall += seconds

    @property
    def sleeping(self) -> list[float]:
        """How long each pending sleep has left, soonest first."""
        return sorted(until - self._monotonic for until, done in self._sleepers if not done.done())

    async def jump(self, *, within_s: float = 10.0) -> float:
        """Wait (real time, at most `within_s`) until something sleeps on this clock, then move
        to the end of the soonest sleep and let it run; the seconds moved."""
        await eventually(
            lambda: self.sleeping, what="something sleeping on the fake clock", within=within_s, every=0.001
        )
        step = self.sleeping[0]
        self.advance(step)
        await asyncio.sleep(0)
        return step
