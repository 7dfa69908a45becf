"""The one backoff schedule (`peerd/core/backoff.py`), pure: first, doubling, cap, jitter bounds;
and each retry loop's own numbers, as they were before the loops shared it."""

from __future__ import annotations

import random

import pytest

from peerd.core.backoff import Backoff
from peerd.handoff import machine as moves
from peerd.orchestrate import cleanup, context
from peerd.runtime import runner
from peerd.store import db
from peerd.tasks import rules


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


# --- each loop's schedule: its first delay, its cap and its jitter, as before ---------------------


def numbers(b: Backoff) -> tuple[float, float, float]:
    return b.first, b.cap, b.jitter


def test_the_follower_backs_off_from_2_s_to_5_minutes_plus_up_to_1_s() -> None:
    assert numbers(rules.LINK_BACKOFF) == (2.0, 300.0, 1.0)


def test_this_daemons_store_is_retried_from_2_s_to_30_s_plus_up_to_1_s() -> None:
    """The follower's own store faults and the task ender's retries (`tasks/timing.py:Retrier`)."""
    assert numbers(rules.STORE_RETRY) == (2.0, 30.0, 1.0)


def test_a_live_runs_store_writes_are_retried_from_half_a_second_to_30_s() -> None:
    assert numbers(runner.STORE_RETRY) == (0.5, 30.0, 0.0)


def test_a_move_is_retried_from_1_s_to_a_minute() -> None:
    assert numbers(moves.RETRY) == (1.0, 60.0, 0.0)


def test_orchestrations_wait_out_a_box_from_2_s_to_a_minute_and_owe_stops_up_to_5_minutes() -> None:
    assert numbers(context.UNREACHABLE_BACKOFF) == (2.0, 60.0, 0.0)
    assert numbers(cleanup.OWED_STOP_BACKOFF) == (2.0, 300.0, 0.0)


def test_a_locked_store_is_waited_for_from_1_ms_to_100_ms() -> None:
    assert numbers(db.BUSY_BACKOFF) == (0.001, 0.1, 0.0)
