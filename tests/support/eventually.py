"""`eventually()`: the one way a test waits for state that nothing reports.

Prefer an event when there is one (a long-poll such as `/v1/threads/{id}/wait` or `/events`, a
log line, an `asyncio.Event` a fake sets). When there is none (a row in another process's store, a
file a confined run writes, a process that has not exited yet), poll it with `eventually()`: a
bounded deadline, and a failure that names what was awaited and the last value seen.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

T = TypeVar("T")

_SHOWN = 600  # characters of the last value a failure quotes


def _truthy(value: object) -> bool:
    return bool(value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    *,
    what: str,
    within: float = 10.0,
    until: Callable[[T], object] = _truthy,
    every: float = 0.05,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    """Call `probe` (a function or an async function, e.g. `lambda: client.call(...)`) until
    `until(value)` holds (by default: the value is truthy), and return that value.

    `within` seconds after the first call it fails with an `AssertionError` saying that `what` was
    not seen and quoting the last value (or the last exception of the `ignoring` kinds, which count
    as "not yet"). The probe is called at least once, and once more at the deadline; a probe still
    running past the deadline is cancelled. `every` is the pause between calls.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = "nothing (no check returned)"
    while True:
        bound = asyncio.timeout_at(deadline + every)
        try:
            async with bound:
                value = probe()
                if inspect.isawaitable(value):
                    value = await value
            last = value
            if until(cast(T, value)):
                return cast(T, value)
        except TimeoutError:
            if not bound.expired():
                raise
            raise AssertionError(
                f"not seen within {within:g} s: {what} (the last check was still running); "
                f"last seen: {_shown(last)}"
            ) from None
        except ignoring as err:
            last = err
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"not seen within {within:g} s: {what}; last seen: {_shown(last)}")
        await asyncio.sleep(min(every, remaining))
