"""What `peerd link` refuses at link time, against real daemons and a real impostor on loopback.

Every refusal leaves the laptop without a link and the box's pairing code unspent (still open,
no attempt counted): nothing secret left the laptop. No test here sends anything off loopback:
a guard on aiohttp's client refuses (and records) any request to another address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from peerd import contracts as c
from peerd.api.localclient import LocalClient
from peerd.core import pairing_code
from peerd.daemon import Daemon
from peerd.errors import PeerdError
from peerd.peer.client import is_loopback_url
from peerd.peer.identity import Identity, load_or_create_identity
from tests.helpers import client_for, pinned_server, running_daemon

pytestmark = pytest.mark.slow  # two daemons

OFF_LOOPBACK = "http://192.0.2.1:7433"  # TEST-NET-1: never routed, and never contacted here


# --- a record of every TCP request the test process makes ---------------------------------------


@dataclasses.dataclass
class Outbound:
    """TCP requests made through aiohttp (the local Unix-socket client is not counted)."""

    sent: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    blocked: list[str] = dataclasses.field(default_factory=list)


@pytest.fixture
def outbound(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outbound]:
    record = Outbound()
    original = aiohttp.ClientSession._request

    async def guarded(self: aiohttp.ClientSession, method: str, url: Any, **kw: Any) -> Any:
        if not isinstance(self.connector, aiohttp.UnixConnector):
            if not is_loopback_url(str(url)):
                record.blocked.append(str(url))
                raise aiohttp.ClientConnectionError(f"test guard: no traffic to {url}")
            record.sent.append((method.upper(), str(url)))
        return await original(self, method, url, **kw)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", guarded)
    yield record
    assert record.blocked == [], "a request was about to leave loopback"


# --- the two daemons ------------------------------------------------------------------------------


@pytest.fixture
async def laptop(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp_path / "laptop", label="laptop") as d:
        yield d


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp_path / "box", label="box") as d:
        yield d


@pytest.fixture
async def lc(laptop: Daemon) -> AsyncIterator[LocalClient]:
    async with client_for(laptop.paths.home) as client:
        yield client


@pytest.fixture
async def bc(box: Daemon) -> AsyncIterator[LocalClient]:
    async with client_for(box.paths.home) as client:
        yield client


async def box_code(bc: LocalClient, access: str = "auto") -> pairing_code.PairingCode:
    data = await bc.call("POST", "/v1/pair", body={"access": access})
    return pairing_code.decode(data["code"])


def box_code_state(box: Daemon, code_id: str) -> tuple[str, int]:
    with contextlib.closing(sqlite3.connect(box.paths.db)) as db:
        row = db.execute(
            "SELECT state, failed_attempts FROM pairing_codes WHERE id = ?", (code_id,)
        ).fetchone()
    return row[0], row[1]


def stored_links(laptop: Daemon) -> int:
    with contextlib.closing(sqlite3.connect(laptop.paths.db)) as db:
        count: int = db.execute("SELECT count(*) FROM links").fetchone()[0]
    return count


async def link_fails(lc: LocalClient, code: str, **extra: Any) -> PeerdError:
    with pytest.raises(PeerdError) as err:
        await lc.call("POST", "/v1/links", body={"code": code, "access": "auto", **extra})
    return err.value


def assert_nothing_happened(
    laptop: Daemon, box: Daemon | None, code: pairing_code.PairingCode | None
) -> None:
    assert stored_links(laptop) == 0, "the laptop stored a link"
    if box is not None and code is not None:
        assert box_code_state(box, code.code_id) == ("open", 0), "the box's code was touched"


# --- an HTTPS server on loopback that is not the box --------------------------------------------


@dataclasses.dataclass
class Impostor:
    identity: Identity
    url: str
    seen: list[tuple[str, str]]
    status: int = 404
    descriptor: Any = None  # JSON served at /.well-known/peerd (with status 200), when set

    def code_for(self, code: pairing_code.PairingCode) -> str:
        """The box's code, rewritten to send the laptop here (pinned to this server's cert)."""
        return dataclasses.replace(code, urls=(self.url,), fingerprint=self.identity.fingerprint).encode()


@pytest.fixture
async def impostor(tmp_path: Path) -> AsyncIterator[Impostor]:
    identity = load_or_create_identity(tmp_path / "impostor")
    server = Impostor(identity=identity, url="", seen=[])

    async def anything(request: web.Request) -> web.StreamResponse:
        server.seen.append((request.method, request.path))
        if request.method == "GET" and request.path == "/.well-known/peerd" and server.descriptor is not None:
            return web.json_response(server.descriptor)
        return web.json_response({"error": "not here"}, status=server.status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with pinned_server(app, identity) as url:
        server.url = url
        yield server


def descriptor(env_id: str, **changes: Any) -> dict[str, Any]:
    body = c.Descriptor(env_id=env_id, label="elsewhere", version="9.9.9", capabilities=["links"]).wire()
    return {**body, **changes}


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, None), (200, {"service": "other", "name": "a web app"}), (200, ["peerd"])],
    ids=["404", "other-service", "not-an-object"],
)
async def test_a_server_that_is_not_a_peerd_is_refused(
    laptop: Daemon, box: Daemon, lc: LocalClient, bc: LocalClient, impostor: Impostor, status: int, body: Any
) -> None:
    impostor.status, impostor.descriptor = status, body
    code = await box_code(bc)
    err = await link_fails(lc, impostor.code_for(code))
    assert err.code == "not_a_peerd"
    assert err.message == f"Nothing at {impostor.url} answered as a peerd."
    assert impostor.seen == [("GET", "/.well-known/peerd")], "only the descriptor was asked for"
    assert_nothing_happened(laptop, box, code)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"protocolVersion": 99}, "speaks peerd protocol 99"),
        (
            {"environmentId": None, "envId": None, "capabilities": "all"},
            "answered in a shape this peerd does not understand",
        ),
    ],
    ids=["protocol-99", "bad-shape"],
)
async def test_an_incompatible_peerd_is_refused(
    laptop: Daemon,
    box: Daemon,
    lc: LocalClient,
    bc: LocalClient,
    impostor: Impostor,
    changes: dict[str, Any],
    expected: str,
) -> None:
    code = await box_code(bc)
    impostor.descriptor = descriptor(code.env_id, **changes)
    err = await link_fails(lc, impostor.code_for(code))
    assert err.code == "incompatible"
    assert expected in err.message
    assert "update both" in err.message
    assert impostor.seen == [("GET", "/.well-known/peerd")]
    assert_nothing_happened(laptop, box, code)


async def test_another_environment_at_the_address_is_refused_and_sent_nothing(
    laptop: Daemon, box: Daemon, lc: LocalClient, bc: LocalClient, impostor: Impostor
) -> None:
    code = await box_code(bc)
    impostor.descriptor = descriptor(impostor.identity.env_id)  # a valid peerd, just not the box
    err = await link_fails(lc, impostor.code_for(code))
    assert err.code == "wrong_environment"
    assert impostor.identity.env_id in err.message and code.env_id in err.message
    assert err.message.endswith("nothing was sent.")
    assert impostor.seen == [("GET", "/.well-known/peerd")], "the probe reached it, and nothing else did"
    assert ("POST", "/oauth/token") not in impostor.seen
    assert_nothing_happened(laptop, box, code)


async def test_the_impostor_descriptor_is_accepted_when_it_is_the_codes_environment(
    laptop: Daemon, lc: LocalClient, impostor: Impostor, bc: LocalClient
) -> None:
    """The control for the refusals above: a code, descriptor and pinned certificate that agree
    get as far as the token request (which this server refuses), so they refuse for the reason
    they name. (Claiming the box's id with another certificate: tests/security/test_bad_input.py.)"""
    code = await box_code(bc)
    impostor.descriptor = descriptor(impostor.identity.env_id)
    own = dataclasses.replace(code, env_id=impostor.identity.env_id)
    err = await link_fails(lc, impostor.code_for(own))
    assert err.code == "pairing_rejected"
    assert impostor.seen == [("GET", "/.well-known/peerd"), ("POST", "/oauth/token")]
    assert stored_links(laptop) == 0


@pytest.mark.parametrize("where", ["url-option", "code"])
async def test_plain_http_off_loopback_is_refused_before_any_connection(
    laptop: Daemon, box: Daemon, lc: LocalClient, bc: LocalClient, outbound: Outbound, where: str
) -> None:
    code = await box_code(bc)
    if where == "url-option":
        err = await link_fails(lc, code.encode(), urls=[OFF_LOOPBACK])
    else:
        err = await link_fails(lc, dataclasses.replace(code, urls=(OFF_LOOPBACK,)).encode())
    assert err.code == "invalid_request"
    assert err.message.startswith(f"{OFF_LOOPBACK} is plain http")
    assert "https" in err.message
    assert outbound.sent == [] and outbound.blocked == [], "refused before connecting anywhere"
    assert_nothing_happened(laptop, box, code)


async def test_plain_http_on_loopback_links_end_to_end(
    tmp_path: Path, laptop: Daemon, lc: LocalClient, outbound: Outbound
) -> None:
    async with (
        running_daemon(tmp_path / "plain-box", label="plain-box", tls=False) as plain,
        client_for(plain.paths.home) as pc,
    ):
        assert plain.identity is not None
        code = await box_code(pc)
        assert all(u.startswith("http://127.0.0.1:") for u in code.urls), code.urls
        linked = await lc.call("POST", "/v1/links", body={"code": code.encode(), "access": "auto"})
        assert (linked["environmentId"], linked["label"], linked["status"]) == (
            plain.identity.env_id,
            "plain-box",
            "reachable",
        )
        assert laptop.peers is not None
        assert (await laptop.peers.call(plain.identity.env_id, "GET", "/v1/projects"))["items"] == []
        clients = (await pc.call("GET", "/v1/clients"))["items"]
        assert [(x["label"], x["status"]) for x in clients] == [("laptop", "active")]
    assert {urlsplit(url).scheme for _, url in outbound.sent} == {"http"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hello, this is not it", "it should start with 'peerd-pair:'"),
        ("half", "The pairing code is damaged; copy the whole line again."),
        ("peerd-pair:!!!not-base64!!!", "The pairing code is damaged; copy the whole line again."),
        ("wrong-field", "The pairing code is damaged; copy the whole line again."),
    ],
)
async def test_a_damaged_code_or_not_a_code_is_refused_with_what_to_do(
    laptop: Daemon,
    box: Daemon,
    lc: LocalClient,
    bc: LocalClient,
    outbound: Outbound,
    text: str,
    expected: str,
) -> None:
    code = await box_code(bc)
    if text == "half":
        text = code.encode()[: len(code.encode()) // 2]
    elif text == "wrong-field":
        text = dataclasses.replace(code, fingerprint=b"\x01" * 31).encode()  # a 31-byte pin
    err = await link_fails(lc, text)
    assert err.code == "invalid_request"
    assert expected in err.message
    assert "peerd pair" in err.message or "copy the whole line" in err.message, "says what to do"
    assert outbound.sent == []
    assert_nothing_happened(laptop, box, code)


async def test_an_unreachable_box_is_reported(
    laptop: Daemon, box: Daemon, lc: LocalClient, bc: LocalClient
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    closed = f"https://127.0.0.1:{port}"
    code = await box_code(bc)
    err = await link_fails(lc, dataclasses.replace(code, urls=(closed,)).encode())
    assert err.code == "unreachable"
    assert err.message == f"{code.env_id} did not answer at {closed}."
    assert_nothing_happened(laptop, box, code)
