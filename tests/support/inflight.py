"""Whether something running in this event loop (a daemon started in the test's loop, a hub
driven directly) is waiting at a given place: the event for "a request is on the wire".

A task's await chain names the coroutines it is inside, outermost first; a long-poll handler
parked in `ChangeFeed.wait_any`, say, shows `ApprovalDesk.listing` ... `ChangeFeed.wait_any`. Out of
process (a `peerd serve` subprocess) nothing like this is visible: there a test can only sleep.
"""

from __future__ import annotations

import asyncio
from typing import Any


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """The qualified names of the coroutines `task` is inside, outermost first."""
    chain: list[str] = []
    obj: Any = task.get_coro()
    while obj is not None:
        code = getattr(obj, "cr_code", None) or getattr(obj, "gi_code", None)
        if code is None:
            break
        chain.append(code.co_qualname)
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    return chain


def awaiting(*where: str) -> list[asyncio.Task[Any]]:
    """The tasks of this loop whose await chain passes through every one of `where`."""
    return [t for t in asyncio.all_tasks() if all(w in await_chain(t) for w in where)]
