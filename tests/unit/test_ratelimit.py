"""The sliding-window limiter, with an injected clock."""

from __future__ import annotations

import pytest

from peerd.peer.ratelimit import SlidingWindow
from tests.fakeclock import FakeClock


def test_allows_up_to_the_limit_then_denies() -> None:
    clock = FakeClock()
    window = SlidingWindow(3, 60, clock.monotonic)
    assert [window.hit("a") for _ in range(4)] == [True, True, True, False]
    assert not window.allowed("a")


def test_keys_are_independent() -> None:
    window = SlidingWindow(1, 60, FakeClock().monotonic)
    assert window.hit("a")
    assert not window.hit("a")
    assert window.hit("b")


def test_the_window_slides_event_by_event() -> None:
    clock = FakeClock()
    window = SlidingWindow(2, 60, clock.monotonic)
    assert window.hit()
    clock.advance(30)
    assert window.hit()
    assert not window.hit()
    clock.advance(30)  # the first event is exactly window_s old: it no longer counts
    assert window.allowed()
    assert window.hit()
    assert not window.hit()  # the second event (t+30) is still inside
    clock.advance(30)
    assert window.hit()


def test_denied_hits_are_not_recorded() -> None:
    # Otherwise hammering a full window would keep it full forever.
    clock = FakeClock()
    window = SlidingWindow(1, 10, clock.monotonic)
    assert window.hit()
    for _ in range(100):
        clock.advance(0.05)
        assert not window.hit()
    clock.advance(1000 + 10 - clock.monotonic())  # exactly the window after the first hit
    assert window.hit()


def test_allowed_does_not_record() -> None:
    window = SlidingWindow(1, 10, FakeClock().monotonic)
    for _ in range(5):
        assert window.allowed("k")
    assert window.hit("k")


def test_retry_after_counts_down_to_the_oldest_event_leaving() -> None:
    clock = FakeClock()
    window = SlidingWindow(2, 60, clock.monotonic)
    assert window.retry_after() == 0
    window.hit()
    clock.advance(20)
    window.hit()
    assert window.retry_after() == pytest.approx(40)
    clock.advance(40)
    assert window.retry_after() == 0


def test_reset_forgets_a_key() -> None:
    window = SlidingWindow(1, 60, FakeClock().monotonic)
    window.hit("a")
    window.reset("a")
    assert window.hit("a")


def test_idle_keys_are_dropped_and_memory_is_bounded() -> None:
    clock = FakeClock()
    window = SlidingWindow(1, 10, clock.monotonic, max_keys=3)
    for key in "abc":
        window.hit(key)
    assert window.key_count() == 3
    clock.advance(11)
    window.hit("d")  # a, b and c are idle: swept
    assert window.key_count() == 1
    for key in "efg":  # all live: the oldest is evicted to make room
        clock.advance(1)
        window.hit(key)
    assert window.key_count() == 3
    assert window.allowed("d")  # d (oldest) was evicted, so it starts afresh


def test_rejects_nonsense_limits() -> None:
    with pytest.raises(ValueError, match="limit"):
        SlidingWindow(0, 10)
    with pytest.raises(ValueError, match="window_s"):
        SlidingWindow(1, 0)
