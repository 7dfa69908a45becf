"""One gh login's pace, shared by every poller of this daemon: the waits' watchers
(`service.py:Waits`) and the orchestrations waiting on their pull requests
(`orchestrate/prwait.py`). A rate limit one of them hit pauses them all until its backoff is over,
and the poll interval stretches with how many poll at once (`machine.spaced`), so together they
stay within `machine.HOURLY_CALLS`."""

from __future__ import annotations

from peerd.core.clock import Clock
from peerd.waits.machine import spaced


class GhPace:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._paused_until = 0.0  # monotonic seconds
        self._pollers: set[str] = set()

    def join(self, key: str) -> None:
        self._pollers.add(key)

    def leave(self, key: str) -> None:
        self._pollers.discard(key)

    def interval(self, poll_s: float) -> float:
        """The poll interval with every poller of this daemon counted."""
        return spaced(poll_s, len(self._pollers))

    def rate_limited(self, delay_s: float) -> None:
        """GitHub said the limit is spent: every poller waits this long."""
        self._paused_until = max(self._paused_until, self.clock.monotonic() + delay_s)

    async def ready(self) -> None:
        """Returns once no rate-limit pause holds."""
        while (pause := self._paused_until - self.clock.monotonic()) > 0:
            await self.clock.sleep(pause)


__all__ = ["GhPace"]
