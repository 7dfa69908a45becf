"""The daemon's own MCP endpoint: streamable HTTP on a loopback port and on both sockets.

Driven by the official MCP client over HTTP (the way Claude Code, Codex and Gemini CLI reach it)
and by `peerd mcp`, the stdio bridge, over the agent socket. A scripted run hands its token to
the test (a test-only step) and stays live until released.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from peerd.agent_tools import TOOL_SPECS
from peerd.daemon import Daemon
from tests.helpers import LocalClient, script
from tests.support.mcp import INITIALIZE, INITIALIZED, bridge, live_run


@asynccontextmanager
async def http_client(url: str, token: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as session:
        yield session


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.slow
async def test_the_loopback_endpoint_serves_the_tools_as_the_run(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    assert daemon.mcp.url is not None and daemon.mcp.url.startswith("http://127.0.0.1:")
    async with live_run(client, project, tmp_path) as run, http_client(daemon.mcp.url, run.token) as session:
        listed = await session.list_tools()
        task = await session.call_tool("delegate_task", {"task": script({"reply": "child"}), "mode": "wait"})
        refused = await session.call_tool(
            "delegate_task", {"task": "x", "target": {"environmentId": "nowhere"}}
        )
        invalid = await session.call_tool("thread_read", {"threadId": "t", "limit": 0})
    assert {tool.name for tool in listed.tools} == set(TOOL_SPECS)
    assert not task.is_error and task.structured_content is not None, text_of(task)
    assert task.structured_content["parentThreadId"] == run.thread_id  # the run itself, from its token
    assert refused.is_error and refused.structured_content is None
    assert text_of(refused).startswith("not_linked: ")
    assert (
        invalid.is_error and text_of(invalid).startswith("invalid_request: ") and "limit" in text_of(invalid)
    )


@pytest.mark.slow
async def test_the_bridge_reaches_mcp_on_the_agent_socket_with_the_run_token(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    async with live_run(client, project, tmp_path) as run:
        env = {"PEERD_SOCKET": str(daemon.paths.agent_socket), "PEERD_RUN_TOKEN_FILE": str(run.token_file)}
        params = StdioServerParameters(command=sys.executable, args=["-m", "peerd", "mcp"], env=env)
        async with Client(params) as session:
            listed = await session.list_tools()
            status = await session.call_tool("task_status", {"taskId": "no-such-task"})
    assert len(listed.tools) == len(TOOL_SPECS)
    assert status.is_error and text_of(status).split(":")[0] in ("task_not_found", "not_found")


async def test_the_bridge_answers_each_request_once_and_notifications_never(daemon: Daemon) -> None:
    env = {"PEERD_SOCKET": str(daemon.paths.socket), "PATH": "/usr/bin:/bin"}
    answers = await bridge(
        env,
        INITIALIZE,
        INITIALIZED,
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "project_list", "arguments": {}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "no/such/method"},
    )
    by_id = {answer["id"]: answer for answer in answers}
    assert sorted(by_id) == [1, 2, 3, 4], answers  # nothing for the notification
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18"
    assert by_id[1]["result"]["serverInfo"]["name"] == "peerd"
    assert len(by_id[2]["result"]["tools"]) == len(TOOL_SPECS)
    assert by_id[3]["result"]["structuredContent"]["items"] == []
    assert "error" in by_id[4]


def test_the_bridge_imports_neither_the_sdk_nor_aiohttp() -> None:
    probe = (
        "import sys, peerd.mcp_proxy; "
        "print(sorted(m for m in ('mcp', 'aiohttp', 'asyncio', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("gone", ["file", "daemon"])
async def test_without_the_daemon_or_the_run_the_bridge_still_says_why(tmp_path: Path, gone: str) -> None:
    env = {"PEERD_SOCKET": str(tmp_path / "nothing.sock")}
    if gone == "file":
        env["PEERD_RUN_TOKEN_FILE"] = str(tmp_path / "removed-token")
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "project_list"}}
    answers = await bridge(
        env, INITIALIZE, INITIALIZED, call, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    )
    by_id = {answer["id"]: answer for answer in answers}
    assert by_id[1]["result"]["serverInfo"]["name"] == "peerd"  # answered by the bridge itself
    assert by_id[2]["result"]["isError"] is True
    code = by_id[2]["result"]["content"][0]["text"].split(":")[0]
    assert code == ("parent_not_active" if gone == "file" else "daemon_unavailable")
    assert by_id[3]["error"]["message"].startswith(f"{code}: ")


@pytest.mark.slow
def test_an_idle_daemon_loads_neither_the_mcp_sdk_nor_the_a2a_sdk(tmp_path: Path) -> None:
    """Start-up never pays for the SDKs (a second and some 22 MiB for MCP, 11 MiB for A2A), and an
    idle daemon never does (issue 33): MCP loads when a run starts or /mcp is first called, A2A on
    its first request or when there is A2A work to resume."""
    probe = f"""
import asyncio, sys
from pathlib import Path
from peerd.daemon import Daemon, DaemonConfig

async def main():
    daemon = Daemon(DaemonConfig(home=Path({str(tmp_path / "home")!r}), listen=None))
    await daemon.start()
    status = await daemon.status()
    await asyncio.sleep(1.0)  # idle
    before = "mcp" in sys.modules or "a2a" in sys.modules
    await daemon.mcp.manager()  # /mcp waits for the SDK
    after = "mcp.server.streamable_http_manager" in sys.modules
    await daemon.shutdown()
    print(before, bool(status.environment_id), after)

asyncio.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.splitlines()[-1:] == ["False True True"], (out.stdout[-2000:], out.stderr[-2000:])
