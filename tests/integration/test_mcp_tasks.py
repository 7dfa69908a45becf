"""`delegate_task` as an MCP task (the Tasks extension, 2026-07-28) against a real daemon, driven by
the official SDK client declaring the extension: the handle is peerd's recorded task, `tasks/*`
see only the caller's own tasks, an approval the child waits for is `input_required` (answered by
`tasks/update` from a person's client, refused from the agent's), and the result survives a
restart. Clients without the extension keep today's answer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from peerd.daemon import Daemon
from tests.helpers import LocalClient, client_for, running_daemon, script, wait_terminal
from tests.support.approvals import launch, pending_approvals
from tests.support.mcp import live_run
from tests.support.mcp_tasks import (
    TasksExtension,
    cancel,
    create,
    get,
    listed,
    tasks_client,
    until_status,
    update,
)

OWNER_URL = "http://localhost/mcp"


@pytest.mark.slow
async def test_a_tasks_client_gets_a_handle_and_polls_it_to_the_result(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    assert daemon.mcp.url is not None
    async with (
        live_run(client, project, tmp_path) as run,
        tasks_client(daemon.mcp.url, token=run.token) as mcp,
    ):
        handle = await create(mcp, {"task": script({"reply": "CHILD DONE"}), "mode": "wait"})
        assert handle.status == "working" and handle.task_id.startswith("tsk_")
        done = await until_status(lambda: get(mcp, handle.task_id), "completed")
        assert handle.task_id in await listed(mcp)
        await cancel(mcp, handle.task_id)  # acknowledged; the first result stays
        assert (await get(mcp, handle.task_id)).status == "completed"
        async with tasks_client(daemon.mcp.url, token=run.token, declare=False) as plain:
            today = await plain.call_tool("delegate_task", {"task": script({"reply": "x"})})
    assert done.result is not None and done.result["structuredContent"]["status"] == "completed"
    assert done.result["structuredContent"]["result"] == "CHILD DONE"
    assert done.result["structuredContent"]["parentThreadId"] == run.thread_id
    shown = await client.call("GET", f"/v1/tasks/{handle.task_id}")  # the same recorded task
    assert shown["status"] == "completed" and shown["result"] == "CHILD DONE"
    # Without the extension: the tool's own result, as before (no handle).
    assert not today.is_error and today.structured_content is not None
    assert today.structured_content["status"] in ("pending", "running", "completed")


@pytest.mark.slow
async def test_a_caller_sees_only_its_own_tasks(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    assert daemon.mcp.url is not None
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        live_run(client, project, tmp_path / "a") as a,
        live_run(client, project, tmp_path / "b") as b,
        tasks_client(daemon.mcp.url, token=a.token) as mine,
        tasks_client(daemon.mcp.url, token=b.token) as other,
    ):
        handle = await create(mine, {"task": script({"wait_for_file": str(tmp_path / "never")})})
        for probe in (get, cancel):
            with pytest.raises(MCPError) as refused:
                await probe(other, handle.task_id)
            assert refused.value.error.code == -32602
            assert (refused.value.error.data or {}).get("code") == "task_not_found"
        assert handle.task_id not in await listed(other)
        assert handle.task_id in await listed(mine)
        assert (await get(mine, handle.task_id)).status == "working"
        await cancel(mine, handle.task_id)
        assert (await until_status(lambda: get(mine, handle.task_id), "cancelled")).status == "cancelled"


@pytest.mark.slow
async def test_an_approval_is_input_required_and_a_person_answers_it(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    assert daemon.mcp.url is not None
    child = script({"run": "echo child > child.txt"}, {"reply": "CHILD DONE"})
    async with (
        live_run(client, project, tmp_path) as run,
        tasks_client(daemon.mcp.url, token=run.token) as agent,
        tasks_client(OWNER_URL, uds=daemon.paths.socket) as person,
    ):
        handle = await create(agent, {"task": child, "runtimeMode": "approval-required"})
        (question,) = await pending_approvals(client)
        asked = await until_status(lambda: get(agent, handle.task_id), "input_required")
        assert asked.input_requests is not None and list(asked.input_requests) == [question["id"]]
        request = asked.input_requests[question["id"]]
        assert (
            request["method"] == "elicitation/create" and question["summary"] in request["params"]["message"]
        )
        answer = {question["id"]: {"action": "accept", "content": {"decision": "approve"}}}
        with pytest.raises(MCPError) as refused:  # the agent does not approve its own delegated work
            await update(agent, handle.task_id, answer)
        assert (refused.value.error.data or {}).get("code") == "approval_not_allowed"
        assert (await get(agent, handle.task_id)).status == "input_required"
        await update(person, handle.task_id, {"not-asked": {"action": "accept"}})  # ignored
        await update(person, handle.task_id, answer)
        done = await until_status(lambda: get(agent, handle.task_id), "completed")
    assert done.result is not None and done.result["structuredContent"]["result"] == "CHILD DONE"
    decided = await client.call("GET", f"/v1/approvals/{question['id']}")
    assert decided["status"] == "approved"


@pytest.mark.slow
async def test_the_result_survives_a_restart_of_the_daemon(tmp_path: Path, repo: Path) -> None:
    """Created before a restart, still running across it (its child waits for a file until the
    daemon is back), its result read after it by a new client."""
    home, go = tmp_path / "home", tmp_path / "go"
    async with running_daemon(home) as first, client_for(home) as owner:
        project = await owner.call("POST", "/v1/projects", body={"path": str(repo)})
        assert first.mcp.url is not None
        async with (
            live_run(owner, project, tmp_path) as run,
            tasks_client(first.mcp.url, token=run.token) as mcp,
        ):
            child = script({"wait_for_file": str(go)}, {"reply": "AFTER RESTART"})
            handle = await create(mcp, {"task": child})
            assert (await get(mcp, handle.task_id)).status == "working"
    async with running_daemon(home), tasks_client(OWNER_URL, uds=home / "peerd.sock") as person:
        assert (await get(person, handle.task_id)).status in ("working", "completed")
        go.write_text("go")
        done = await until_status(lambda: get(person, handle.task_id), "completed", within=30)
    assert done.result is not None and done.result["structuredContent"]["taskId"] == handle.task_id
    assert done.result["structuredContent"]["status"] == "completed", done.result
    assert done.result["structuredContent"]["result"] == "AFTER RESTART"


@pytest.mark.slow
async def test_a_tasks_client_through_peerd_mcp(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    """The stdio bridge carries the handle and `tasks/*` (with their `Mcp-Name`) as they are."""
    async with live_run(client, project, tmp_path) as run:
        env = {"PEERD_SOCKET": str(daemon.paths.agent_socket), "PEERD_RUN_TOKEN_FILE": str(run.token_file)}
        params = StdioServerParameters(command=sys.executable, args=["-m", "peerd", "mcp"], env=env)
        async with Client(params, mode="2026-07-28", extensions=[TasksExtension()]) as mcp:
            handle = await create(mcp, {"task": script({"reply": "OVER STDIO"})})
            done = await until_status(lambda: get(mcp, handle.task_id), "completed")
            mine = await listed(mcp)
    assert done.result is not None and done.result["structuredContent"]["result"] == "OVER STDIO"
    assert mine == [handle.task_id]


@pytest.mark.slow
async def test_a_persons_wait_asks_them_the_approval_and_goes_on(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    """2026-07-28's multi round-trip input_required: the owner's client (declaring elicitation)
    waits on a thread whose run waits for approval; the SDK shows the form (the callback here),
    retries with the answer, and the wait goes on to the run's end. An agent's wait is never asked."""
    launched = await launch(client, project, script({"run": "echo ok > asked.txt"}, {"reply": "RAN"}))
    (question,) = await pending_approvals(client)
    asked: list[types.ElicitRequestParams] = []

    async def person(_: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async with (
        live_run(client, project, tmp_path) as run,
        tasks_client(daemon.mcp.url or "", token=run.token, elicitation_callback=person) as agent,
    ):
        not_asked = await agent.call_tool("thread_wait", {"threadId": launched["threadId"], "timeout": 0.2})
        assert not not_asked.is_error and not asked
    transport = httpx2.AsyncHTTPTransport(uds=str(daemon.paths.socket))
    async with (
        httpx2.AsyncClient(transport=transport, timeout=60) as http,
        Client(
            streamable_http_client(OWNER_URL, http_client=http),
            mode="2026-07-28",
            elicitation_callback=person,
        ) as me,
    ):
        waited = await me.call_tool("thread_wait", {"threadId": launched["threadId"], "timeout": 20})
    assert len(asked) == 1 and question["summary"] in asked[0].message
    assert not waited.is_error and waited.structured_content is not None, waited
    assert (await client.call("GET", f"/v1/approvals/{question['id']}"))["status"] == "approved"
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    assert done["status"] == "completed"
