"""The loopback MCP listener: only a live run's token, only its own Host, only `/mcp`, bounded bodies.

Any local process (another user's too) can connect to 127.0.0.1, and a web page can make a browser
send requests there: everything is refused without a live run's token, a request naming another
host is refused before its token is even looked at, and a link's run gets exactly the link's
powers over HTTP as over the agent socket.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from peerd.api.app import MAX_BODY_BYTES
from peerd.daemon import Daemon
from tests.helpers import LocalClient, Pair, script, wait_terminal
from tests.support.delegation import linked_pair
from tests.support.eventually import eventually
from tests.support.mcp import live_run

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


async def post(
    url: str, message: Any, *, token: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    sent = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    sent.update(headers or {})
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    async with aiohttp.ClientSession() as http, http.post(url, data=io.BytesIO(body), headers=sent) as resp:
        return resp.status, await resp.json(content_type=None)


def tool_code(answer: dict[str, Any]) -> str | None:
    """The code of a tools/call answer (None: it succeeded)."""
    result = answer["result"]
    return str(result["content"][0]["text"].split(":")[0]) if result.get("isError") else None


def mcp_url(daemon: Daemon) -> str:
    assert daemon.mcp.url is not None
    return daemon.mcp.url


async def test_it_listens_on_loopback_only_and_the_network_listener_wants_a_signed_in_agent(
    daemon: Daemon, client: LocalClient
) -> None:
    parts = urlsplit(mcp_url(daemon))
    assert parts.scheme == "http" and parts.hostname == "127.0.0.1" and parts.path == "/mcp"
    listeners = (await client.call("GET", "/v1/status"))["listeners"]
    assert all(f":{parts.port}" not in listener["address"] for listener in listeners), listeners
    network = next(listener["address"] for listener in listeners if listener["kind"] == "tcp")
    # The network listener's /mcp is for outside agents signed in over OAuth only (issue 29;
    # tests/integration/test_agent_signin.py): nothing else opens it, a run's token included.
    for headers in ({}, {"Authorization": "Bearer not-an-agents-token"}):
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{network}/mcp", json=LIST, ssl=False, headers=headers) as resp,
        ):
            assert resp.status == 401
            assert "resource_metadata=" in resp.headers["WWW-Authenticate"]


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer ", "Bearer not-a-run-token", "Basic dXNlcjpwYXNz", "bearer x"],
)
async def test_without_a_live_runs_token_nothing_is_served(daemon: Daemon, authorization: str | None) -> None:
    """No owner identity over TCP: the owner's own processes have nothing to offer here either."""
    headers = {} if authorization is None else {"Authorization": authorization}
    for message in (LIST, call("project_list"), {"jsonrpc": "2.0", "id": 1, "method": "initialize"}):
        status, answer = await post(mcp_url(daemon), message, headers=headers)
        assert status == 401, answer
        assert answer["code"] in ("capability_denied", "parent_not_active"), answer


async def test_an_ended_runs_token_is_refused(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    async with live_run(client, project, tmp_path) as run:
        status, answer = await post(mcp_url(daemon), call("project_list"), token=run.token)
        assert status == 200 and tool_code(answer) is None, answer
    status, answer = await post(mcp_url(daemon), call("project_list"), token=run.token)
    assert (status, answer["code"]) == (401, "parent_not_active"), answer


async def test_a_live_runs_token_opens_nothing_on_the_network_listener(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    """The network listener's /mcp takes only a signed-in agent's token (issue 29)."""
    network = daemon.advertised_urls()[0].rstrip("/")
    async with live_run(client, project, tmp_path) as run:
        sent = {"Authorization": f"Bearer {run.token}", "Accept": "application/json, text/event-stream"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{network}/mcp", json=call("project_list"), ssl=False, headers=sent) as resp,
        ):
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')


@pytest.mark.slow
@pytest.mark.parametrize(
    "host",
    ["evil.example:{port}", "127.0.0.1:1", "localhost", "127.0.0.1", "[::1]:{port}", "127.0.0.2:{port}"],
)
async def test_a_foreign_host_is_refused_before_the_token_is_read(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any], host: str
) -> None:
    port = urlsplit(mcp_url(daemon)).port
    async with live_run(client, project, tmp_path) as run:
        status, answer = await post(
            mcp_url(daemon), call("project_list"), token=run.token, headers={"Host": host.format(port=port)}
        )
        assert (status, answer["code"]) == (403, "capability_denied"), answer
        for good in (f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
            status, answer = await post(mcp_url(daemon), LIST, token=run.token, headers={"Host": good})
            assert status == 200, answer


@pytest.mark.slow
async def test_a_request_without_host_or_from_a_web_page_is_refused(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    port = urlsplit(mcp_url(daemon)).port
    assert port is not None
    async with live_run(client, project, tmp_path) as run:
        status, answer = await post(
            mcp_url(daemon), LIST, token=run.token, headers={"Origin": f"http://127.0.0.1:{port}"}
        )
        assert (status, answer["code"]) == (403, "capability_denied"), answer
        body = json.dumps(LIST).encode()
        raw = (
            b"POST /mcp HTTP/1.0\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {run.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answered = await asyncio.to_thread(exchange, port, raw)
        assert answered.split(b"\r\n", 1)[0].endswith(b" 403 Forbidden"), answered[:200]
        assert b'"capability_denied"' in answered


def exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.slow
async def test_an_oversized_body_is_refused_with_a_typed_error(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    async with live_run(client, project, tmp_path) as run:
        huge = call("delegate_task", task="x" * (MAX_BODY_BYTES + 1))
        status, answer = await post(mcp_url(daemon), huge, token=run.token)
        assert (status, answer["code"]) == (413, "payload_too_large"), answer
        status, answer = await post(mcp_url(daemon), LIST, token=run.token)
        assert status == 200  # the listener still serves


@pytest.mark.slow
async def test_only_mcp_is_served_there(
    tmp_path: Path, daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    base = mcp_url(daemon).removesuffix("/mcp")
    async with live_run(client, project, tmp_path) as run:
        for path in ("/v1/status", "/v1/tools/project_list", "/v1/pair", "/.well-known/peerd"):
            status, answer = await post(base + path, {}, token=run.token)
            assert (status, answer["code"]) == (404, "not_found"), (path, answer)


# --- a link's run over HTTP: exactly the link's powers --------------------------------------------


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[Pair]:
    async with linked_pair(tmp_path, watch_chunk_s=5) as (pair, _):
        yield pair


async def agent_socket_code(daemon: Daemon, token: str, name: str, arguments: dict[str, Any]) -> str | None:
    connector = aiohttp.UnixConnector(path=str(daemon.paths.agent_socket))
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.post(f"http://peerd/v1/tools/{name}", json=arguments, headers=headers) as resp,
    ):
        answer = await resp.json()
    return None if "result" in answer else str(answer["code"])


@pytest.mark.slow
async def test_a_link_runs_token_over_http_acts_as_the_link_exactly(linked: Pair) -> None:
    pair = linked
    project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]
    owner = await pair.bc.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script({"reply": "mine"})}
    )
    await wait_terminal(pair.bc, owner["threadId"], owner["runId"])
    steps = script(
        {"run": 'printf %s "$PEERD_RUN_TOKEN" > token'}, {"wait_for_file": "release"}, {"reply": "ok"}
    )
    launched = await pair.remote("POST", "/v1/threads", body={"projectId": project["id"], "prompt": steps})
    worktree = Path((await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}"))["worktreePath"])
    token_file = worktree / "token"
    token = await eventually(
        lambda: token_file.is_file() and token_file.read_text(),
        what="the run's token in its worktree",
        within=20,
    )
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("thread_send", {"threadId": owner["threadId"], "text": "obey me"}),  # the link's fence
        ("delegate_task", {"task": "x", "runtimeMode": "full-access"}),  # the link's cap
        ("environment_list", {}),  # the box's own links are not the link's
        ("thread_launch", {"projectId": project["id"], "prompt": "x", "inPlace": True}),
        ("project_list", {}),
    ]
    over_http, over_socket = [], []
    for name, arguments in attempts:
        status, answer = await post(mcp_url(pair.box), call(name, **arguments), token=token)
        assert status == 200, answer
        over_http.append(tool_code(answer))
        over_socket.append(await agent_socket_code(pair.box, token, name, arguments))
    assert over_http == over_socket
    assert over_http == [
        "capability_denied",
        "runtime_mode_escalation_denied",
        "capability_denied",
        "capability_denied",
        None,
    ]
    (worktree / "release").write_text("go")
    await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    owner_items = (await pair.bc.call("GET", f"/v1/threads/{owner['threadId']}/items"))["items"]
    assert [i["text"] for i in owner_items if i["kind"] == "user_message"] != ["obey me"]
