"""Text and times for people, shared by the CLI and the console; standard library only (the CLI
imports it at start-up: tests/integration/test_cli_startup.py).

Much of what is shown came from peers (client labels, box labels, thread titles, agent output),
so every value goes through `one_line` and every block of text through `block`
(`core.text.strip_controls`): a label cannot move the cursor, clear the screen, retitle the
terminal or hide text, and a title with a line break stays on its row.

Times: the daemon sends epoch seconds (or ISO 8601); people see `ago` ("3 min ago") in tables and
`when` ("2026-05-01 14:03:07 CEST, 3 min ago") in a single record's fields.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from peerd.core.text import strip_controls


def one_line(value: Any) -> str:
    """A cell or field value for the terminal: text, no controls, no line breaks."""
    return "" if value is None else strip_controls(str(value))


def block(text: str) -> str:
    """Multi-line text for the terminal: line breaks and tabs kept, every other control removed."""
    return strip_controls(text, multiline=True)


def as_datetime(value: Any) -> datetime | None:
    """A time the daemon sent (epoch seconds, or ISO 8601 with or without a zone: UTC) as an
    aware datetime; None for anything else."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    return None


def _span(seconds: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}"
    return f"{int(seconds)} s"


def ago(value: Any, *, now: float | None = None) -> str:
    """A time relative to now, for tables: `3 min ago`, `in 2 h`, `just now`; '' when unset."""
    moment = as_datetime(value)
    if moment is None:
        return "" if value is None else one_line(value)
    delta = (time.time() if now is None else now) - moment.timestamp()
    if abs(delta) < 5:
        return "just now"
    return f"{_span(delta)} ago" if delta > 0 else f"in {_span(-delta)}"


def local_time(value: Any) -> str:
    """A time in this machine's local time with its zone: `2026-05-01 14:03:07 CEST`."""
    moment = as_datetime(value)
    if moment is None:
        return "" if value is None else one_line(value)
    local = moment.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.strftime("%Z") or local.strftime("%z"))


def when(value: Any, *, now: float | None = None) -> str:
    """A time for a record's fields: local time with zone, then how long ago (or until)."""
    if as_datetime(value) is None:
        return ago(value)
    return f"{local_time(value)}, {ago(value, now=now)}"
