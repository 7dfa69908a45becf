"""One backoff schedule, pure: the delay before retry number `attempt` is a function of the attempt.

    Backoff(first, cap, jitter).delay(attempt, fraction)
        = min(cap, first * 2 ** (attempt - 1)) + jitter * fraction

`attempt` 1 is the first retry (waits `first`); each one doubles it up to `cap`, with no attempt
limit and no overflow however large `attempt` grows. `jitter` is the most seconds added on top,
`fraction` the caller's draw in [0, 1] (clamped): the randomness is injected, so the state machines
that use a schedule stay deterministic under test. Every retry loop in peerd takes its delays from
one of these (each names its own `first`, `cap` and `jitter` beside the loop).

Written here rather than taken from `tenacity` (whose `wait_exponential` computes the same first
term): its waits read a `RetryCallState` (built for its own retry controller, which none of these
loops can use: their attempts are stored, their sleeps cut short by events) and its jittered waits
draw from the global `random`, where ours must take the draw as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

_MAX_DOUBLINGS = 1000  # 2.0 ** 1000 is finite; any cap is reached long before


@dataclass(frozen=True)
class Backoff:
    first: float  # seconds before the first retry
    cap: float  # the longest wait before the jitter
    jitter: float = 0.0  # at most this many seconds added to each wait

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap or self.jitter < 0:
            raise ValueError(f"a backoff needs 0 < first <= cap and jitter >= 0, not {self}")

    def delay(self, attempt: int, fraction: float = 0.0) -> float:
        """Seconds to wait before retry number `attempt` (1 = the first), with `fraction` of the
        jitter (a draw in [0, 1]; outside it is clamped)."""
        doublings = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
        base = min(self.cap, self.first * 2.0**doublings)
        return base + self.jitter * min(max(fraction, 0.0), 1.0)

    def longest(self, attempt: int) -> float:
        """The most `delay(attempt, ...)` can be: with the whole jitter."""
        return self.delay(attempt, 1.0)
