"""Clients on the box: laptops that redeemed a pairing code, and their rotating refresh tokens.

Refresh tokens are stored only as SHA-256 hashes. Each use rotates the token (the old row keeps
`rotated_at`); presenting a rotated token again means two parties hold it, so the whole client is
revoked (RFC 9700 §4.14.2 reuse detection). A client is active while it is not revoked, not past
its hard `expires_at` (`--max-age`) and its newest refresh token has not lapsed (sliding lifetime).

Some failures must leave a trace even though the call fails: a wrong pairing secret counts toward
burning the code, and a reused refresh token revokes the client. Those are written in the
transaction, which commits, and the error is raised after it, never inside it (that would roll
the trace back).

Everything a laptop sends with a redemption (label, environment id, max age) is checked and
cleaned by `check_redemption` before the transaction that spends the code: a bad value is a typed
`invalid_request`, and the code stays open with no client made. The label is stripped of control
characters (it is printed in `peerd client list` and carried on the threads the link starts).
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from peerd.contracts import MAX_LINK_AGE_S, ClientInfo, ClientStatus
from peerd.core.access import AccessLevel, access_within
from peerd.core.credentials import new_refresh_token, refresh_hash
from peerd.core.pairing_code import secret_hash
from peerd.core.text import clean_label
from peerd.errors import (
    AccessExceedsCode,
    InvalidRequest,
    NotFound,
    PairingReason,
    PairingRejected,
    RefreshReason,
    RefreshRejected,
)
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.store.pairing import MAX_FAILED_ATTEMPTS, check_max_age, code_state

REFRESH_TTL_S = 30 * 24 * 3600
TOUCH_INTERVAL_S = 30.0
REUSE_REASON = "A refresh token was used twice; the link was revoked to be safe."
UNLINKED_REASON = "The linked machine unlinked itself."
MAX_LABEL_CHARS = 200
MAX_ENV_ID_CHARS = 64


@dataclass(frozen=True)
class Redeemed:
    client: ClientInfo
    refresh_token: str = field(repr=False)
    refresh_expires_at: float


@dataclass(frozen=True)
class Rotated:
    client: ClientInfo
    refresh_token: str = field(repr=False)
    refresh_expires_at: float


# A code that is not open, by its (stored or computed) state.
_CLOSED: dict[str, PairingReason] = {s: s for s in ("expired", "used", "burnt", "cancelled")}

_PAIRING_MESSAGES: dict[PairingReason, str] = {
    "unknown_code": "No such pairing code here; run `peerd pair` for a new one.",
    "wrong_secret": (
        f"The pairing code's secret does not match; copy the whole code again. After "
        f"{MAX_FAILED_ATTEMPTS} wrong attempts a code is burnt."
    ),
    "expired": "This pairing code expired; run `peerd pair` for a new one.",
    "used": "This pairing code was already used; run `peerd pair` for a new one.",
    "burnt": "This pairing code saw too many wrong attempts and was burnt; run `peerd pair` for a new one.",
    "cancelled": "This pairing code was cancelled; run `peerd pair` for a new one.",
}

_REFRESH_MESSAGES: dict[RefreshReason, str] = {
    "unknown": "This refresh token is not one this peerd issued; link again with a new pairing code.",
    "reused": REUSE_REASON + " Link again with a new pairing code.",
    "revoked": "This link was revoked; link again with a new pairing code.",
    "expired": "This link expired; link again with a new pairing code.",
}


@dataclass(frozen=True)
class RedemptionInput:
    """What a laptop sent with a redemption, checked and cleaned (see `check_redemption`)."""

    label: str | None
    env_id: str | None
    max_age_s: float | None


def _clean_optional(text: str | None) -> str | None:
    return (clean_label(text) or None) if text is not None else None


def check_redemption(*, label: str | None, env_id: str | None, max_age_s: float | None) -> RedemptionInput:
    """The laptop's label, environment id and max age made safe to store, or `InvalidRequest`."""
    if label is not None and len(label) > MAX_LABEL_CHARS:
        raise InvalidRequest(f"client_label is at most {MAX_LABEL_CHARS} characters.")
    if env_id is not None and len(env_id) > MAX_ENV_ID_CHARS:
        raise InvalidRequest(f"client_env_id is at most {MAX_ENV_ID_CHARS} characters.")
    return RedemptionInput(
        label=_clean_optional(label), env_id=_clean_optional(env_id), max_age_s=check_max_age(max_age_s)
    )


def pairing_rejected(reason: PairingReason) -> PairingRejected:
    return PairingRejected(_PAIRING_MESSAGES[reason], reason=reason)


def access_exceeds_code(requested: AccessLevel, ceiling: AccessLevel) -> AccessExceedsCode:
    return AccessExceedsCode(
        f"Access {requested} is above this pairing code's ceiling ({ceiling}). Link with "
        f"--access {ceiling} or lower, or make a new code with `peerd pair --access {requested}`.",
        requested=requested,
        ceiling=ceiling,
    )


def refresh_rejected(reason: RefreshReason, client_id: str | None = None) -> RefreshRejected:
    return RefreshRejected(_REFRESH_MESSAGES[reason], reason=reason, client_id=client_id)


# `refresh_expires_at`: the newest refresh token's expiry, which is when a sliding link lapses.
_SELECT = (
    "SELECT c.*, (SELECT max(r.expires_at) FROM refresh_tokens r WHERE r.client_id = c.id)"
    " AS refresh_expires_at FROM clients c"
)


def client_status(row: aiosqlite.Row, now: float) -> ClientStatus:
    if row["revoked_at"] is not None:
        return "revoked"
    if row["expires_at"] is not None and row["expires_at"] <= now:
        return "expired"
    if row["refresh_expires_at"] is not None and row["refresh_expires_at"] <= now:
        return "expired"
    return "active"


def client_info(row: aiosqlite.Row, now: float) -> ClientInfo:
    return ClientInfo(
        id=row["id"],
        label=row["label"],
        environment_id=row["env_id"],
        access=row["access"],
        created_at=row["created_at"],
        last_seen_at=row["last_seen_at"],
        last_address=row["last_address"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        revoked_reason=row["revoked_reason"],
        status=client_status(row, now),
        kind=row["kind"],
        agent_name=_agent_name(row["agent"]),
        lapses_at=lapses_at(row),
    )


def lapses_at(row: aiosqlite.Row) -> float | None:
    """The sooner of the client's hard expiry and its newest refresh token's (None: neither)."""
    sliding = row["refresh_expires_at"] if "refresh_expires_at" in row.keys() else None  # noqa: SIM118
    found = [t for t in (row["expires_at"], sliding) if t is not None]
    return min(found) if found else None


def _agent_name(agent: str | None) -> str | None:
    """A signed-in agent's name (its OAuth client_name, else its client id)."""
    if agent is None:
        return None
    data = json.loads(agent)
    name = data.get("name") or data.get("client_id")
    return str(name) if name else None


async def _one(tx: Tx, sql: str, params: tuple[Any, ...]) -> aiosqlite.Row | None:
    async with tx.execute(sql, params) as cur:
        row: aiosqlite.Row | None = await cur.fetchone()
        return row


async def client_in(tx: Tx, client_id: str) -> aiosqlite.Row:
    row = await _one(tx, _SELECT + " WHERE c.id = ?", (client_id,))
    if row is None:
        raise RuntimeError(f"client {client_id} vanished inside its own transaction")
    return row


async def issue_refresh(
    tx: Tx, client_id: str, client_expires_at: float | None, now: float, ttl_s: float
) -> tuple[str, float]:
    # Never outlive the link's hard max age: a refresh past it would be refused anyway, and the
    # laptop learns the real deadline from `refresh_expires_in`.
    expires_at = now + ttl_s if client_expires_at is None else min(now + ttl_s, client_expires_at)
    token = new_refresh_token()
    await tx.execute(
        "INSERT INTO refresh_tokens (token_hash, client_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
        (refresh_hash(token), client_id, now, expires_at),
    )
    return token, expires_at


async def revoke_in(tx: Tx, client_id: str, reason: str, now: float) -> None:
    # Idempotent: the first revocation's time and reason are the ones worth keeping.
    await tx.execute(
        "UPDATE clients SET revoked_at = ?, revoked_reason = ? WHERE id = ? AND revoked_at IS NULL",
        (now, reason, client_id),
    )


async def redeem_pairing_code(
    db: Database,
    *,
    code_id: str,
    secret: str,
    access: AccessLevel,
    label: str | None,
    env_id: str | None,
    max_age_s: float | None,
    now: float,
    refresh_ttl_s: float = REFRESH_TTL_S,
) -> Redeemed:
    """Spend an open code for a new client and its first refresh token, all in one transaction.

    The inputs are checked first (`check_redemption`): a bad one spends nothing."""
    given = check_redemption(label=label, env_id=env_id, max_age_s=max_age_s)
    failure: PairingRejected | None = None
    async with db.write() as tx:
        # A link's codes only: an agent's code (purpose 'agent') is unknown here, as a link's is to an
        # agent's sign-in (store/agent_signin.py).
        code = await _one(tx, "SELECT * FROM pairing_codes WHERE id = ? AND purpose = 'link'", (code_id,))
        if code is None:
            raise pairing_rejected("unknown_code")
        state = code_state(code, now)
        if state != "open":
            raise pairing_rejected(_CLOSED[state])
        if not hmac.compare_digest(code["secret_hash"], secret_hash(secret)):
            attempts = int(code["failed_attempts"]) + 1
            burnt = attempts >= MAX_FAILED_ATTEMPTS
            await tx.execute(
                "UPDATE pairing_codes SET failed_attempts = ?, state = ? WHERE id = ?",
                (attempts, "burnt" if burnt else "open", code_id),
            )
            failure = pairing_rejected("burnt" if burnt else "wrong_secret")
        elif not access_within(access, code["access"]):
            # The right secret with too wide a request: nothing is spent, the user may ask again.
            raise access_exceeds_code(access, code["access"])
        else:
            # A code stored before max ages were bounded may hold one that is not: refused before
            # anything is written, so the code is not spent.
            ages = [a for a in (_stored_max_age(code["max_age_s"]), given.max_age_s) if a is not None]
            expires_at = now + min(ages) if ages else None
            client_id = new_id("cli")
            await tx.execute(
                "INSERT INTO clients (id, label, env_id, access, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    client_id,
                    given.label or _clean_optional(code["label_hint"]) or given.env_id or "unnamed",
                    given.env_id,
                    access,
                    now,
                    expires_at,
                ),
            )
            await tx.execute(
                "UPDATE pairing_codes SET state = 'used', client_id = ? WHERE id = ?", (client_id, code_id)
            )
            token, refresh_expires_at = await issue_refresh(tx, client_id, expires_at, now, refresh_ttl_s)
            client = client_info(await client_in(tx, client_id), now)
    if failure is not None:
        raise failure  # after the commit: the counted attempt (or the burn) must stick
    return Redeemed(client, token, refresh_expires_at)


def _stored_max_age(value: float | None) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(
            "This pairing code holds an unusable max age; cancel it and make a new one with `peerd pair`."
        )
    return float(min(value, MAX_LINK_AGE_S))


async def rotate_refresh(
    db: Database, refresh_token: str, *, now: float, refresh_ttl_s: float = REFRESH_TTL_S
) -> Rotated:
    """Trade a refresh token for a new one (sliding lifetime); a second use revokes the client."""
    failure: RefreshRejected | None = None
    async with db.write() as tx:
        old = await _one(
            tx, "SELECT * FROM refresh_tokens WHERE token_hash = ?", (refresh_hash(refresh_token),)
        )
        if old is None:
            raise refresh_rejected("unknown")
        client_id: str = old["client_id"]
        row = await client_in(tx, client_id)
        if old["rotated_at"] is not None:
            await revoke_in(tx, client_id, REUSE_REASON, now)
            failure = refresh_rejected("reused", client_id)
        elif row["revoked_at"] is not None:
            raise refresh_rejected("revoked", client_id)
        elif old["expires_at"] <= now or (row["expires_at"] is not None and row["expires_at"] <= now):
            raise refresh_rejected("expired", client_id)
        else:
            await tx.execute(
                "UPDATE refresh_tokens SET rotated_at = ? WHERE token_hash = ?", (now, old["token_hash"])
            )
            token, refresh_expires_at = await issue_refresh(
                tx, client_id, row["expires_at"], now, refresh_ttl_s
            )
            client = client_info(await client_in(tx, client_id), now)
    if failure is not None:
        raise failure  # after the commit: the revocation must stick
    return Rotated(client, token, refresh_expires_at)


async def revoke_client(db: Database, client_id: str, *, reason: str, now: float) -> ClientInfo:
    """Revoke a client; revoking it again changes nothing and answers the same."""
    async with db.write() as tx:
        if await _one(tx, "SELECT id FROM clients WHERE id = ?", (client_id,)) is None:
            raise NotFound(f"No client {client_id} here. `peerd client list` shows them.")
        await revoke_in(tx, client_id, reason, now)
        row = await client_in(tx, client_id)
    return client_info(row, now)


async def revoke_by_refresh_token(db: Database, token: str, *, now: float) -> bool:
    """RFC 7009: revoke the client this refresh token belongs to, rotated or not; False if unknown."""
    async with db.write() as tx:
        row = await _one(
            tx, "SELECT client_id FROM refresh_tokens WHERE token_hash = ?", (refresh_hash(token),)
        )
        if row is None:
            return False
        await revoke_in(tx, row["client_id"], UNLINKED_REASON, now)
    return True


async def kind_of(db: Database, client_id: str) -> str | None:
    """`link` or `agent` (a signed-in outside agent), or None for an unknown client."""
    row = await db.lookup("SELECT kind FROM clients WHERE id = ?", (client_id,))
    return None if row is None else str(row["kind"])


async def active_client(db: Database, client_id: str, *, now: float) -> ClientInfo | None:
    """The client if it may act now (checked on every request, so revocation ends access at once)."""
    row = await db.lookup(_SELECT + " WHERE c.id = ?", (client_id,))
    if row is None:
        return None
    info = client_info(row, now)
    return info if info.status == "active" else None


async def touch(
    db: Database, client_id: str, *, address: str | None, now: float, known: ClientInfo | None = None
) -> bool:
    """Record that a client was seen; True when it wrote.

    Called on every authenticated request, so it writes at most once per `TOUCH_INTERVAL_S` per
    client unless the address changed. Pass `known` (e.g. from `active_client`) to skip the read.
    """
    if known is None:
        row = await db.lookup("SELECT last_seen_at, last_address FROM clients WHERE id = ?", (client_id,))
        if row is None:
            return False
        last_seen, last_address = row["last_seen_at"], row["last_address"]
    else:
        last_seen, last_address = known.last_seen_at, known.last_address
    if last_seen is not None and now - last_seen < TOUCH_INTERVAL_S and address == last_address:
        return False
    async with db.write() as tx:
        # The same test again under the write lock: a concurrent request may have just written.
        cur = await tx.execute(
            "UPDATE clients SET last_seen_at = ?, last_address = ? WHERE id = ?"
            " AND (last_seen_at IS NULL OR last_seen_at <= ? OR last_address IS NOT ?)",
            (now, address, client_id, now - TOUCH_INTERVAL_S, address),
        )
        wrote = cur.rowcount > 0
        await cur.close()
    return wrote


async def list_clients(db: Database, *, now: float) -> list[ClientInfo]:
    rows = await db.fetchall(_SELECT + " ORDER BY c.created_at, c.rowid")
    return [client_info(r, now) for r in rows]
