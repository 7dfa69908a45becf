"""The document describes the daemon as it runs: every route each real listener serves is in the
route table `peerd.api.openapi.LISTENERS` gives it (so none is added without a description), and
`GET /v1/openapi.json` serves the whole document on the owner socket and the network view to a
link (only to an authenticated one)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from peerd.api.mcp_http import MCP_ACCESS
from peerd.api.openapi import BY_NAME, document
from peerd.api.routes import VIEW, registered
from peerd.daemon import Daemon
from peerd.peer.identity import pinned_fingerprint
from tests.helpers import two_daemons

pytestmark = pytest.mark.slow  # two daemons

ACCESS_TO_LISTENER = {"owner": "owner", "agent": "agent", "tcp": "mcp"}


def _apps(daemon: Daemon) -> dict[str, web.Application]:
    apps = {}
    for runner in daemon._runners:
        app = runner.app
        name = "network" if app.get(VIEW) == "network" else ACCESS_TO_LISTENER[app[MCP_ACCESS]]
        apps[name] = app
    return apps


def _served(app: web.Application) -> set[tuple[str, str]]:
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


async def test_every_route_a_real_listener_serves_is_in_its_described_table(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        apps = _apps(pair.box)
        assert set(apps) == set(BY_NAME)
        for name, app in apps.items():
            table = BY_NAME[name].routes
            assert _served(app) == {(r.method, r.document_path) for r in table}, name
            assert {id(r) for r in registered(app)} == {id(r) for r in table}, name


async def test_the_owner_socket_serves_the_whole_document_and_a_link_its_view(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        whole = await pair.bc.call("GET", "/v1/openapi.json")
        assert whole == json.loads(json.dumps(document()))
        await pair.link("auto")
        view = await pair.remote("GET", "/v1/openapi.json")
        assert view == json.loads(json.dumps(document("network")))
        assert "/v1/pair" not in view["paths"]
        assert pair.box.identity is not None
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                pair.box_url + "/v1/openapi.json", ssl=pinned_fingerprint(pair.box.identity.fingerprint)
            ) as resp,
        ):
            assert resp.status == 401  # the network listener's document is for links only
            assert (await resp.json())["code"] == "capability_denied"
