"""Agents' OAuth sign-ins on the box (issue 29): registered clients, authorization codes, and the
exchange that makes a signed-in agent a client of the box (`clients` row, kind `agent`).

- An agent pairing code (`pairing_codes.purpose = 'agent'`) approves one authorization request:
  right secret, the code is spent and a one-minute authorization code is stored (hashed) bound to
  the OAuth client, its redirect URI, the PKCE challenge and the resource. A wrong secret counts
  toward burning the code as for links (`MAX_FAILED_ATTEMPTS`). A link's code is unknown here, and
  an agent's code is unknown to a link's redemption (`clients.redeem_pairing_code`).
- The exchange checks the code (`core.agent_oauth.code_verdict`) in one transaction. Any refused
  presentation of a live code spends it (no second try at a verifier); a code presented again after
  it minted a client revokes that client (RFC 6749 §4.1.2). The refusal is raised after the commit.

Only hashes of codes are stored; the plaintext authorization code is returned once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from peerd.core.agent_oauth import AUTH_CODE_TTL_S, StoredCode, code_verdict, signin_expiry
from peerd.core.pairing_code import secret_hash
from peerd.core.text import clean_label
from peerd.errors import AuthCodeReason, AuthCodeRejected, PairingRejected
from peerd.store import clients
from peerd.store.db import Database, Tx
from peerd.store.ids import new_id
from peerd.store.pairing import MAX_FAILED_ATTEMPTS, code_state

KEEP_S = 24 * 3600.0  # spent codes are kept this long past their expiry (a reuse still revokes)
CODE_REUSE_REASON = "An authorization code was used twice; the sign-in it made was revoked to be safe."
MAX_METADATA_BYTES = 8192

AUTH_CODE_TEXTS: dict[AuthCodeReason, str] = {
    "unknown": "This authorization code is not one this peerd issued; sign in again.",
    "reused": "This authorization code was already used; the sign-in it made was revoked. Sign in again.",
    "expired": "This authorization code expired (they last a minute); sign in again.",
    "pkce": "The code_verifier does not match the code_challenge of the authorization request.",
    "redirect_uri": "redirect_uri differs from the authorization request's.",
    "client": "This authorization code was issued to another client.",
    "resource": "resource differs from the authorization request's.",
}


def _hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True)
class Approved:
    code: str = field(repr=False)
    access: str


async def register_client(db: Database, metadata: dict[str, Any], *, now: float) -> str:
    """Store a dynamically registered client (RFC 7591; the metadata checked by the caller)."""
    text = json.dumps(metadata, separators=(",", ":"))
    if len(text.encode()) > MAX_METADATA_BYTES:
        raise ValueError("client metadata too large")  # the caller bounds every field first
    client_id = new_id("dcr")
    async with db.write() as tx:
        # Registrations a day old that never signed in go (a registration costs nothing to make);
        # one a sign-in was made with stays, so the agent signs in again as itself.
        await tx.execute(
            "DELETE FROM oauth_clients WHERE created_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM auth_codes a WHERE a.oauth_client_id = oauth_clients.client_id)"
            " AND NOT EXISTS (SELECT 1 FROM clients c WHERE c.kind = 'agent'"
            " AND json_extract(c.agent, '$.client_id') = oauth_clients.client_id)",
            (now - KEEP_S,),
        )
        await tx.execute(
            "INSERT INTO oauth_clients (client_id, metadata, created_at) VALUES (?, ?, ?)",
            (client_id, text, now),
        )
    return client_id


async def registered_client(db: Database, client_id: str) -> dict[str, Any] | None:
    row = await db.lookup("SELECT metadata FROM oauth_clients WHERE client_id = ?", (client_id,))
    if row is None:
        return None
    value: dict[str, Any] = json.loads(row["metadata"])
    return value


async def approve(
    db: Database,
    *,
    code_id: str,
    secret: str,
    oauth_client_id: str,
    client_name: str | None,
    redirect_uri: str,
    code_challenge: str,
    resource: str,
    now: float,
) -> Approved:
    """Spend an open agent pairing code for a new authorization code; `PairingRejected` if not."""
    failure: PairingRejected | None = None
    async with db.write() as tx:
        async with tx.execute(
            "SELECT * FROM pairing_codes WHERE id = ? AND purpose = 'agent'", (code_id,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            raise clients.pairing_rejected("unknown_code")
        state = code_state(row, now)
        if state != "open":
            raise clients.pairing_rejected(state)
        if not hmac.compare_digest(row["secret_hash"], secret_hash(secret)):
            attempts = int(row["failed_attempts"]) + 1
            burnt = attempts >= MAX_FAILED_ATTEMPTS
            await tx.execute(
                "UPDATE pairing_codes SET failed_attempts = ?, state = ? WHERE id = ?",
                (attempts, "burnt" if burnt else "open", code_id),
            )
            failure = clients.pairing_rejected("burnt" if burnt else "wrong_secret")
        else:
            await tx.execute("UPDATE pairing_codes SET state = 'used' WHERE id = ?", (code_id,))
            code = await issue_code(
                tx,
                oauth_client_id=oauth_client_id,
                client_name=client_name,
                redirect_uri=redirect_uri,
                code_challenge=code_challenge,
                resource=resource,
                access=row["access"],
                max_age_s=row["max_age_s"],
                approved_by=code_id,
                now=now,
            )
            access = str(row["access"])
    if failure is not None:
        raise failure  # after the commit: the counted attempt (or the burn) must stick
    return Approved(code, access)


async def issue_code(
    tx: Tx,
    *,
    oauth_client_id: str,
    client_name: str | None,
    redirect_uri: str,
    code_challenge: str,
    resource: str,
    access: str,
    max_age_s: float | None,
    approved_by: str,
    now: float,
) -> str:
    """A new authorization code for an approved request (`approved_by`: the pairing code's id, or
    the console request's, `signin_requests.id`); only its hash is stored."""
    await tx.execute("DELETE FROM auth_codes WHERE expires_at < ?", (now - KEEP_S,))
    code = secrets.token_urlsafe(32)
    await tx.execute(
        "INSERT INTO auth_codes (code_hash, oauth_client_id, client_name, redirect_uri, code_challenge,"
        " resource, access, max_age_s, pairing_code_id, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            _hash(code),
            oauth_client_id,
            (clean_label(client_name)[:200] or None) if client_name else None,
            redirect_uri,
            code_challenge,
            resource,
            access,
            max_age_s,
            approved_by,
            now,
            now + AUTH_CODE_TTL_S,
        ),
    )
    return code


async def exchange(
    db: Database,
    *,
    code: str,
    client_id: str | None,
    redirect_uri: str | None,
    verifier: str | None,
    resource: str | None,
    now: float,
    refresh_ttl_s: float = clients.REFRESH_TTL_S,
) -> clients.Redeemed:
    """Trade an authorization code for a new agent client and its first refresh token."""
    failure: AuthCodeRejected | None = None
    async with db.write() as tx:
        async with tx.execute("SELECT * FROM auth_codes WHERE code_hash = ?", (_hash(code),)) as cur:
            row = await cur.fetchone()
        stored = None
        if row is not None:
            stored = StoredCode(
                oauth_client_id=row["oauth_client_id"],
                redirect_uri=row["redirect_uri"],
                code_challenge=row["code_challenge"],
                resource=row["resource"],
                expires_at=row["expires_at"],
                used=row["used_at"] is not None,
            )
        reason = code_verdict(
            stored,
            client_id=client_id,
            redirect_uri=redirect_uri,
            verifier=verifier,
            resource=resource,
            now=now,
        )
        if reason is not None:
            if row is not None and reason == "reused" and row["client_id"] is not None:
                await clients.revoke_in(tx, row["client_id"], CODE_REUSE_REASON, now)
            elif row is not None and reason != "reused":
                # A live code refused once is spent: no second guess at a verifier.
                await tx.execute(
                    "UPDATE auth_codes SET used_at = ? WHERE code_hash = ?", (now, row["code_hash"])
                )
            failure = AuthCodeRejected(AUTH_CODE_TEXTS[reason], reason=reason)
        else:
            assert row is not None  # noqa: S101  # code_verdict said so
            expires_at = signin_expiry(now, row["max_age_s"])
            new_client = new_id("cli")
            agent = {
                "client_id": row["oauth_client_id"],
                "name": row["client_name"],
                "redirect_uri": row["redirect_uri"],
            }
            label = row["client_name"] or row["oauth_client_id"][:200]
            await tx.execute(
                "INSERT INTO clients (id, label, env_id, access, created_at, expires_at, kind, agent)"
                " VALUES (?, ?, NULL, ?, ?, ?, 'agent', ?)",
                (new_client, label, row["access"], now, expires_at, json.dumps(agent, separators=(",", ":"))),
            )
            await tx.execute(
                "UPDATE auth_codes SET used_at = ?, client_id = ? WHERE code_hash = ?",
                (now, new_client, row["code_hash"]),
            )
            await tx.execute(
                "UPDATE pairing_codes SET client_id = ? WHERE id = ?", (new_client, row["pairing_code_id"])
            )
            token, refresh_expires_at = await clients.issue_refresh(
                tx, new_client, expires_at, now, refresh_ttl_s
            )
            info = clients.client_info(await clients.client_in(tx, new_client), now)
    if failure is not None:
        raise failure  # after the commit: the spent code and a revocation must stick
    return clients.Redeemed(info, token, refresh_expires_at)
