"""Change notifications for long-polls: "thread X changed", never the change itself.

Waiters re-read the store after waking, so a missed or merged notification can never lose state;
it can only cost one extra read.

A long-poll's deadline is on the daemon's one clock (`core/clock.py`), the feed's: `deadline(s)`
when it starts, `remaining(deadline)` at each look, and `wait`/`wait_any` sleep through
`clock.sleep`, so a test's fake clock moves every long-poll's timeout (tests/fakeclock.py).
"""

from __future__ import annotations

import asyncio
import weakref

from peerd.core.clock import SYSTEM_CLOCK, Clock


class Listener:
    """Many threads watched at once: one event, and the set of threads that changed since the last
    `take()`. The follower's batched watch uses it, so a change costs O(1), not O(watched threads)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.changed: set[str] = set()

    def take(self) -> set[str]:
        changed, self.changed = self.changed, set()
        self.event.clear()
        return changed


class ChangeFeed:
    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        # A thread's event lives while a waiter holds it: a long-poll that returns without a change
        # (its run was already over, or its time ran out) leaves nothing behind, whatever it watched.
        self._events: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()
        self._listeners: dict[str, set[Listener]] = {}
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def watch(self, thread_id: str) -> asyncio.Event:
        """Take this before reading the store, then wait on it: no change can slip in between. Hold
        it while waiting: the feed keeps it only as long as someone does."""
        event = self._events.get(thread_id)
        if event is None:
            event = self._events[thread_id] = asyncio.Event()
        return event

    def watched(self) -> int:
        """How many threads someone waits on now."""
        return len(self._events)

    def changed(self, thread_id: str) -> None:
        event = self._events.pop(thread_id, None)
        if event is not None:
            event.set()
        for listener in self._listeners.get(thread_id, ()):
            listener.changed.add(thread_id)
            listener.event.set()

    def listen(self, thread_ids: set[str], listener: Listener | None = None) -> Listener:
        """Register before reading the store, like `watch`; `unlisten` when done. Passing a
        listener adds threads to it (the box's change feed keeps one per link)."""
        listener = listener or Listener()
        for thread_id in thread_ids:
            self._listeners.setdefault(thread_id, set()).add(listener)
        return listener

    def unlisten(self, listener: Listener, thread_ids: set[str]) -> None:
        for thread_id in thread_ids:
            listeners = self._listeners.get(thread_id)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[thread_id]

    def deadline(self, seconds: float) -> float:
        """When a long-poll of `seconds` ends, on the clock's monotonic time."""
        return self.clock.monotonic() + seconds

    def remaining(self, deadline: float) -> float:
        """Seconds left until `deadline` (0 or less: it passed)."""
        return deadline - self.clock.monotonic()

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        """Until the thread changes, the feed closes (shutdown) or `seconds` pass."""
        await self.wait_any([event], seconds)

    async def wait_any(self, events: list[asyncio.Event], seconds: float) -> None:
        """Until any of the watched threads changes, the feed closes, or `seconds` pass."""
        if seconds <= 0 or self.closed:
            return
        waiters = [asyncio.ensure_future(e.wait()) for e in events] + [
            asyncio.ensure_future(self._closed.wait()),
            asyncio.ensure_future(self.clock.sleep(seconds)),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            # Not `await waiter` under suppress(CancelledError): a cancellation of this task that
            # lands while the waiters unwind would be swallowed with theirs (and an engine that
            # cancels a long-poll at shutdown would wait for it for ever).
            await asyncio.wait(waiters)

    def close(self) -> None:
        """Shutdown: every long-poll returns now."""
        self._closed.set()
        for listeners in self._listeners.values():
            for listener in listeners:
                listener.event.set()
        for event in list(self._events.values()):
            event.set()
        self._events.clear()
