"""The box's OAuth endpoints over real HTTP, on a real SQLite file, with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pytest_aiohttp import AiohttpClient
from structlog.testing import capture_logs

from peerd.api.oauth import PAIRING_GRANT, add_oauth_routes
from peerd.core.access import AccessLevel
from peerd.errors import Conflict, NotFound
from peerd.peer.ratelimit import SlidingWindow
from peerd.peer.tokens import ACCESS_TOKEN_TTL_S, verify_access_token
from peerd.store import clients, pairing
from peerd.store.db import Database
from tests.fakeclock import T0, FakeClock

ENV_ID = "BOXBOX-BOXBOX-BOXBOX-BOXBOX"
LABEL = "the-box"
DAY = 24 * 3600.0


@dataclass
class Box:
    http: TestClient[web.Request, web.Application]
    db: Database
    key: Ed25519PrivateKey
    clock: FakeClock
    limit_clock: FakeClock

    async def code(
        self, access: AccessLevel = "auto", *, ttl_s: float = 600, max_age_s: float | None = None
    ) -> tuple[str, str]:
        info, secret = await pairing.create_code(
            self.db, access=access, ttl_s=ttl_s, label_hint="laptop", max_age_s=max_age_s, now=self.clock()
        )
        return info.id, secret

    async def token(self, **form: str) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post("/oauth/token", data=form)
        body: dict[str, Any] = await resp.json()
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.headers["Pragma"] == "no-cache"
        return resp.status, body

    async def redeem(self, code_id: str, secret: str, **extra: str) -> tuple[int, dict[str, Any]]:
        form = {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, "client_label": "lap"}
        return await self.token(**{**form, **extra})

    async def refresh(self, refresh_token: str) -> tuple[int, dict[str, Any]]:
        return await self.token(grant_type="refresh_token", refresh_token=refresh_token)

    async def revoke(self, **form: str) -> tuple[int, dict[str, Any]]:
        resp = await self.http.post("/oauth/revoke", data=form)
        body: dict[str, Any] = await resp.json()
        return resp.status, body

    async def code_row(self, code_id: str) -> dict[str, Any]:
        row = await self.db.fetchone("SELECT * FROM pairing_codes WHERE id = ?", (code_id,))
        assert row is not None
        return dict(row)


@asynccontextmanager
async def make_box(
    tmp_path: Path, aiohttp_client: AiohttpClient, limit: SlidingWindow | None = None
) -> AsyncIterator[Box]:
    db = await Database.open(tmp_path / "box" / "peerd.db")
    key = Ed25519PrivateKey.generate()
    clock, limit_clock = FakeClock(), FakeClock()
    app = web.Application()
    add_oauth_routes(
        app,
        db=db,
        signing_key=key,
        env_id=ENV_ID,
        label=LABEL,
        clock=clock,
        pairing_limit=SlidingWindow(20, 60, limit_clock.monotonic) if limit is None else limit,
    )
    try:
        yield Box(await aiohttp_client(app), db, key, clock, limit_clock)
    finally:
        await db.close()


@pytest.fixture
async def box(tmp_path: Path, aiohttp_client: AiohttpClient) -> AsyncIterator[Box]:
    async with make_box(tmp_path, aiohttp_client) as b:
        yield b


def expect(result: tuple[int, dict[str, Any]], status: int, error: str, reason: str | None = None) -> str:
    got_status, body = result
    assert got_status == status, body
    assert body["error"] == error, body
    assert body.get("peerd_reason") == reason, body
    description: str = body["error_description"]
    return description


# --- pairing grant -------------------------------------------------------------------------------


async def test_a_code_links_once_and_the_access_token_verifies(box: Box) -> None:
    code_id, secret = await box.code("auto")
    status, body = await box.redeem(code_id, secret, access="auto", client_env_id="LAPLAP-LAPLAP")
    assert status == 200, body
    assert set(body) == {
        "access_token",
        "token_type",
        "expires_in",
        "refresh_token",
        "refresh_expires_in",
        "scope",
        "client_id",
        "env_id",
        "label",
    }
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == ACCESS_TOKEN_TTL_S
    assert body["refresh_expires_in"] == 30 * DAY
    assert body["scope"] == "auto"
    assert body["client_id"].startswith("cli_")
    assert (body["env_id"], body["label"]) == (ENV_ID, LABEL)
    claims = verify_access_token(box.key.public_key(), body["access_token"], env_id=ENV_ID)
    assert (claims.client_id, claims.access) == (body["client_id"], "auto")

    client = await clients.active_client(box.db, body["client_id"], now=box.clock())
    assert client is not None
    assert (client.label, client.environment_id, client.access, client.expires_at) == (
        "lap",
        "LAPLAP-LAPLAP",
        "auto",
        None,
    )
    row = await box.code_row(code_id)
    assert (row["state"], row["client_id"]) == ("used", body["client_id"])

    again = await box.redeem(code_id, secret)
    assert "peerd pair` on the-box" in expect(again, 400, "invalid_grant", "used")
    assert len(await clients.list_clients(box.db, now=box.clock())) == 1


async def test_concurrent_redemptions_make_exactly_one_client(box: Box) -> None:
    code_id, secret = await box.code()
    results = await asyncio.gather(*(box.redeem(code_id, secret) for _ in range(5)))
    assert sorted(status for status, _ in results) == [200, 400, 400, 400, 400]
    assert {body.get("peerd_reason") for status, body in results if status == 400} == {"used"}
    assert len(await clients.list_clients(box.db, now=box.clock())) == 1


async def test_default_access_is_approval_required(box: Box) -> None:
    code_id, secret = await box.code("full-access")
    status, body = await box.redeem(code_id, secret)
    assert status == 200
    assert body["scope"] == "approval-required"


@pytest.mark.slow
async def test_an_unknown_code_is_refused(box: Box) -> None:
    expect(await box.redeem("nosuchcode", "x" * 22), 400, "invalid_grant", "unknown_code")


async def test_an_expired_code_is_refused(box: Box) -> None:
    code_id, secret = await box.code(ttl_s=600)
    box.clock.advance(600)
    text = expect(await box.redeem(code_id, secret), 400, "invalid_grant", "expired")
    assert "expired" in text
    assert (await box.code_row(code_id))["state"] == "open"  # expiry is computed, never written


async def test_five_wrong_secrets_burn_the_code(box: Box) -> None:
    code_id, secret = await box.code()
    for attempt in range(1, 5):
        text = expect(await box.redeem(code_id, "wrong-" + "x" * 20), 400, "invalid_grant", "wrong_secret")
        assert "wrong-" not in text
        assert (await box.code_row(code_id))["failed_attempts"] == attempt  # committed despite the error
    expect(await box.redeem(code_id, "wrong-" + "x" * 20), 400, "invalid_grant", "burnt")
    # The right secret no longer helps.
    text = expect(await box.redeem(code_id, secret), 400, "invalid_grant", "burnt")
    assert secret not in text
    row = await box.code_row(code_id)
    assert (row["state"], row["failed_attempts"]) == ("burnt", 5)
    assert await clients.list_clients(box.db, now=box.clock()) == []


async def test_failed_redemptions_are_limited_globally(tmp_path: Path, aiohttp_client: AiohttpClient) -> None:
    limit_clock = FakeClock()
    async with make_box(tmp_path, aiohttp_client, SlidingWindow(3, 60, limit_clock.monotonic)) as box:
        code_id, secret = await box.code()
        for _ in range(3):
            expect(await box.redeem("guess", "x" * 22), 400, "invalid_grant", "unknown_code")
        # Past the limit the code is not even looked at: the right secret is slowed down too, and
        # a wrong one is not counted against the code.
        resp = await box.http.post(
            "/oauth/token", data={"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": "nope"}
        )
        assert resp.status == 429
        assert int(resp.headers["Retry-After"]) == 60
        body = await resp.json()
        assert body["error"] == "slow_down"
        expect(await box.redeem(code_id, secret), 429, "slow_down")
        assert (await box.code_row(code_id))["failed_attempts"] == 0
        limit_clock.advance(60)
        status, _ = await box.redeem(code_id, secret)
        assert status == 200


async def test_the_default_global_limit_is_20_failures_a_minute(box: Box) -> None:
    for _ in range(20):
        expect(await box.redeem("guess", "x" * 22), 400, "invalid_grant", "unknown_code")
    expect(await box.redeem("guess", "x" * 22), 429, "slow_down")
    # Refreshes are not pairing attempts.
    expect(await box.refresh("not-a-token"), 400, "invalid_grant", "unknown")


async def test_access_above_the_ceiling_is_refused_and_the_code_survives(box: Box) -> None:
    code_id, secret = await box.code("approval-required")
    text = expect(
        await box.redeem(code_id, secret, access="auto"), 400, "invalid_scope", "access_exceeds_code"
    )
    assert "auto" in text and "approval-required" in text
    row = await box.code_row(code_id)
    assert (row["state"], row["failed_attempts"]) == ("open", 0)
    status, body = await box.redeem(code_id, secret, access="read-only")
    assert status == 200
    assert body["scope"] == "read-only"


async def test_a_cancelled_code_is_refused(box: Box) -> None:
    code_id, secret = await box.code()
    info = await pairing.cancel_code(box.db, code_id, now=box.clock())
    assert info.state == "cancelled"
    assert (await pairing.cancel_code(box.db, code_id, now=box.clock())).state == "cancelled"  # idempotent
    expect(await box.redeem(code_id, secret), 400, "invalid_grant", "cancelled")


async def test_cancel_unknown_and_used_codes(box: Box) -> None:
    with pytest.raises(NotFound, match=r"No pairing code nope here\. `peerd pair list` shows them\."):
        await pairing.cancel_code(box.db, "nope", now=box.clock())
    code_id, secret = await box.code()
    _, body = await box.redeem(code_id, secret)
    with pytest.raises(Conflict, match=body["client_id"]):
        await pairing.cancel_code(box.db, code_id, now=box.clock())


async def test_max_age_is_the_smaller_of_the_codes_and_the_request(box: Box) -> None:
    code_id, secret = await box.code(max_age_s=100)
    _, body = await box.redeem(code_id, secret, max_age="50")
    assert body["refresh_expires_in"] == 50
    assert body["expires_in"] == 50  # the access token does not outlive the link either
    client = await clients.active_client(box.db, body["client_id"], now=box.clock())
    assert client is not None and client.expires_at == T0 + 50

    code_id, secret = await box.code(max_age_s=100)
    _, body = await box.redeem(code_id, secret, max_age="500")
    client = await clients.active_client(box.db, body["client_id"], now=box.clock())
    assert client is not None and client.expires_at == T0 + 100

    box.clock.advance(101)
    assert await clients.active_client(box.db, body["client_id"], now=box.clock()) is None
    expect(await box.refresh(body["refresh_token"]), 400, "invalid_grant", "expired")
    statuses = {c.status for c in await clients.list_clients(box.db, now=box.clock())}
    assert statuses == {"expired"}


@pytest.mark.parametrize("max_age", ["0", "-5", "soon", "nan", "inf"])
async def test_a_bad_max_age_is_invalid_request(box: Box, max_age: str) -> None:
    code_id, secret = await box.code()
    expect(await box.redeem(code_id, secret, max_age=max_age), 400, "invalid_request")
    assert (await box.code_row(code_id))["state"] == "open"


# --- refresh grant -------------------------------------------------------------------------------


async def test_refresh_rotates_and_reuse_revokes_the_whole_link(box: Box) -> None:
    code_id, secret = await box.code()
    _, first = await box.redeem(code_id, secret)
    tokens = [first["refresh_token"]]
    for _ in range(2):
        box.clock.advance(60)
        status, body = await box.refresh(tokens[-1])
        assert status == 200, body
        assert body["client_id"] == first["client_id"]
        assert body["refresh_expires_in"] == 30 * DAY  # sliding
        verify_access_token(box.key.public_key(), body["access_token"], env_id=ENV_ID)
        tokens.append(body["refresh_token"])
    assert len(set(tokens)) == 3

    text = expect(await box.refresh(tokens[0]), 400, "invalid_grant", "reused")
    assert "revoked the link" in text
    # The reuse revoked the client, so even the newest token is dead now.
    expect(await box.refresh(tokens[-1]), 400, "invalid_grant", "revoked")
    assert await clients.active_client(box.db, first["client_id"], now=box.clock()) is None
    [client] = await clients.list_clients(box.db, now=box.clock())
    assert (client.status, client.revoked_reason) == ("revoked", clients.REUSE_REASON)


async def test_refresh_lifetime_slides_and_lapses_when_unused(box: Box) -> None:
    code_id, secret = await box.code()
    _, body = await box.redeem(code_id, secret)
    box.clock.advance(29 * DAY)
    status, body = await box.refresh(body["refresh_token"])
    assert status == 200
    box.clock.advance(29 * DAY)  # 58 days after linking, still fine: each use extends it
    status, body = await box.refresh(body["refresh_token"])
    assert status == 200
    box.clock.advance(30 * DAY)
    assert [c.status for c in await clients.list_clients(box.db, now=box.clock())] == ["expired"]
    text = expect(await box.refresh(body["refresh_token"]), 400, "invalid_grant", "expired")
    assert text.startswith("The link to the-box expired.")


async def test_an_unknown_refresh_token_is_refused(box: Box) -> None:
    expect(await box.refresh("made-up"), 400, "invalid_grant", "unknown")
    expect(await box.token(grant_type="refresh_token"), 400, "invalid_request")


# --- revocation ----------------------------------------------------------------------------------


async def test_revoke_answers_200_for_anything_and_revokes_known_links(box: Box) -> None:
    assert await box.revoke(token="made-up") == (200, {})
    assert await box.revoke(token="a.b.c") == (200, {})
    status, body = await box.revoke()
    assert (status, body["error"]) == (400, "invalid_request")

    code_id, secret = await box.code()
    _, linked = await box.redeem(code_id, secret)
    assert await box.revoke(token=linked["refresh_token"], token_type_hint="refresh_token") == (200, {})
    assert await clients.active_client(box.db, linked["client_id"], now=box.clock()) is None
    expect(await box.refresh(linked["refresh_token"]), 400, "invalid_grant", "revoked")
    assert await box.revoke(token=linked["refresh_token"]) == (200, {})  # again: still 200


async def test_revoke_accepts_an_access_token(box: Box) -> None:
    code_id, secret = await box.code()
    _, linked = await box.redeem(code_id, secret)
    assert await box.revoke(token=linked["access_token"], token_type_hint="access_token") == (200, {})
    [client] = await clients.list_clients(box.db, now=box.clock())
    assert (client.status, client.revoked_reason) == ("revoked", clients.UNLINKED_REASON)


async def test_revoke_client_in_the_store(box: Box) -> None:
    code_id, secret = await box.code()
    _, linked = await box.redeem(code_id, secret)
    box.clock.advance(5)
    info = await clients.revoke_client(box.db, linked["client_id"], reason="lost laptop", now=box.clock())
    assert (info.status, info.revoked_at, info.revoked_reason) == ("revoked", T0 + 5, "lost laptop")
    again = await clients.revoke_client(box.db, linked["client_id"], reason="other", now=box.clock() + 9)
    assert again == info  # idempotent: the first revocation stands
    with pytest.raises(NotFound, match="`peerd client list`"):
        await clients.revoke_client(box.db, "cli_nope", reason="x", now=box.clock())
    assert await clients.revoke_by_refresh_token(box.db, "made-up", now=box.clock()) is False


# --- request shape -------------------------------------------------------------------------------


async def test_grant_type_is_checked_first(box: Box) -> None:
    text = expect(await box.token(grant_type="password", username="u"), 400, "unsupported_grant_type")
    assert "password" in text
    expect(await box.token(grant_type="authorization_code"), 400, "unsupported_grant_type")
    text = expect(await box.token(code_id="x", code_secret="y"), 400, "invalid_request")
    assert "grant_type" in text
    resp = await box.http.post("/oauth/token", json={"grant_type": PAIRING_GRANT})
    assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")


async def test_missing_repeated_and_unknown_fields(box: Box) -> None:
    code_id, secret = await box.code()
    text = expect(await box.token(grant_type=PAIRING_GRANT, code_id=code_id), 400, "invalid_request")
    assert "code_secret" in text
    resp = await box.http.post(
        "/oauth/token",
        data=[
            ("grant_type", PAIRING_GRANT),
            ("code_id", code_id),
            ("code_id", code_id),
            ("code_secret", secret),
        ],
    )
    assert (resp.status, (await resp.json())["error"]) == (400, "invalid_request")
    text = expect(await box.redeem(code_id, secret, access="root"), 400, "invalid_scope")
    assert "read-only" in text
    assert (await box.code_row(code_id))["state"] == "open"


async def test_a_non_ascii_box_label_still_gives_rfc_descriptions(
    tmp_path: Path, aiohttp_client: AiohttpClient
) -> None:
    db = await Database.open(tmp_path / "peerd.db")
    try:
        app = web.Application()
        add_oauth_routes(
            app, db=db, signing_key=Ed25519PrivateKey.generate(), env_id=ENV_ID, label='Zoë "box"'
        )
        http = await aiohttp_client(app)
        resp = await http.post(
            "/oauth/token", data={"grant_type": PAIRING_GRANT, "code_id": "x", "code_secret": "y"}
        )
        body = await resp.json()
        assert body["peerd_reason"] == "unknown_code"
        assert "Zo? ?box?" in body["error_description"]
    finally:
        await db.close()


# --- what the store keeps ------------------------------------------------------------------------


async def test_no_plaintext_secret_or_refresh_token_is_stored_or_logged(box: Box) -> None:
    with capture_logs() as logs:
        code_id, secret = await box.code()
        burnt_id, burnt_secret = await box.code()
        for _ in range(5):
            await box.redeem(burnt_id, burnt_secret[::-1])
        _, linked = await box.redeem(code_id, secret)
        _, rotated = await box.refresh(linked["refresh_token"])
        await box.refresh(linked["refresh_token"])  # reuse
    plaintexts = [secret, burnt_secret, burnt_secret[::-1], linked["refresh_token"], rotated["refresh_token"]]
    for table in ("pairing_codes", "clients", "refresh_tokens"):
        rows = await box.db.fetchall(f"SELECT * FROM {table}")  # noqa: S608  # fixed table names
        assert rows
        dump = repr([tuple(r) for r in rows])
        for plain in plaintexts:
            assert plain not in dump, table
    logged = repr(logs)
    assert logs
    for plain in plaintexts:
        assert plain not in logged


async def test_code_and_client_listings(box: Box) -> None:
    now = box.clock()
    open_id, _ = await box.code()
    used_id, used_secret = await box.code()
    burnt_id, _ = await box.code()
    cancelled_id, _ = await box.code()
    expiring_id, _ = await box.code(ttl_s=10)
    _, linked = await box.redeem(used_id, used_secret)
    for _ in range(5):
        await box.redeem(burnt_id, "x" * 22)
    await pairing.cancel_code(box.db, cancelled_id, now=now)
    box.clock.advance(11)

    everything = {c.id: c.state for c in await pairing.list_codes(box.db, now=box.clock(), include_done=True)}
    assert everything == {
        open_id: "open",
        used_id: "used",
        burnt_id: "burnt",
        cancelled_id: "cancelled",
        expiring_id: "expired",
    }
    assert [c.id for c in await pairing.list_codes(box.db, now=box.clock())] == [open_id]
    [used] = [
        c for c in await pairing.list_codes(box.db, now=box.clock(), include_done=True) if c.id == used_id
    ]
    assert used.client_id == linked["client_id"]

    [client] = await clients.list_clients(box.db, now=box.clock())
    assert (client.id, client.status, client.label, client.access) == (
        linked["client_id"],
        "active",
        "lap",
        "approval-required",
    )


async def test_touch_writes_at_most_every_30s_unless_the_address_changes(box: Box) -> None:
    code_id, secret = await box.code()
    _, linked = await box.redeem(code_id, secret)
    cid = linked["client_id"]
    assert await clients.touch(box.db, cid, address="10.0.0.2", now=T0)
    assert not await clients.touch(box.db, cid, address="10.0.0.2", now=T0 + 29)
    assert await clients.touch(box.db, cid, address="10.0.0.3", now=T0 + 29)
    known = await clients.active_client(box.db, cid, now=T0 + 29)
    assert known is not None
    assert (known.last_seen_at, known.last_address) == (T0 + 29, "10.0.0.3")
    assert not await clients.touch(box.db, cid, address="10.0.0.3", now=T0 + 40, known=known)
    assert await clients.touch(box.db, cid, address="10.0.0.3", now=T0 + 59, known=known)
    assert not await clients.touch(box.db, "cli_nope", address="x", now=T0)


async def test_every_refusal_is_rfc_6749_byte_for_byte(box: Box) -> None:
    """The answers are computed from the registry (each class's `oauth_error`): what goes on the
    wire is RFC 6749 §5.2 exactly as before it, status, headers and body."""
    code_id, secret = await box.code("approval-required")
    forms: list[Any] = [
        {"grant_type": "password"},
        {"code_id": "x"},
        [("grant_type", PAIRING_GRANT), ("grant_type", PAIRING_GRANT)],
        {"grant_type": PAIRING_GRANT, "code_id": code_id},
        {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, "access": "root"},
        {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, "access": "auto"},
        {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, "max_age": "-1"},
        {"grant_type": PAIRING_GRANT, "code_id": "nope", "code_secret": secret},
        {"grant_type": "refresh_token", "refresh_token": "nope"},
    ]
    seen = []
    for form in forms:
        resp = await box.http.post("/oauth/token", data=form)
        headers = {k: resp.headers[k] for k in ("Content-Type", "Cache-Control", "Pragma")}
        seen.append((resp.status, headers, await resp.text()))
    json_headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Cache-Control": "no-store",
        "Pragma": "no-cache",
    }
    pair_again = "Run `peerd pair` on the-box for a new code."
    assert seen == [
        (400, json_headers, '{"error": "unsupported_grant_type", "error_description": "grant_type password is '
         'not supported here; use urn:peerd:params:oauth:grant-type:pairing-code or refresh_token."}'),
        (400, json_headers, '{"error": "invalid_request", "error_description": "The token request is missing '
         'grant_type; send it as a form (application/x-www-form-urlencoded)."}'),
        (400, json_headers, '{"error": "invalid_request", "error_description": "Send grant_type only once."}'),
        (400, json_headers, '{"error": "invalid_request", "error_description": "The request is missing '
         'code_secret."}'),
        (400, json_headers, '{"error": "invalid_scope", "error_description": "Unknown access level root; use '
         'one of: read-only, approval-required, auto-accept-edits, auto, full-access."}'),
        (400, json_headers, '{"error": "invalid_scope", "error_description": "You asked for auto access, but '
         "this pairing code allows at most approval-required. Link with --access approval-required (or lower), "
         'or run `peerd pair --access auto` on the-box for a code that allows it.", "peerd_reason": '
         '"access_exceeds_code"}'),
        (400, json_headers, '{"error": "invalid_request", "error_description": "max_age must be a positive '
         'number of seconds, at most 315360000 (ten years)."}'),
        (400, json_headers, '{"error": "invalid_grant", "error_description": "the-box has no such pairing code. '
         f'{pair_again}", "peerd_reason": "unknown_code"}}'),
        (400, json_headers, '{"error": "invalid_grant", "error_description": "the-box does not know this '
         'refresh token. Link it again with a new pairing code from `peerd pair` on the-box.", '
         '"peerd_reason": "unknown"}'),
    ]  # fmt: skip


def test_every_typed_reason_has_a_text() -> None:
    from peerd.api.oauth import PAIRING_TEXTS, REFRESH_TEXTS  # noqa: PLC0415
    from peerd.errors import PAIRING_REASONS, REFRESH_REASONS  # noqa: PLC0415

    assert tuple(PAIRING_TEXTS) == PAIRING_REASONS
    assert tuple(REFRESH_TEXTS) == REFRESH_REASONS
