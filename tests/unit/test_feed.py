"""The change feed: per-thread watches and many-thread listeners."""

from __future__ import annotations

from peerd.runtime.feed import ChangeFeed


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


async def test_close_wakes_listeners_and_watchers() -> None:
    feed = ChangeFeed()
    listener = feed.listen({"a"})
    watch = feed.watch("a")
    feed.close()
    assert listener.event.is_set() and watch.is_set() and feed.closed
