"""Pairing codes on the box: minted over the local socket, redeemed once by a laptop.

Only the SHA-256 of a code's secret is stored; the plaintext is returned once, to be printed.
The state column holds `open`, `used`, `burnt` or `cancelled`; `expired` is never written but
computed for an open code past its `expires_at`, so expiry needs no sweeper. Redemption (which
spends the code and creates a client) lives in `peerd.store.clients`, in one transaction.

A code's lifetime and the link's max age are checked before anything is stored: finite, positive
and bounded, since a stored Infinity would only fail later, at redemption, after the code is spent.
"""

from __future__ import annotations

import math

import aiosqlite

from peerd.contracts import MAX_LINK_AGE_S, PairingCodeInfo, PairingPurpose, PairingState
from peerd.core.access import AccessLevel
from peerd.core.pairing_code import new_code_id, new_secret, secret_hash
from peerd.core.text import clean_label
from peerd.errors import Conflict, InvalidRequest, NotFound
from peerd.store.db import Database

# A failed attempt counter reaching this burns the code (issue 3: "5 wrong attempts").
MAX_FAILED_ATTEMPTS = 5
MAX_CODE_TTL_S = 24 * 3600.0


def check_max_age(max_age_s: float | None) -> float | None:
    """A link's max age if it is a positive, finite number of seconds within ten years."""
    if max_age_s is None:
        return None
    if not math.isfinite(max_age_s) or not 0 < max_age_s <= MAX_LINK_AGE_S:
        raise InvalidRequest(
            f"max_age must be a positive number of seconds, at most {int(MAX_LINK_AGE_S)} (ten years)."
        )
    return max_age_s


def code_state(row: aiosqlite.Row, now: float) -> PairingState:
    state: PairingState = row["state"]
    if state == "open" and row["expires_at"] <= now:
        return "expired"
    return state


def code_info(row: aiosqlite.Row, now: float) -> PairingCodeInfo:
    return PairingCodeInfo(
        id=row["id"],
        access=row["access"],
        label_hint=row["label_hint"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        state=code_state(row, now),
        failed_attempts=row["failed_attempts"],
        client_id=row["client_id"],
        purpose=row["purpose"],
    )


def not_found(code_id: str) -> NotFound:
    return NotFound(f"No pairing code {code_id} here. `peerd pair list` shows them.")


async def create_code(
    db: Database,
    *,
    access: AccessLevel,
    ttl_s: float,
    label_hint: str | None,
    max_age_s: float | None,
    now: float,
    purpose: PairingPurpose = "link",
) -> tuple[PairingCodeInfo, str]:
    """A new open code and its plaintext secret (the only time the secret exists outside a code)."""
    if not math.isfinite(ttl_s) or not 0 < ttl_s <= MAX_CODE_TTL_S:
        raise InvalidRequest(f"A pairing code's lifetime is more than 0 and at most {int(MAX_CODE_TTL_S)} s.")
    max_age_s = check_max_age(max_age_s)
    label_hint = (clean_label(label_hint) or None) if label_hint is not None else None
    code_id = new_code_id()
    secret = new_secret()
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO pairing_codes (id, secret_hash, access, label_hint, max_age_s, created_at,"
            " expires_at, purpose) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (code_id, secret_hash(secret), access, label_hint, max_age_s, now, now + ttl_s, purpose),
        )
    info = PairingCodeInfo(
        id=code_id,
        access=access,
        label_hint=label_hint,
        created_at=now,
        expires_at=now + ttl_s,
        state="open",
        failed_attempts=0,
        purpose=purpose,
    )
    return info, secret


async def list_codes(db: Database, *, now: float, include_done: bool = False) -> list[PairingCodeInfo]:
    """Codes oldest first; without `include_done`, only the ones that can still be redeemed."""
    if include_done:
        rows = await db.fetchall("SELECT * FROM pairing_codes ORDER BY created_at, rowid")
    else:
        rows = await db.fetchall(
            "SELECT * FROM pairing_codes WHERE state = 'open' AND expires_at > ? ORDER BY created_at, rowid",
            (now,),
        )
    return [code_info(r, now) for r in rows]


async def cancel_code(db: Database, code_id: str, *, now: float) -> PairingCodeInfo:
    """Make a code unusable. Idempotent for codes that are already unusable; a used code is a
    conflict, because cancelling it would not undo the link it made."""
    async with db.write() as tx:
        async with tx.execute("SELECT * FROM pairing_codes WHERE id = ?", (code_id,)) as cur:
            row = await cur.fetchone()
        if row is None:
            raise not_found(code_id)
        if row["state"] == "used":
            raise Conflict(
                f"Pairing code {code_id} was already used by client {row['client_id']}; cancelling it "
                f"would not undo that link. Revoke it with `peerd client revoke {row['client_id']}`."
            )
        info = code_info(row, now)
        if row["state"] == "open":  # expired ones too: cancelled says more than expired
            await tx.execute("UPDATE pairing_codes SET state = 'cancelled' WHERE id = ?", (code_id,))
            info = info.model_copy(update={"state": "cancelled"})
    return info
