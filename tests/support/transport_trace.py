"""Where an unclosed socket transport was made: opt-in with `PEERD_TRACE_TRANSPORTS=1`.

asyncio says only `unclosed transport <_SelectorSocketTransport fd=56 ...>` when it collects one
(a ResourceWarning, an error under `filterwarnings = error`), usually during a later test than
the one that leaked it. With the variable set, every socket transport remembers the stack that
made it, and each one collected unclosed is printed with that stack in the session's summary, with
the test that was running when it was made. It costs a stack walk per connection: off by default.
"""

from __future__ import annotations

import traceback
from asyncio import selector_events
from typing import Any

import pytest

ENV = "PEERD_TRACE_TRANSPORTS"
NOISE = ("/pluggy/", "/_pytest/", "/pytest_asyncio/", "/asyncio/base_events.py", "/asyncio/events.py")
_found: list[str] = []
_current = ["(outside any test)"]


def install() -> None:
    cls: Any = selector_events._SelectorSocketTransport
    base: Any = selector_events._SelectorTransport
    made, collected = cls.__init__, base.__del__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        frames = [f for f in traceback.format_stack(limit=40)[:-1] if not any(n in f for n in NOISE)]
        self._peerd_made = (_current[0], "".join(frames))
        made(self, *args, **kwargs)

    def delete(self: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_sock", None) is not None and hasattr(self, "_peerd_made"):
            test, stack = self._peerd_made
            _found.append(f"{self!r}\n  made during {test}\n{stack}")
        collected(self, *args, **kwargs)

    cls.__init__ = init
    base.__del__ = delete


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current[0] = item.nodeid
    yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _found:
        terminalreporter.section(f"{len(_found)} socket transport(s) collected unclosed")
        for entry in _found:
            terminalreporter.write_line(entry)
