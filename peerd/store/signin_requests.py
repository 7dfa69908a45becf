"""Sign-ins the owner approves in the console instead of with a typed code (issue 29).

The person on the sign-in page asks the owner; the request is stored `pending` with the
authorization request it stands for (client, redirect URI, PKCE challenge, resource) and the hash
of a poll secret the person's browser holds (a cookie). The owner approves it at an access level or
denies it (`decide`). The browser's next poll (`collect`, with its secret) turns an approved
request into an authorization code (`agent_signin.issue_code`) and marks it `done`: a request
yields at most one code, and only to the browser that asked. A request lasts `REQUEST_TTL_S`; at
most `MAX_PENDING` wait at once (more is `rate_limited`: nobody floods the owner's list).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Literal

import aiosqlite

from peerd.contracts import SigninRequestInfo
from peerd.core.access import AccessLevel
from peerd.core.text import clean_label
from peerd.errors import Conflict, NotFound, RateLimited
from peerd.store.agent_signin import issue_code
from peerd.store.db import Database
from peerd.store.ids import new_id

REQUEST_TTL_S = 600.0
MAX_PENDING = 20
Collected = Literal["pending", "approved", "denied", "gone"]


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _state(row: aiosqlite.Row, now: float) -> str:
    state = str(row["state"])
    return "expired" if state in ("pending", "approved") and row["expires_at"] <= now else state


def info(row: aiosqlite.Row, now: float) -> SigninRequestInfo:
    return SigninRequestInfo(
        id=row["id"],
        client_id=row["oauth_client_id"],
        client_name=row["client_name"],
        redirect_uri=row["redirect_uri"],
        state=_state(row, now),
        access=row["access"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
    )


@dataclass(frozen=True)
class Asked:
    request: SigninRequestInfo
    poll_secret: str = field(repr=False)


async def ask(
    db: Database,
    *,
    oauth_client_id: str,
    client_name: str | None,
    redirect_uri: str,
    code_challenge: str,
    resource: str,
    oauth_state: str | None,
    now: float,
) -> Asked:
    secret = secrets.token_urlsafe(32)
    request_id = new_id("sir")
    async with db.write() as tx:
        async with tx.execute(
            "SELECT count(*) FROM signin_requests WHERE state = 'pending' AND expires_at > ?", (now,)
        ) as cur:
            row = await cur.fetchone()
        if row is not None and int(row[0]) >= MAX_PENDING:
            raise RateLimited(f"{MAX_PENDING} sign-ins already wait for the owner; try again later.")
        await tx.execute("DELETE FROM signin_requests WHERE expires_at < ?", (now - 86400.0,))
        await tx.execute(
            "INSERT INTO signin_requests (id, poll_hash, oauth_client_id, client_name, redirect_uri,"
            " code_challenge, resource, oauth_state, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                request_id,
                _hash(secret),
                oauth_client_id,
                (clean_label(client_name)[:200] or None) if client_name else None,
                redirect_uri,
                code_challenge,
                resource,
                oauth_state,
                now,
                now + REQUEST_TTL_S,
            ),
        )
        async with tx.execute("SELECT * FROM signin_requests WHERE id = ?", (request_id,)) as cur:
            made = await cur.fetchone()
    assert made is not None  # noqa: S101  # inserted just above
    return Asked(info(made, now), secret)


async def waiting(db: Database, *, now: float) -> list[SigninRequestInfo]:
    """The requests the owner may still decide, oldest first."""
    rows = await db.fetchall(
        "SELECT * FROM signin_requests WHERE state = 'pending' AND expires_at > ? ORDER BY created_at, rowid",
        (now,),
    )
    return [info(r, now) for r in rows]


async def decide(
    db: Database, request_id: str, *, access: AccessLevel | None, now: float
) -> SigninRequestInfo:
    """Approve at `access`, or deny (`access` None). Only a pending, unexpired request."""
    async with db.write() as tx:
        async with tx.execute("SELECT * FROM signin_requests WHERE id = ?", (request_id,)) as cur:
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"No sign-in request {request_id} here.")
        if _state(row, now) != "pending":
            raise Conflict(
                f"Sign-in request {request_id} is {_state(row, now)}; only a pending one is decided."
            )
        await tx.execute(
            "UPDATE signin_requests SET state = ?, access = ?, decided_at = ? WHERE id = ?",
            ("approved" if access is not None else "denied", access, now, request_id),
        )
        async with tx.execute("SELECT * FROM signin_requests WHERE id = ?", (request_id,)) as cur:
            decided = await cur.fetchone()
    assert decided is not None  # noqa: S101  # read in this transaction
    return info(decided, now)


@dataclass(frozen=True)
class Outcome:
    state: Collected
    code: str | None = field(default=None, repr=False)
    redirect_uri: str | None = None
    oauth_state: str | None = None  # the authorization request's `state`, to echo


async def collect(db: Database, request_id: str, poll_secret: str, *, now: float) -> Outcome:
    """What the browser that asked gets now: wait, an authorization code (once), denied, or gone
    (unknown, expired, already collected, or not this browser's)."""
    async with db.write() as tx:
        async with tx.execute("SELECT * FROM signin_requests WHERE id = ?", (request_id,)) as cur:
            row = await cur.fetchone()
        if row is None or not hmac.compare_digest(row["poll_hash"], _hash(poll_secret)):
            return Outcome("gone")
        state = _state(row, now)
        if state == "pending":
            return Outcome("pending")
        if state == "denied":
            await tx.execute("UPDATE signin_requests SET state = 'done' WHERE id = ?", (request_id,))
            return Outcome("denied", redirect_uri=row["redirect_uri"], oauth_state=row["oauth_state"])
        if state != "approved":
            return Outcome("gone")
        code = await issue_code(
            tx,
            oauth_client_id=row["oauth_client_id"],
            client_name=row["client_name"],
            redirect_uri=row["redirect_uri"],
            code_challenge=row["code_challenge"],
            resource=row["resource"],
            access=row["access"],
            max_age_s=None,
            approved_by=request_id,
            now=now,
        )
        await tx.execute("UPDATE signin_requests SET state = 'done' WHERE id = ?", (request_id,))
        return Outcome("approved", code, row["redirect_uri"], row["oauth_state"])
