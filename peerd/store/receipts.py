"""Command receipts: the first result of every retried command, kept at least 7 days."""

from __future__ import annotations

import json
from typing import Any

from peerd.core.idempotency import Receipt
from peerd.store.db import Tx


async def find(tx: Tx, namespace: str, op: str, command_id: str) -> Receipt | None:
    async with tx.execute(
        "SELECT request_hash, result FROM receipts WHERE namespace = ? AND op = ? AND command_id = ?",
        (namespace, op, command_id),
    ) as cur:
        row = await cur.fetchone()
    if row is None:
        return None
    return Receipt(namespace, op, command_id, row["request_hash"], json.loads(row["result"]))


async def record(
    tx: Tx,
    *,
    namespace: str,
    op: str,
    command_id: str,
    request_hash: str,
    result: dict[str, Any],
    now: float,
) -> None:
    await tx.execute(
        "INSERT INTO receipts (namespace, op, command_id, request_hash, result, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (namespace, op, command_id, request_hash, json.dumps(result), now),
    )


async def prune(tx: Tx, *, older_than: float) -> int:
    cur = await tx.execute("DELETE FROM receipts WHERE created_at < ?", (older_than,))
    return cur.rowcount
