"""A small in-memory sliding-window rate limiter, pure (the clock is injected).

At most `limit` events per key in any `window_s` seconds. A denied hit is not recorded: otherwise
a caller hammering a full window would keep it full forever, and the legitimate user behind the
same key (for the global pairing limit, everyone) could never get through again. The state lives
in memory only; a restart forgets it, which is fine for slowing down guessing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

DEFAULT_MAX_KEYS = 10_000


class SlidingWindow:
    def __init__(
        self,
        limit: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("a sliding window needs limit >= 1 and window_s > 0")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._events: dict[str, deque[float]] = {}

    def _live(self, key: str, now: float) -> deque[float] | None:
        """The key's events still inside the window; drops the key once it has none."""
        events = self._events.get(key)
        if events is None:
            return None
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if not events:
            del self._events[key]
            return None
        return events

    def allowed(self, key: str = "") -> bool:
        """Whether a hit now would be allowed, without recording one."""
        events = self._live(key, self._clock())
        return events is None or len(events) < self.limit

    def hit(self, key: str = "") -> bool:
        """Record one event for `key` if the window has room; False (nothing recorded) when full."""
        now = self._clock()
        events = self._live(key, now)
        if events is None:
            if len(self._events) >= self._max_keys:
                self._sweep(now)
            events = self._events.setdefault(key, deque())
        if len(events) >= self.limit:
            return False
        events.append(now)
        return True

    def retry_after(self, key: str = "") -> float:
        """Seconds until a hit on `key` would be allowed again (0 when it would be now)."""
        now = self._clock()
        events = self._live(key, now)
        if events is None or len(events) < self.limit:
            return 0.0
        return max(0.0, events[0] + self.window_s - now)

    def reset(self, key: str = "") -> None:
        self._events.pop(key, None)

    def key_count(self) -> int:
        """How many keys are tracked (stale ones may linger until touched or swept)."""
        return len(self._events)

    def _sweep(self, now: float) -> None:
        # Many distinct keys (e.g. one per address): drop the idle ones first, and if every key is
        # still live, the oldest, so memory stays bounded whatever callers send.
        for key in list(self._events):
            self._live(key, now)
        while len(self._events) >= self._max_keys:
            oldest = min(self._events, key=lambda k: self._events[k][-1])
            del self._events[oldest]
