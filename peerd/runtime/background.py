"""Work in a thread of its own that never holds up the process's exit: the heavy SDKs (MCP's, the
A2A face's) are imported on first need this way, so the event loop keeps answering meanwhile and
a SIGTERM does not wait for an import (as the default executor's threads would be waited for by
`asyncio.run`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")


def in_daemon_thread(fn: Callable[..., T], *args: Any, name: str = "peerd-background") -> asyncio.Future[T]:
    """`fn(*args)` in a daemon thread; the future settles on the running loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, which logs it
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name=name, daemon=True).start()
    return done


def import_in_thread(module: str) -> asyncio.Future[ModuleType]:
    """`importlib.import_module(module)`, off the event loop."""
    return in_daemon_thread(importlib.import_module, module, name=f"peerd-import-{module}")
