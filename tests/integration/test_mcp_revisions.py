"""Both MCP revisions on `/mcp`, negotiated per request: 2025-11-25 (the initialize handshake) and
2026-07-28 (stateless: `server/discover`, the envelope in `_meta` on every request, `Mcp-Method` /
`Mcp-Name` headers), driven by the official SDK client pinned to each, over the loopback port with a
run token, over the owner socket, and through `peerd mcp`."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from peerd.agent_tools import TOOL_SPECS
from peerd.daemon import Daemon
from tests.helpers import LocalClient
from tests.support.mcp import INITIALIZE, INITIALIZED, bridge, live_run

MODES = ("legacy", "2026-07-28")


@asynccontextmanager
async def over_http(
    url: str, mode: str, *, token: str | None = None, uds: Path | None = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    http = create_mcp_http_client(headers=headers)
    if uds is not None:
        http = httpx2.AsyncClient(
            transport=httpx2.AsyncHTTPTransport(uds=str(uds)), headers=headers, timeout=60
        )
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as session:
        yield session


@pytest.mark.parametrize("mode", MODES)
async def test_the_owner_socket_speaks_both_revisions(daemon: Daemon, mode: str) -> None:
    async with over_http("http://localhost/mcp", mode, uds=daemon.paths.socket) as session:
        listed = await session.list_tools()
        status = await session.call_tool("environment_list", {})
        version = session.protocol_version
    assert {tool.name for tool in listed.tools} == set(TOOL_SPECS)
    assert not status.is_error, status
    expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
    assert version == expected


async def test_a_client_that_probes_gets_the_stateless_revision(daemon: Daemon) -> None:
    async with over_http("http://localhost/mcp", "auto", uds=daemon.paths.socket) as session:
        version = session.protocol_version
        listed = await session.list_tools()
    assert version == types.LATEST_PROTOCOL_VERSION == "2026-07-28"
    assert len(listed.tools) == len(TOOL_SPECS)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_the_loopback_port_speaks_both_revisions_as_the_run(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any], mode: str
) -> None:
    assert daemon.mcp.url is not None
    async with (
        live_run(client, project, tmp_path) as run,
        over_http(daemon.mcp.url, mode, token=run.token) as session,
    ):
        listed = await session.list_tools()
        status = await session.call_tool("environment_list", {})
    assert {tool.name for tool in listed.tools} == set(TOOL_SPECS)
    assert not status.is_error, status


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_the_bridge_speaks_both_revisions(daemon: Daemon, mode: str) -> None:
    env = {"PEERD_SOCKET": str(daemon.paths.socket), "PATH": "/usr/bin:/bin"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "peerd", "mcp"], env=env)
    async with Client(params, mode=mode) as session:
        version = session.protocol_version
        listed = await session.list_tools()
        status = await session.call_tool("environment_list", {})
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert len(listed.tools) == len(TOOL_SPECS)
    assert not status.is_error, status


@pytest.mark.parametrize("version", [None, "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_only_post_is_served_at_any_revision(daemon: Daemon, method: str, version: str | None) -> None:
    """No standalone stream and no sessions to end: 405 at once (a GET was once held open)."""
    headers = {"Accept": "application/json, text/event-stream"}
    if version is not None:
        headers["MCP-Protocol-Version"] = version
    transport = httpx2.AsyncHTTPTransport(uds=str(daemon.paths.socket))
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost", timeout=10) as http:
        answer = await http.request(method, "/mcp", headers=headers)
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"
    assert answer.json()["error"]["code"] == -32000


def envelope(method: str, **params: Any) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": method, "method": method, "params": {**params, "_meta": meta}}


async def test_a_request_whose_headers_disagree_with_its_envelope_is_refused(daemon: Daemon) -> None:
    """The daemon checks 2026-07-28's routing headers against the body (the SDK's ladder)."""
    body = envelope("tools/call", name="environment_list", arguments={})
    base = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28"}
    transport = httpx2.AsyncHTTPTransport(uds=str(daemon.paths.socket))
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost", timeout=10) as http:
        right = await http.post(
            "/mcp", json=body, headers={**base, "Mcp-Method": "tools/call", "Mcp-Name": "environment_list"}
        )
        wrong = await http.post(
            "/mcp", json=body, headers={**base, "Mcp-Method": "tools/call", "Mcp-Name": "thread_launch"}
        )
    assert right.status_code == 200 and right.json()["result"]["resultType"] == "complete"
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == types.HEADER_MISMATCH


async def test_the_bridge_adds_the_routing_headers_and_answers_discover_without_the_daemon(
    tmp_path: Path,
) -> None:
    env = {"PEERD_SOCKET": str(tmp_path / "nothing.sock")}
    answers = await bridge(env, envelope("server/discover"), envelope("tools/call", name="project_list"))
    by_id = {answer["id"]: answer for answer in answers}
    assert by_id["server/discover"]["result"]["supportedVersions"] == ["2026-07-28"]
    called = by_id["tools/call"]["result"]
    assert called["isError"] is True and called["resultType"] == "complete"
    assert called["content"][0]["text"].startswith("daemon_unavailable: ")


async def test_the_bridge_negotiates_each_request_on_its_own(daemon: Daemon) -> None:
    """A 2026-07-28 request after a handshake-era `initialize` carries its own revision (the
    handshake's version would not match its envelope, which the daemon refuses)."""
    env = {"PEERD_SOCKET": str(daemon.paths.socket), "PATH": "/usr/bin:/bin"}
    legacy = {"jsonrpc": "2.0", "id": "legacy", "method": "tools/list"}
    modern = envelope("tools/call", name="environment_list", arguments={})
    answers = await bridge(env, INITIALIZE, INITIALIZED, legacy, modern)
    by_id = {answer["id"]: answer for answer in answers}
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18"
    assert len(by_id["legacy"]["result"]["tools"]) == len(TOOL_SPECS)
    assert by_id["tools/call"]["result"]["resultType"] == "complete", by_id["tools/call"]
    assert by_id["tools/call"]["result"]["isError"] is False
