"""Command receipts: the first result of every retried command, kept at least 7 days."""

from __future__ import annotations

import json
from typing import Any

from peerd.core.idempotency import Receipt
from peerd.store.db import Database, Tx


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


PRUNE_BATCH = 1000  # receipts deleted per transaction: the writer runs on the event loop


async def prune(db: Database, *, older_than: float, batch: int = PRUNE_BATCH) -> int:
    """Delete receipts older than `older_than`, `batch` per transaction (a store that has not been
    pruned for long never holds the loop for one big delete); the number deleted."""
    removed = 0
    while True:
        async with db.write() as tx:
            cur = await tx.execute(
                "DELETE FROM receipts WHERE rowid IN"
                " (SELECT rowid FROM receipts WHERE created_at < ? LIMIT ?)",
                (older_than, batch),
            )
            removed += cur.rowcount
        if cur.rowcount < batch:
            return removed
