"""The owner's approvals of custom provider commands, each bound to the command's exact text."""

from __future__ import annotations

import hashlib

from peerd.store.db import Database


def command_digest(command: str) -> str:
    return hashlib.sha256(command.encode("utf-8")).hexdigest()


async def approve(db: Database, name: str, command: str, *, now: float) -> None:
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO provider_approvals (name, command_sha256, command, approved_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET command_sha256 = excluded.command_sha256,"
            " command = excluded.command, approved_at = excluded.approved_at",
            (name, command_digest(command), command, now),
        )


async def is_approved(db: Database, name: str, command: str) -> bool:
    row = await db.fetchone("SELECT command_sha256 FROM provider_approvals WHERE name = ?", (name,))
    return row is not None and row["command_sha256"] == command_digest(command)


async def revoke(db: Database, name: str) -> bool:
    async with db.write() as tx:
        cur = await tx.execute("DELETE FROM provider_approvals WHERE name = ?", (name,))
        return (cur.rowcount or 0) > 0
