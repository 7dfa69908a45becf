"""Printing for people (aligned tables, short times) and for programs (`--json`).

Much of what is printed came from peers (client labels, box labels, thread titles, agent output),
so every table cell and field value goes through `one_line` and every block of text through
`block` (`core.text.strip_controls`): a label cannot move the cursor, clear the screen, retitle
the terminal or hide text. The stores strip labels too; this is the second line of defence.
`--json` output is JSON-escaped already.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

from peerd.core.text import strip_controls


def one_line(value: Any) -> str:
    """A cell or field value for the terminal: text, no controls, no line breaks."""
    return "" if value is None else strip_controls(str(value))


def block(text: str) -> str:
    """Multi-line text for the terminal: line breaks and tabs kept, every other control removed."""
    return strip_controls(text, multiline=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[one_line(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        click.echo(f"{key.ljust(width)}  {one_line(value)}")


def ago(ts: float | None) -> str:
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
