"""State names in SQL text, made from the constants of the rule module that owns the states, so a
store never spells a state itself.

Rendered as literals, not bound as parameters: SQLite uses a partial index (`moves_open`,
`moves_unfinished`) only when the query's `IN (...)` list is the index's own, in the same order,
and never for a list of parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_NAME = re.compile(r"[a-z][a-z_]*")


def sql_list(names: Iterable[str]) -> str:
    """`('a', 'b')`: the names in the order given, each a plain lowercase word (nothing to quote)."""
    listed = list(names)
    if not listed or not all(_NAME.fullmatch(name) for name in listed):
        raise ValueError(f"not a list of state names: {listed!r}")
    return "(" + ", ".join(f"'{name}'" for name in listed) + ")"
