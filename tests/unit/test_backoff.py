"""The one backoff schedule (`peerd/core/backoff.py`), pure: first, doubling, cap, jitter bounds."""

from __future__ import annotations

import random

import pytest

from peerd.core.backoff import Backoff


def test_the_first_retry_waits_first_then_each_doubles_up_to_the_cap() -> None:
    b = Backoff(first=2.0, cap=300.0)
    assert [b.delay(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def test_attempt_zero_or_below_waits_first() -> None:
    b = Backoff(first=0.5, cap=30.0)
    assert b.delay(0) == b.delay(-3) == 0.5


def test_no_attempt_limit_and_no_overflow() -> None:
    b = Backoff(first=1e-3, cap=0.1, jitter=1.0)
    for attempt in (64, 1025, 10**6, 10**18):
        assert b.delay(attempt) == 0.1
        assert b.delay(attempt, 0.5) == pytest.approx(0.6)


def test_the_cap_bounds_the_wait_before_the_jitter() -> None:
    b = Backoff(first=3.0, cap=10.0, jitter=2.0)
    assert [b.delay(n) for n in range(1, 5)] == [3.0, 6.0, 10.0, 10.0], "never past the cap"
    assert b.delay(100, 0.999) == pytest.approx(11.998)
    assert b.longest(100) == 12.0


def test_jitter_adds_between_nothing_and_all_of_it() -> None:
    rng = random.Random(28)
    b = Backoff(first=2.0, cap=300.0, jitter=1.0)
    for _ in range(2_000):
        attempt, draw = rng.randint(1, 40), rng.random()
        base = b.delay(attempt)
        assert base <= b.delay(attempt, draw) < base + 1.0
        assert b.delay(attempt, draw) == pytest.approx(base + draw)
    assert b.delay(1, 0.0) == 2.0 and b.longest(1) == 3.0


@pytest.mark.parametrize("draw", [-5.0, 7.0, float("inf")])
def test_a_draw_outside_zero_to_one_is_clamped(draw: float) -> None:
    b = Backoff(first=2.0, cap=300.0, jitter=1.0)
    assert 2.0 <= b.delay(1, draw) <= 3.0


def test_no_jitter_means_the_same_delay_whatever_the_draw() -> None:
    b = Backoff(first=1.0, cap=60.0)
    assert b.delay(3, 0.0) == b.delay(3, 0.99) == 4.0


@pytest.mark.parametrize(
    ("first", "cap", "jitter"), [(0.0, 1.0, 0.0), (-1.0, 1.0, 0.0), (2.0, 1.0, 0.0), (1.0, 2.0, -0.1)]
)
def test_a_schedule_that_makes_no_sense_is_refused(first: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="a backoff needs"):
        Backoff(first=first, cap=cap, jitter=jitter)
