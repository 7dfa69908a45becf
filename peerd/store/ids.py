"""Object ids: a short type prefix and 80 random bits, readable in logs and CLIs."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store's Database, for the annotation only (ids.py stays import-light)
    from peerd.store.db import Database

# Where each kind of id lives, for `starting` (a fixed list: never a name from a request).
_ID_COLUMNS = {"threads": "id", "tasks": "id", "approvals": "id", "remote_approvals": "id"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


async def starting(db: Database, table: str, prefix: str, *, limit: int) -> list[str]:
    """Up to `limit` ids of `table` that start with `prefix`, in order (a range on the key:
    `prefix` is a type prefix and hex digits, so `prefix + "~"` is past every id starting so)."""
    column = _ID_COLUMNS[table]
    rows = await db.fetchall(
        f"SELECT {column} FROM {table} WHERE {column} >= ? AND {column} < ? ORDER BY 1 LIMIT ?",  # noqa: S608  # fixed names
        (prefix, prefix + "~", limit),
    )
    return [str(r[0]) for r in rows]
