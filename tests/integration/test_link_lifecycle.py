"""A link's life after linking: expiry, refresh, revocation, access checks, re-linking.

Two real daemons ("laptop" and "box") on loopback with real TLS and real SQLite files. Where a
test needs to know what the laptop sent, a guard on aiohttp's client records every TCP request
(and refuses any that would leave loopback).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from multidict import CIMultiDictProxy

from peerd.api.remote import NOT_ACCEPTED
from peerd.core.credentials import refresh_hash
from peerd.errors import CapabilityDenied, InvalidRequest, PeerdError
from peerd.peer.client import REVOKED_MESSAGE, is_loopback_url
from peerd.peer.identity import pinned_fingerprint
from peerd.peer.tokens import sign_access_token
from peerd.store.clients import UNLINKED_REASON
from tests.helpers import Pair as BasePair
from tests.helpers import make_repo, running_daemon, two_daemons
from tests.support.cli import peerd

pytestmark = pytest.mark.slow  # two daemons

EXPIRED = "The link to box expired. Link it again with a new pairing code from box."


@dataclasses.dataclass
class Outbound:
    sent: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@pytest.fixture
def outbound(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outbound]:
    """Every TCP request made through aiohttp in this process (the local Unix socket excluded)."""
    record = Outbound()
    original = aiohttp.ClientSession._request

    async def recording(self: aiohttp.ClientSession, method: str, url: Any, **kw: Any) -> Any:
        if not isinstance(self.connector, aiohttp.UnixConnector):
            if not is_loopback_url(str(url)):
                raise AssertionError(f"test guard: refused a request off loopback to {url}")
            record.sent.append((method.upper(), str(url)))
        return await original(self, method, url, **kw)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", recording)
    yield record


class Pair(BasePair):
    """The shared pair, plus direct looks into both databases and raw bearer requests."""

    # --- the two databases, read (and on the laptop, aged) directly ---------------------------

    def link_row(self) -> dict[str, Any]:
        with contextlib.closing(sqlite3.connect(self.laptop.paths.db, timeout=5)) as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM links WHERE env_id = ?", (self.box_id,)).fetchone()
        assert row is not None, "the laptop has no link to the box"
        return dict(row)

    def age_link(self, **columns: float | None) -> None:
        sets = ", ".join(f"{name} = ?" for name in columns)
        with contextlib.closing(sqlite3.connect(self.laptop.paths.db, timeout=5)) as db, db:
            db.execute(f"UPDATE links SET {sets} WHERE env_id = ?", (*columns.values(), self.box_id))  # noqa: S608

    def refresh_tokens(self, client_id: str) -> dict[str, float | None]:
        """The box's refresh tokens for a client: hash -> rotated_at."""
        with contextlib.closing(sqlite3.connect(self.box.paths.db, timeout=5)) as db:
            rows = db.execute(
                "SELECT token_hash, rotated_at FROM refresh_tokens WHERE client_id = ?", (client_id,)
            ).fetchall()
        return dict(rows)

    async def clients(self) -> dict[str, dict[str, Any]]:
        return {x["id"]: x for x in (await self.bc.call("GET", "/v1/clients"))["items"]}

    async def bearer(
        self, method: str, path: str, token: str | None, body: dict[str, Any] | None = None
    ) -> tuple[int, Any, CIMultiDictProxy[str]]:
        """A request to the box's listener with exactly this token (or none), over pinned TLS."""
        assert self.box.identity is not None
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                self.box_url + path,
                headers=headers,
                json=body,
                ssl=pinned_fingerprint(self.box.identity.fingerprint),
            ) as resp,
        ):
            return resp.status, await resp.json(content_type=None), resp.headers


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        yield Pair(p.laptop, p.box, p.lc, p.bc)


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


# --- expiry ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("set_by", ["code", "link"])
async def test_a_link_past_its_max_age_expires_with_the_exact_message(pair: Pair, set_by: str) -> None:
    if set_by == "code":  # `peerd pair --max-age` on the box
        linked = await pair.link(code=await pair.code(maxAgeS=0.5))
    else:  # `peerd link --max-age` on the laptop
        linked = await pair.link(maxAgeS=0.5)
    assert linked["expiresAt"] is not None and linked["expiresAt"] <= time.time() + 0.5
    there = (await pair.clients())[linked_client(pair)]["expiresAt"]
    assert there is not None and there <= time.time() + 0.5
    # Past both ends' deadline; only time passes here, there is no event to wait for.
    await asyncio.sleep(max(0.0, linked["expiresAt"] - time.time(), there - time.time()) + 0.05)

    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.message == EXPIRED
    envs = (await pair.lc.call("GET", "/v1/environments"))["items"]
    assert [(e["environmentId"], e["status"]) for e in envs] == [(pair.box_id, "expired")]
    assert [c["status"] for c in (await pair.clients()).values()] == ["expired"]

    # The box enforces the max age too: a laptop that lost track of it (its own expiry cleared
    # and a fresh-looking access token) is refused there, with the same message, and remembers.
    pair.age_link(refresh_expires_at=None, access_expires_at=time.time() + 600)
    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.message == EXPIRED
    assert pair.link_row()["status"] == "expired"


def linked_client(pair: Pair) -> str:
    return str(pair.link_row()["client_id"])


# --- refresh --------------------------------------------------------------------------------------


async def test_concurrent_calls_with_a_stale_token_refresh_once(pair: Pair) -> None:
    await pair.link("auto")
    client_id = linked_client(pair)
    assert len(pair.refresh_tokens(client_id)) == 1
    pair.age_link(access_expires_at=time.time() - 10)

    results = await asyncio.gather(*(pair.remote("GET", "/v1/projects") for _ in range(10)))
    assert [r["items"] for r in results] == [[]] * 10
    tokens = pair.refresh_tokens(client_id)
    assert len(tokens) == 2, "the first refresh token and exactly one rotation"
    assert sorted(rotated is None for rotated in tokens.values()) == [False, True]
    assert (await pair.clients())[client_id]["status"] == "active", "no reuse was detected"


async def test_the_rotated_refresh_token_is_persisted_and_survives_a_restart(
    pair: Pair, tmp_path: Path
) -> None:
    await pair.link("auto")
    client_id = linked_client(pair)
    before = pair.link_row()["refresh_token"]
    assert pair.laptop.peers is not None
    updated, access = await pair.laptop.peers.access_token(pair.box_id, force_refresh=True)
    assert updated.refresh_token != before

    row = pair.link_row()
    assert (row["refresh_token"], row["access_token"]) == (updated.refresh_token, access)
    tokens = pair.refresh_tokens(client_id)
    assert tokens[refresh_hash(before)] is not None, "the old one is rotated out at the box"
    assert tokens[refresh_hash(updated.refresh_token)] is None, "the stored one is the live one"

    # A restarted laptop refreshes with what it stored; had it kept the rotated-out token, the
    # box would take it for a stolen one and revoke the link.
    await pair.laptop.shutdown()
    pair.age_link(access_expires_at=time.time() - 10)
    async with running_daemon(tmp_path / "laptop", label="laptop") as again:
        assert again.peers is not None
        assert (await again.peers.call(pair.box_id, "GET", "/v1/projects"))["items"] == []
    assert len(pair.refresh_tokens(client_id)) == 3
    assert (await pair.clients())[client_id]["status"] == "active"


# --- revocation -----------------------------------------------------------------------------------


async def test_revocation_ends_a_still_valid_access_token_at_once(pair: Pair) -> None:
    await pair.link("auto")
    await pair.remote("GET", "/v1/projects")
    token = pair.link_row()["access_token"]
    assert jwt_claims(token)["exp"] > time.time() + 60, "the access token is nowhere near its expiry"
    assert (await pair.bearer("GET", "/v1/projects", token))[0] == 200

    await pair.bc.call("POST", f"/v1/clients/{linked_client(pair)}/revoke")
    status, body, headers = await pair.bearer("GET", "/v1/projects", token)
    assert status == 401
    assert body == {"code": "capability_denied", "message": NOT_ACCEPTED}
    assert headers["WWW-Authenticate"].startswith("Bearer")

    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.message == REVOKED_MESSAGE
    assert pair.link_row()["status"] == "revoked"


# --- access checks --------------------------------------------------------------------------------


async def test_a_read_only_links_write_is_refused_on_the_laptop_before_anything_is_sent(
    pair: Pair, outbound: Outbound
) -> None:
    repo = make_repo(pair.box.paths.home.parent / "box-repo")
    project = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    await pair.link("read-only")
    assert [p["id"] for p in (await pair.remote("GET", "/v1/projects"))["items"]] == [project["id"]]
    assert outbound.sent, "the recorder sees the link's traffic"

    outbound.sent.clear()
    launch = {"projectId": project["id"], "prompt": "hello"}
    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("POST", "/v1/threads", body=launch)
    assert err.value.message == "This link has read-only access, so it cannot change anything there."
    assert outbound.sent == [], "the refused call sent nothing"
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []

    # The box refuses it on its own too, from the token alone.
    status, body, _ = await pair.bearer("POST", "/v1/threads", pair.link_row()["access_token"], launch)
    assert (status, body["code"]) == (403, "capability_denied")
    assert "read-only" in body["message"]
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []


async def test_a_runtime_mode_above_the_link_is_refused_before_anything_is_sent(
    pair: Pair, outbound: Outbound
) -> None:
    await pair.link("auto-accept-edits")
    outbound.sent.clear()
    with pytest.raises(PeerdError) as err:
        await pair.remote(
            "POST", "/v1/threads", body={"projectId": "prj_x", "prompt": "hi", "runtimeMode": "auto"}
        )
    assert err.value.code == "runtime_mode_escalation_denied"
    assert "auto" in err.value.message and "auto-accept-edits" in err.value.message
    assert outbound.sent == []


@pytest.mark.parametrize("limit", ["everything", "auto/bogus", "auto/", "/plan"])
async def test_a_malformed_mode_limit_header_is_invalid(pair: Pair, limit: str) -> None:
    await pair.link("auto")
    with pytest.raises(InvalidRequest) as err:
        await pair.remote("GET", "/v1/projects", mode_limit=limit)
    assert err.value.code == "invalid_request"
    assert limit in err.value.message
    assert "<runtimeMode>/<interactionMode>" in err.value.message
    assert (await pair.remote("GET", "/v1/projects", mode_limit="auto/plan"))["items"] == []


async def test_the_network_api_needs_a_token_the_box_signed(pair: Pair) -> None:
    # The descriptor is public.
    status, body, _ = await pair.bearer("GET", "/.well-known/peerd", None)
    assert status == 200
    assert (body["service"], body["environmentId"], body["label"]) == ("peerd", pair.box_id, "box")

    await pair.link("auto")
    client_id = linked_client(pair)

    status, body, headers = await pair.bearer("GET", "/v1/projects", None)
    assert (status, body["code"]) == (401, "capability_denied")
    assert "peerd pair" in body["message"]
    assert headers["WWW-Authenticate"].startswith("Bearer")

    assert pair.box.identity is not None
    claims = {"env_id": pair.box_id, "client_id": client_id, "access": "auto"}
    forged, _ = sign_access_token(Ed25519PrivateKey.generate(), **claims)  # type: ignore[arg-type]
    status, body, _ = await pair.bearer("GET", "/v1/projects", forged)
    assert (status, body) == (401, {"code": "capability_denied", "message": NOT_ACCEPTED})

    status, _, _ = await pair.bearer("GET", "/v1/projects", "not-a-jwt")
    assert status == 401

    # The control: the same claims signed with the box's key are accepted.
    genuine, _ = sign_access_token(pair.box.identity.private_key, **claims)  # type: ignore[arg-type]
    status, body, _ = await pair.bearer("GET", "/v1/projects", genuine)
    assert (status, body["items"]) == (200, [])


# --- re-linking -----------------------------------------------------------------------------------


async def test_relinking_replaces_the_link_and_revokes_the_old_client_there(pair: Pair) -> None:
    await pair.link("auto")
    old = pair.link_row()
    await pair.link("read-only")
    new = pair.link_row()
    assert new["client_id"] != old["client_id"]
    assert new["access"] == "read-only"
    envs = (await pair.lc.call("GET", "/v1/environments"))["items"]
    assert [(e["environmentId"], e["access"]) for e in envs] == [(pair.box_id, "read-only")]

    clients = await pair.clients()
    assert clients[old["client_id"]]["status"] == "revoked"
    assert clients[old["client_id"]]["revokedReason"] == UNLINKED_REASON
    assert clients[new["client_id"]]["status"] == "active"
    assert (await pair.bearer("GET", "/v1/projects", old["access_token"]))[0] == 401
    assert (await pair.remote("GET", "/v1/projects"))["items"] == []
    # Never silently: the answer names the level it replaced, and the CLI says so.
    again = await pair.link("read-only")
    assert again["replacedAccess"] == "read-only"
    relinked = await peerd(pair.laptop.paths.home, "link", await pair.code("auto"), "--access", "auto")
    assert relinked.returncode == 0, relinked.stderr
    assert (
        "this replaces the earlier link to box, was read-only (its session there is revoked)"
        in relinked.stdout
    )
