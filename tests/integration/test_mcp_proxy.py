"""`peerd mcp`: the stdio bridge (a subprocess) to the daemon's MCP endpoint, driven by the official MCP client."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from peerd.agent_tools import TOOL_SPECS
from peerd.api.localclient import LocalClient
from peerd.api.tools import TOOLS
from peerd.daemon import Daemon
from tests.helpers import script, wait_terminal


@asynccontextmanager
async def mcp_client(env: dict[str, str]) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "peerd", "mcp"], env=env)
    async with Client(params) as session:
        yield session


def payload(result: types.CallToolResult) -> dict[str, Any]:
    """A result's JSON, or an error's code and sentence (`code: message`, plain text, no structure)."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    if result.is_error:
        assert result.structured_content is None, "an error is text only (Gemini validates structure)"
        code, sep, message = block.text.partition(": ")
        assert sep and code.replace("_", "").isalpha() and message, block.text
        return {"code": code, "message": message}
    data: dict[str, Any] = json.loads(block.text.split("\n\n")[0])
    return data


def test_every_catalogued_tool_has_one_implementation() -> None:
    assert set(TOOLS) == set(TOOL_SPECS)


async def test_lists_every_tool_with_its_published_schema(daemon: Daemon) -> None:
    async with mcp_client({"PEERD_SOCKET": str(daemon.paths.socket)}) as session:
        listed = await session.list_tools()
    by_name = {tool.name: tool for tool in listed.tools}
    assert set(by_name) == set(TOOL_SPECS)
    delegate = by_name["delegate_task"]
    assert "woken" in (delegate.description or "")
    assert {"task", "target", "clientRequestId", "mode"} <= set(delegate.input_schema["properties"])
    assert delegate.output_schema is None  # results are JSON the descriptions name (agent_tools.py)
    assert delegate.input_schema == TOOL_SPECS["delegate_task"].published_schema()
    assert by_name["thread_wait"].input_schema["properties"]["timeout"]["maximum"] == 45.0
    assert (
        by_name["task_status"].annotations is not None and by_name["task_status"].annotations.read_only_hint
    )


async def test_without_a_run_token_tools_act_as_the_owner(daemon: Daemon, project: dict[str, Any]) -> None:
    async with mcp_client({"PEERD_SOCKET": str(daemon.paths.socket)}) as session:
        listed = await session.call_tool("project_list", {})
        refused = await session.call_tool("delegate_task", {"task": "review this"})
        invalid = await session.call_tool("thread_read", {"threadId": "t", "limit": 0})
    assert not listed.is_error
    assert listed.structured_content is not None
    assert [p["id"] for p in listed.structured_content["items"]] == [project["id"]]
    assert refused.is_error
    assert payload(refused)["code"] == "parent_not_active"
    assert "thread_launch" in payload(refused)["message"]
    assert invalid.is_error and payload(invalid)["code"] == "invalid_request"
    assert "limit" in payload(invalid)["message"]


@pytest.mark.slow
async def test_a_run_token_file_binds_the_tools_to_that_run(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    # The run hands its token to the test (a test-only step) and stays live until released.
    token_file = tmp_path / "token"
    release = tmp_path / "release"
    prompt = script(
        {"run": f'printf %s "$PEERD_RUN_TOKEN" > {token_file}'},
        {"wait_for_file": str(release)},
        {"reply": "done"},
    )
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    env = {"PEERD_SOCKET": str(daemon.paths.socket), "PEERD_RUN_TOKEN_FILE": str(token_file)}
    while not token_file.exists() or not token_file.read_text():
        await client.call("GET", f"/v1/threads/{launched['threadId']}/wait", params={"timeout": 0.2})
    async with mcp_client(env) as session:
        task = await session.call_tool(
            "delegate_task", {"task": script({"reply": "child done"}), "clientRequestId": "r1"}
        )
        again = await session.call_tool(
            "delegate_task", {"task": script({"reply": "child done"}), "clientRequestId": "r1"}
        )
        waited = await session.call_tool(
            "task_status", {"taskId": payload(task)["taskId"], "wait": True, "timeoutMs": 30_000}
        )
    assert not task.is_error, payload(task)
    assert payload(task)["parentThreadId"] == launched["threadId"]
    assert payload(again)["taskId"] == payload(task)["taskId"]  # a retry reaches the same task
    assert payload(waited)["status"] == "completed"
    assert payload(waited)["result"] == "child done"
    release.write_text("go")
    await wait_terminal(client, launched["threadId"], launched["runId"])
    async with mcp_client(env) as session:
        ended = await session.call_tool("task_status", {"taskId": payload(task)["taskId"]})
    assert ended.is_error and payload(ended)["code"] == "parent_not_active"


async def test_a_removed_token_file_never_falls_back_to_the_owner(tmp_path: Path, daemon: Daemon) -> None:
    env = {"PEERD_SOCKET": str(daemon.paths.socket), "PEERD_RUN_TOKEN_FILE": str(tmp_path / "gone")}
    async with mcp_client(env) as session:
        result = await session.call_tool("project_list", {})
    assert result.is_error and payload(result)["code"] == "parent_not_active"


@pytest.mark.slow
async def test_a_wait_that_times_out_says_how_to_continue(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    prompt = script({"wait_for_file": str(tmp_path / "never")})
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    async with mcp_client({"PEERD_SOCKET": str(daemon.paths.socket)}) as session:
        result = await session.call_tool("thread_wait", {"threadId": launched["threadId"], "timeout": 0.2})
        await session.call_tool("thread_interrupt", {"threadId": launched["threadId"]})
    assert not result.is_error
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert "Call thread_wait again" in block.text


async def test_a_stopped_daemon_is_a_typed_tool_error(tmp_path: Path) -> None:
    async with mcp_client({"PEERD_SOCKET": str(tmp_path / "nothing.sock")}) as session:
        result = await session.call_tool("project_list", {})
    assert result.is_error and payload(result)["code"] == "daemon_unavailable"
    assert "peerd serve" in payload(result)["message"]
