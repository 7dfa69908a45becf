"""Links (laptop side): the right to act in another environment, with its token pair.

The refresh token is stored in plaintext here because this side must present it; the database
file is 0600. The box stores only its hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import aiosqlite

from peerd.contracts import LinkInfo, RuntimeMode
from peerd.core.fingerprint import format_fingerprint
from peerd.core.links import FINAL, LEADS_TO, LinkEvent, LinkStatus, is_final
from peerd.store.db import Database
from peerd.store.sqltext import sql_list


@dataclass(frozen=True)
class LinkRow:
    env_id: str
    label: str
    urls: tuple[str, ...]
    fingerprint: bytes
    access: RuntimeMode
    client_id: str
    refresh_token: str = field(repr=False)
    refresh_expires_at: float | None
    access_token: str | None = field(repr=False)
    access_expires_at: float | None
    linked_at: float
    last_reached_at: float | None = None
    last_error: str | None = None
    status: LinkStatus = "reachable"

    def info(self, *, now: float) -> LinkInfo:
        status = self.status
        if not is_final(status) and self.refresh_expires_at and self.refresh_expires_at < now:
            status = "expired"  # by time: computed here, never written (links.md, state machines)
        return LinkInfo(
            environment_id=self.env_id,
            label=self.label,
            urls=list(self.urls),
            access=self.access,
            fingerprint=format_fingerprint(self.fingerprint),
            status=status,
            linked_at=self.linked_at,
            last_reached_at=self.last_reached_at,
            last_error=self.last_error,
            expires_at=self.refresh_expires_at,
        )

    def with_tokens(
        self,
        *,
        refresh_token: str,
        refresh_expires_at: float | None,
        access_token: str,
        access_expires_at: float,
    ) -> LinkRow:
        return replace(
            self,
            refresh_token=refresh_token,
            refresh_expires_at=refresh_expires_at,
            access_token=access_token,
            access_expires_at=access_expires_at,
        )


def _row(r: aiosqlite.Row) -> LinkRow:
    return LinkRow(
        env_id=r["env_id"],
        label=r["label"],
        urls=tuple(json.loads(r["urls"])),
        fingerprint=bytes.fromhex(r["fingerprint"]),
        access=r["access"],
        client_id=r["client_id"],
        refresh_token=r["refresh_token"],
        refresh_expires_at=r["refresh_expires_at"],
        access_token=r["access_token"],
        access_expires_at=r["access_expires_at"],
        linked_at=r["linked_at"],
        last_reached_at=r["last_reached_at"],
        last_error=r["last_error"],
        status=r["status"],
    )


async def upsert(db: Database, link: LinkRow) -> LinkRow | None:
    """Store a link, replacing any earlier link to the same environment; returns the one replaced."""
    async with db.write() as tx:
        async with tx.execute("SELECT * FROM links WHERE env_id = ?", (link.env_id,)) as cur:
            old = await cur.fetchone()
        await tx.execute("DELETE FROM links WHERE env_id = ?", (link.env_id,))
        await tx.execute(
            "INSERT INTO links (env_id, label, urls, fingerprint, access, client_id, refresh_token,"
            " refresh_expires_at, access_token, access_expires_at, linked_at, last_reached_at, last_error, status)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                link.env_id,
                link.label,
                json.dumps(list(link.urls)),
                link.fingerprint.hex(),
                link.access,
                link.client_id,
                link.refresh_token,
                link.refresh_expires_at,
                link.access_token,
                link.access_expires_at,
                link.linked_at,
                link.last_reached_at,
                link.last_error,
                link.status,
            ),
        )
    return None if old is None else _row(old)


async def get(db: Database, env_id: str) -> LinkRow | None:
    row = await db.fetchone("SELECT * FROM links WHERE env_id = ?", (env_id,))
    return None if row is None else _row(row)


async def all_links(db: Database) -> list[LinkRow]:
    return [_row(r) for r in await db.fetchall("SELECT * FROM links ORDER BY linked_at")]


async def delete(db: Database, env_id: str) -> None:
    async with db.write() as tx:
        await tx.execute("DELETE FROM links WHERE env_id = ?", (env_id,))


async def save_tokens(db: Database, link: LinkRow) -> None:
    """Persist a rotated token pair: done before the new access token is used."""
    async with db.write() as tx:
        await tx.execute(
            "UPDATE links SET refresh_token = ?, refresh_expires_at = ?, access_token = ?, access_expires_at = ?"
            " WHERE env_id = ? AND client_id = ?",
            (
                link.refresh_token,
                link.refresh_expires_at,
                link.access_token,
                link.access_expires_at,
                link.env_id,
                link.client_id,
            ),
        )


# The status rule of core/links.py, in SQL: a link that ended (revoked, expired) is never written
# again, whatever answer arrives late, even when two writers race (SQLite runs one UPDATE at a time).
_OUTCOME = (
    "UPDATE links SET status = ?, last_error = ?, last_reached_at = coalesce(?, last_reached_at)"  # noqa: S608  # constants
    f" WHERE env_id = ? AND status NOT IN {sql_list(FINAL)}"
)


async def record_outcome(
    db: Database, env_id: str, *, event: LinkEvent, error: str | None, reached_at: float | None
) -> bool:
    """What the box's answer (or silence) makes of the link (`core/links.py:next_status`), with the
    last error and when it was reached; False when the link had ended (or is gone): nothing written."""
    async with db.write() as tx:
        cur = await tx.execute(_OUTCOME, (LEADS_TO[event], error, reached_at, env_id))
        return cur.rowcount > 0
