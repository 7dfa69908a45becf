"""The change feed: per-thread watches and many-thread listeners."""

from __future__ import annotations

import asyncio

from peerd.runtime.feed import ChangeFeed
from tests.fakeclock import FakeClock


async def test_a_listener_hears_only_its_threads_and_says_which_changed() -> None:
    feed = ChangeFeed()
    listener = feed.listen({"a", "b"})
    feed.changed("c")
    assert not listener.event.is_set()
    feed.changed("b")
    feed.changed("a")
    assert listener.event.is_set()
    assert listener.take() == {"a", "b"}
    assert not listener.event.is_set() and listener.take() == set()
    feed.unlisten(listener, {"a", "b"})
    feed.changed("a")
    assert not listener.event.is_set(), "an unlistened listener hears nothing"


async def test_a_watch_lives_while_someone_holds_it_and_no_longer() -> None:
    """A long-poll that returns without a change (its run was over at the first read, or its time
    ran out) leaves nothing in the feed: before, each such watch stayed for ever (the memory soak
    of `make faults` saw ~20 kB more per delegation on the laptop)."""
    feed = ChangeFeed()
    held = feed.watch("a")
    assert feed.watch("a") is held, "two waiters on one thread share its event"
    for thread in ("b", "c"):
        feed.watch(thread)  # taken, read the store, returned at once: nobody holds it
    assert feed.watched() == 1
    feed.changed("a")
    assert held.is_set() and feed.watched() == 0
    again = feed.watch("a")
    assert again is not held and not again.is_set(), "a new watch waits for the next change"
    waiting = asyncio.ensure_future(feed.wait(feed.watch("d"), 30))
    await asyncio.sleep(0)
    assert feed.watched() == 2, "a waiter's event is kept while it waits"
    feed.changed("d")
    await waiting
    del again
    assert feed.watched() == 0


async def test_close_wakes_listeners_and_watchers() -> None:
    feed = ChangeFeed()
    listener = feed.listen({"a"})
    watch = feed.watch("a")
    feed.close()
    assert listener.event.is_set() and watch.is_set() and feed.closed


async def test_a_long_poll_cancelled_at_any_moment_is_cancelled() -> None:
    """A wait cancelled while it unwinds (the feed closed at shutdown, its timer being cancelled)
    ends cancelled: the engine cancels its packets' long-polls at shutdown and waits for them, so a
    cancellation swallowed there held `peerd serve` for ever after SIGTERM."""
    for turns in range(8):  # cancelled after 0..7 turns of the loop: each moment of the unwinding
        feed = ChangeFeed()
        polling = asyncio.ensure_future(feed.wait_any([asyncio.Event()], 30.0))
        await asyncio.sleep(0)
        feed.close()
        for _ in range(turns):
            await asyncio.sleep(0)
        finished_first = polling.done()
        polling.cancel()
        await asyncio.wait([polling], timeout=5)
        assert polling.done(), turns
        assert finished_first or polling.cancelled(), f"a cancel after {turns} turns was swallowed"


async def test_a_wait_ends_on_the_feed_s_clock() -> None:
    clock = FakeClock()
    feed = ChangeFeed(clock=clock)
    deadline = feed.deadline(30)
    polling = asyncio.ensure_future(feed.wait(feed.watch("a"), feed.remaining(deadline)))
    assert await clock.jump() == 30 and feed.remaining(deadline) == 0
    await asyncio.wait_for(polling, 5)
