"""The wire protocol's revision on every answer, and what a caller of revision 1 is spared."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from peerd import __version__, boot
from peerd import contracts as c
from peerd.api.app import caller_protocol
from peerd.api.local import omits_defaults
from peerd.api.routes import VIEW
from peerd.errors import HTTP_STATUS, VersionSkew, from_wire
from peerd.peer.skew import PeerProtocol, skew_message
from peerd.tasks.rules import classify
from tests.helpers import running_daemon


async def test_every_answer_of_both_listeners_says_its_protocol(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "box", label="box") as daemon:
        url = daemon.advertised_urls()[0]
        async with aiohttp.ClientSession() as session:
            for path in ("/.well-known/peerd", "/v1/projects", "/no/such/route"):  # ok, 401, 404
                async with session.get(f"{url}{path}", ssl=False) as resp:
                    assert resp.headers[c.PROTOCOL_HEADER] == str(c.WIRE_PROTOCOL), (path, resp.status)
                    assert resp.headers[c.VERSION_HEADER] == __version__
        connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get("http://peerd/v1/status") as resp,
        ):
            assert resp.headers[c.PROTOCOL_HEADER] == str(c.WIRE_PROTOCOL)


def test_the_early_start_says_the_same_revision() -> None:
    assert boot.WIRE_PROTOCOL == c.WIRE_PROTOCOL
    head = boot._response(200, "OK", {}).split(b"\r\n\r\n")[0].decode()
    assert f"{c.PROTOCOL_HEADER}: {c.WIRE_PROTOCOL}" in head.splitlines()


def request(view: str | None, header: str | None) -> web.Request:
    app = web.Application()
    if view is not None:
        app[VIEW] = view  # type: ignore[misc]
    headers = {} if header is None else {c.PROTOCOL_HEADER: header}
    return make_mocked_request("GET", "/v1/threads/t/items", headers=headers, app=app)


@pytest.mark.parametrize(
    ("view", "header", "omits"),
    [
        ("network", None, False),  # a peerd before the header reads every field as always there
        ("network", "1", False),
        ("network", "junk", False),
        ("network", "2", True),
        ("network", "17", True),
        ("owner", None, True),  # the owner's socket: its clients are this release
        (None, None, True),
    ],
)
def test_item_pages_leave_defaults_out_only_for_readers_that_take_them(
    view: str | None, header: str | None, omits: bool
) -> None:
    assert omits_defaults(request(view, header)) is omits


def test_the_callers_protocol_is_one_without_a_header() -> None:
    assert caller_protocol(request("network", None)) == 1
    assert caller_protocol(request("network", "2")) == 2
    assert caller_protocol(request("network", "-3")) == 1


def test_version_skew_is_typed_transient_and_names_the_machine_to_update() -> None:
    assert PeerProtocol.of({}) == PeerProtocol(1, None)
    assert PeerProtocol.of({c.PROTOCOL_HEADER: "3", c.VERSION_HEADER: "0.2.0"}) == PeerProtocol(3, "0.2.0")
    message = skew_message("box", PeerProtocol(1, None))
    assert "update peerd on box" in message and "change feed" in message
    assert isinstance(from_wire("version_skew", message), VersionSkew)
    assert HTTP_STATUS["version_skew"] == 502
    assert classify("version_skew") == "transient"  # backed off like an outage; the tasks wait
