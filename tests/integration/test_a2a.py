"""The A2A face against a real daemon (real TLS, real SQLite, the script provider), driven by the
official `a2a-sdk` client with a link's access token, plus the hostile cases: no token, a
read-only link, another link's task, and push webhooks to addresses that are not allowed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError, TaskNotFoundError
from aiohttp import web
from google.protobuf.json_format import MessageToDict

from peerd.a2a import push as push_module
from peerd.api.oauth import PAIRING_GRANT
from peerd.config import A2AConfig, Config
from peerd.core import pairing_code
from peerd.daemon import Daemon
from peerd.doctor import run_checks
from peerd.doctor.gather import gather
from tests.helpers import client_for, make_repo, running_daemon, script
from tests.support.signin import Agent

pytestmark = pytest.mark.slow  # one daemon, several clients, a few runs


@dataclass
class Box:
    daemon: Daemon
    url: str
    ssl: ssl.SSLContext
    project_id: str
    client_ids: dict[str, str] = dataclasses.field(default_factory=dict)  # access token -> client

    async def token(self, access: str) -> str:
        async with client_for(self.daemon.paths.home) as oc:
            code = pairing_code.decode(
                str((await oc.call("POST", "/v1/pair", body={"access": access}))["code"])
            )
        form = {
            "grant_type": PAIRING_GRANT,
            "code_id": code.code_id,
            "code_secret": code.secret,
            "client_label": f"a2a-{access}-{uuid.uuid4().hex[:6]}",
            "access": access,
        }
        async with httpx.AsyncClient(verify=self.ssl) as http:
            answer = await http.post(self.url + "/oauth/token", data=form)
        assert answer.status_code == 200, answer.text
        self.client_ids[answer.json()["access_token"]] = answer.json()["client_id"]
        return str(answer.json()["access_token"])

    @asynccontextmanager
    async def client(self, token: str, *, streaming: bool = False) -> AsyncIterator[Client]:
        http = httpx.AsyncClient(verify=self.ssl, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        config = ClientConfig(streaming=streaming, httpx_client=http, supported_protocol_bindings=["JSONRPC"])
        client = await create_client(self.url, client_config=config)
        try:
            yield client
        finally:
            await client.close()
            await http.aclose()


@asynccontextmanager
async def a_box(tmp_path: Path, allow: list[str]) -> AsyncIterator[Box]:
    settings = Config(a2a=A2AConfig(allow_private_push=allow))
    async with running_daemon(tmp_path / "box", label="box", settings=settings) as daemon:
        repo = make_repo(tmp_path / "repo")
        async with client_for(daemon.paths.home) as oc:
            project = await oc.call("POST", "/v1/projects", body={"path": str(repo)})
        assert daemon.identity is not None
        context = ssl.create_default_context(cadata=daemon.identity.cert_pem.decode())
        context.check_hostname = False
        yield Box(daemon, daemon.advertised_urls()[0], context, str(project["id"]))


def message(text: str, *, context_id: str = "", message_id: str | None = None) -> Message:
    return Message(
        message_id=message_id or uuid.uuid4().hex,
        role=Role.ROLE_USER,
        context_id=context_id,
        parts=[Part(text=text)],
    )


async def send(client: Client, msg: Message, *, now: bool = False, **config: Any) -> Task:
    """SendMessage; `now`: return at once (returnImmediately), else when the task settled."""
    request = SendMessageRequest(message=msg)
    request.configuration.return_immediately = now
    if config:
        request.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(**config))
    async for event in client.send_message(request):
        if event.HasField("task"):
            return event.task
    raise AssertionError("no task answered")


async def until_state(client: Client, task_id: str, states: set[int], within: float = 30.0) -> Task:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state in states:
            return task
        assert asyncio.get_running_loop().time() < deadline, (
            f"task stuck in {TaskState.Name(task.status.state)}"
        )
        await asyncio.sleep(0.1)


@asynccontextmanager
async def webhook() -> AsyncIterator[tuple[str, list[tuple[str | None, dict[str, Any]]]]]:
    """A webhook on 127.0.0.1 recording (token, body) per push."""
    got: list[tuple[str | None, dict[str, Any]]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append((request.headers.get("X-A2A-Notification-Token"), await request.json()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/hook", got
    finally:
        await runner.cleanup()


DONE = {TaskState.TASK_STATE_COMPLETED}
ENDED = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}


async def test_an_a2a_client_sends_follows_cancels_and_gets_a_push(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with a_box(tmp_path, ["127.0.0.1/32"]) as box, webhook() as (hook_url, pushes):
        token = await box.token("auto")
        # The public card says where and how, without a token.
        async with httpx.AsyncClient(verify=box.ssl) as http:
            card = (await http.get(box.url + "/.well-known/agent-card.json")).json()
        assert card["capabilities"]["pushNotifications"] is True
        assert {i["protocolBinding"] for i in card["supportedInterfaces"]} == {"JSONRPC", "HTTP+JSON"}
        assert "bearer" in card["securitySchemes"]
        assert box.project_id not in json.dumps(card), "the public card lists no project"

        async with box.client(token) as client:
            extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
            assert f"project:{box.project_id}" in {skill.id for skill in extended.skills}
            assert {i.url for i in extended.supported_interfaces} == {
                box.url + "/v1/a2a/jsonrpc",
                box.url + "/v1/a2a/rest",
            }

            msg = message(script({"reply": "hello from the box"}))
            task = await send(client, msg, url=hook_url, token="hook-secret")
            assert task.context_id, "the thread"
            assert task.status.state == TaskState.TASK_STATE_COMPLETED, (
                "a blocking send answers once it ended"
            )
            done = await until_state(client, task.id, DONE)
            assert done.artifacts[0].parts[0].text == "hello from the box"

            again = await send(client, msg)  # the same messageId: the same thread and run
            assert (again.id, again.context_id) == (task.id, task.context_id)

            placed_msg = message(script({"reply": "placed"}))
            placed_msg.metadata.update({"environmentId": "auto"})  # peerd places it: here, the only box
            placed = await send(client, placed_msg)
            assert placed.status.state == TaskState.TASK_STATE_COMPLETED
            assert placed.artifacts[0].parts[0].text == "placed"

            follow = await send(client, message(script({"reply": "second"}), context_id=task.context_id))
            assert follow.context_id == task.context_id and follow.id != task.id
            await until_state(client, follow.id, DONE)

            slow = await send(client, message(script({"wait": 60}, {"reply": "never"})), now=True)
            await until_state(client, slow.id, {TaskState.TASK_STATE_WORKING})
            await client.cancel_task(CancelTaskRequest(id=slow.id))
            cancelled = await until_state(client, slow.id, ENDED)
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED

        async def pushed_completed() -> bool:
            return any(
                "task" in body and body["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
                for _, body in pushes
            )

        for _ in range(200):
            if await pushed_completed():
                break
            await asyncio.sleep(0.05)
        assert await pushed_completed(), pushes
        assert {tok for tok, _ in pushes} == {"hook-secret"}
        logged = capsys.readouterr()
        assert "run.end" in logged.out, "the daemon's log is what was read"
        for secret in ("hook-secret", token):
            assert secret not in logged.out + logged.err, "a token reached the log"
        assert all(
            (body.get("task") or body.get("statusUpdate"))["taskId" if "statusUpdate" in body else "id"]
            == task.id
            for _, body in pushes
        )


async def test_a2a_needs_a_token_and_keeps_links_to_their_own(tmp_path: Path) -> None:
    async with a_box(tmp_path, []) as box:
        rpc = box.url + "/v1/a2a/jsonrpc"
        body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        async with httpx.AsyncClient(verify=box.ssl) as http:
            for headers in ({}, {"Authorization": "Bearer nonsense"}):
                answer = await http.post(rpc, json=body, headers=headers)
                assert answer.status_code == 401
                assert "result" not in answer.text and "contextId" not in answer.text
            rest = await http.get(box.url + "/v1/a2a/rest/tasks/x")
            assert rest.status_code == 401

        reader, mine, other = await box.token("read-only"), await box.token("auto"), await box.token("auto")
        async with box.client(reader) as client:
            with pytest.raises(A2AError) as refused:
                await send(client, message(script({"reply": "no"})))
            assert refused.value.data == {"peerdCode": "capability_denied"}
        async with box.client(mine) as client:
            task = await send(
                client, message(script({"wait": 60}, {"reply": "x"}), message_id="m-1"), now=True
            )
            with pytest.raises(A2AError) as reused:  # the same messageId for another message
                await send(client, message(script({"reply": "other"}), message_id="m-1"), now=True)
            assert reused.value.data == {"peerdCode": "idempotency_key_reused"}
        async with box.client(other) as client:
            theirs = await send(client, message(script({"reply": "x"}), message_id="m-1"), now=True)
            assert theirs.id != task.id, "keys of two callers never collide"
            listed = await client.list_tasks(ListTasksRequest())
            assert {t.id for t in listed.tasks} == {theirs.id}, "only its own tasks are listed"
            with pytest.raises(TaskNotFoundError):  # a contextId of another's thread: not followable
                await send(client, message(script({"reply": "x"}), context_id=task.context_id), now=True)
            with pytest.raises(TaskNotFoundError):  # not even told it exists
                await client.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(CancelTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):  # nor hear of it through a webhook
                await client.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task.id, url="https://hooks.example.com/x")
                )
        async with box.client(mine) as client:
            still = await client.get_task(GetTaskRequest(id=task.id))
            assert still.status.state != TaskState.TASK_STATE_CANCELED
            await client.cancel_task(CancelTaskRequest(id=task.id))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://localhost:9/hook",  # a name that resolves to loopback
    ],
)
async def test_push_webhooks_to_private_addresses_are_refused_by_default(tmp_path: Path, url: str) -> None:
    async with a_box(tmp_path, []) as box:
        token = await box.token("auto")
        async with box.client(token) as client:
            with pytest.raises(A2AError) as refused:
                await send(client, message(script({"reply": "x"})), url=url, token="t")
            assert refused.value.data == {"peerdCode": "push_address_refused"}
        assert await (await box.daemon.parts.a2a.face()).push.owed() == []  # type: ignore[union-attr]
        async with client_for(box.daemon.paths.home) as oc:
            assert (await oc.call("GET", "/v1/threads"))["items"] == [], "refused before anything started"


async def test_a_name_rebound_to_loopback_is_refused_at_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked at registration on a public address, the name then resolves to 127.0.0.1 (DNS
    rebinding): the delivery checks again, sends nothing and gives up with the reason."""
    async with a_box(tmp_path, []) as box, webhook() as (hook_url, pushes):
        push = (await box.daemon.parts.a2a.face()).push  # type: ignore[union-attr]
        lookups: list[str] = []
        sent_to: list[list[str]] = []
        real_send = push._send

        async def guarded_send(row: Any, addresses: list[str], body: dict[str, Any]) -> None:
            sent_to.append(addresses)
            if addresses != ["127.0.0.1"]:  # nothing leaves this machine, whatever the code does
                raise OSError("test guard: not sent")
            await real_send(row, addresses, body)

        async def rebinding(host: str, port: int) -> list[str]:
            lookups.append(host)
            # The two lookups of the registration (the check before launching, and the config's);
            # from the first delivery on, the name points at loopback.
            return ["93.184.216.34"] if len(lookups) <= 2 else ["127.0.0.1"]

        monkeypatch.setattr(push, "_resolve", rebinding)
        monkeypatch.setattr(push, "_send", guarded_send)
        port = urlsplit(hook_url).port
        token = await box.token("auto")
        async with box.client(token) as client:
            url = f"http://hooks.example:{port}/hook"
            await send(client, message(script({"reply": "x"})), now=True, url=url, token="t")

        async def given_up() -> list[dict[str, Any]]:
            return [row for row in await push.owed() if row["given_up"]]

        for _ in range(200):
            if await given_up():
                break
            await asyncio.sleep(0.05)
        refused = await given_up()
        assert refused and "127.0.0.1" in refused[0]["given_up"]
        assert pushes == [], "the webhook (on the rebound address) got nothing"
        assert len(lookups) >= 3, "resolved again at delivery"
        assert sent_to == [], "nothing was sent, to either address"


async def test_streaming_follows_a_task_to_its_end_over_sse(tmp_path: Path) -> None:
    async with a_box(tmp_path, []) as box:
        token = await box.token("auto")
        async with box.client(token, streaming=True) as client:
            request = SendMessageRequest(message=message(script({"wait": 0.5}, {"reply": "streamed"})))
            states = []
            async for event in client.send_message(request):
                if event.HasField("task"):
                    states.append(event.task.status.state)
                elif event.HasField("status_update"):
                    states.append(event.status_update.status.state)
            assert states[-1] == TaskState.TASK_STATE_COMPLETED
            assert len(states) >= 2, "a task first, then its updates"


async def test_the_owner_socket_serves_a2a_and_a_waiting_approval_is_input_required(tmp_path: Path) -> None:
    async with a_box(tmp_path, []) as box:
        transport = httpx.AsyncHTTPTransport(uds=str(box.daemon.paths.socket))
        headers = {"A2A-Version": "1.0"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=headers
        ) as http:

            async def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
                body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
                answer = (await http.post("/v1/a2a/jsonrpc", json=body)).json()
                assert "result" in answer, answer
                result: dict[str, Any] = answer["result"]
                return result

            sent = await rpc(
                "SendMessage",
                {
                    "message": {
                        "messageId": "owner-1",
                        "role": "ROLE_USER",
                        "parts": [{"text": script({"run": "echo a > a.txt"}, {"reply": "done"})}],
                    },
                    "metadata": {"runtimeMode": "approval-required", "projectId": box.project_id},
                },
            )
            task_id = sent["task"]["id"]
            state = ""
            for _ in range(300):
                state = (await rpc("GetTask", {"id": task_id}))["status"]["state"]
                if state == "TASK_STATE_INPUT_REQUIRED":
                    break
                await asyncio.sleep(0.05)
            assert state == "TASK_STATE_INPUT_REQUIRED"
            waiting = (await rpc("GetTask", {"id": task_id}))["status"]["message"]["parts"][0]["text"]
            assert waiting.startswith("Waiting for a person to approve ")
            canceled = await rpc("CancelTask", {"id": task_id})
            assert canceled["id"] == task_id


async def test_an_owed_push_survives_a_restart_and_is_delivered_after(tmp_path: Path) -> None:
    """The webhook fails (500) while the box runs; the box stops; started again, it delivers."""
    answers = [500]
    got: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=answers[0])

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook_url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        async with a_box(tmp_path, ["127.0.0.1/32"]) as box:
            token = await box.token("auto")
            async with box.client(token) as client:
                task = await send(client, message(script({"reply": "x"})), url=hook_url, token="t")
                await until_state(client, task.id, DONE)
            push = (await box.daemon.parts.a2a.face()).push  # type: ignore[union-attr]

            async def failed_completed() -> bool:
                rows = await push.owed()
                return any(r["state"] == "completed" and r["attempts"] >= 1 for r in rows)

            for _ in range(200):
                if await failed_completed():
                    break
                await asyncio.sleep(0.05)
            assert await failed_completed()
        answers[0] = 204
        got.clear()
        settings = Config(a2a=A2AConfig(allow_private_push=["127.0.0.1/32"]))
        async with running_daemon(tmp_path / "box", label="box", settings=settings) as again:
            for _ in range(100):
                if any(
                    body.get("task", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
                    for body in got
                ):
                    break
                await asyncio.sleep(0.1)
            rows = await (await again.parts.a2a.face()).push.owed()  # type: ignore[union-attr]
            assert [r["delivered_at"] is not None for r in rows if r["state"] == "completed"] == [True]
            assert any(body.get("task", {}).get("id") == task.id for body in got)
    finally:
        await runner.cleanup()


async def test_a_webhook_that_keeps_failing_is_retried_then_given_up_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(push_module, "MAX_ATTEMPTS", 3)
    monkeypatch.setattr(push_module, "backoff_s", lambda attempts: 0.05 * attempts)
    hits: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with a_box(tmp_path, ["127.0.0.1/32"]) as box:
            token = await box.token("auto")
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
            async with box.client(token) as client:
                await send(client, message(script({"reply": "x"})), url=url, token="t")
            push = (await box.daemon.parts.a2a.face()).push  # type: ignore[union-attr]

            async def ended() -> list[dict[str, Any]]:
                return [r for r in await push.owed() if r["given_up"] or r["delivered_at"]]

            for _ in range(200):
                rows = await push.owed()
                if any(r["state"] == "completed" for r in rows) and len(await ended()) == len(rows):
                    break
                await asyncio.sleep(0.05)
            rows = await push.owed()
            assert rows and all(r["delivered_at"] is None for r in rows)
            reason = "not delivered after 3 attempts (SendFailed: HTTP 503)"
            assert all(r["given_up"] == reason for r in rows), rows
            assert len(hits) == 3 * len(rows), "each state tried exactly MAX_ATTEMPTS times"

            # Shown where a person looks: the task's GetTask, `peerd status`, `peerd doctor`.
            async with box.client(token) as client:
                task_id = rows[0]["task_id"]
                seen = MessageToDict(await client.get_task(GetTaskRequest(id=task_id)))
            missed = seen["metadata"]["peerdPushesGivenUp"]
            assert {m["state"] for m in missed} == {r["state"] for r in rows}
            assert {m["reason"] for m in missed} == {reason}
            async with client_for(box.daemon.paths.home) as oc:
                pushes = (await oc.call("GET", "/v1/status"))["a2aPushes"]
            assert pushes["givenUp"] == len(rows) and pushes["latest"][0]["reason"] == reason
            assert pushes["latest"][0]["webhook"] == url.removesuffix("/hook"), "never the path"
            status = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "peerd", "--home", str(box.daemon.paths.home), "status"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            shown = (
                rf"^a2a pushes +{len(rows)} given up in the last 7 days; the latest, to http://127\.0\.0\.1:"
            )
            assert re.search(shown, status.stdout, re.MULTILINE), status.stdout
            (check,) = [ch for ch in run_checks(await gather(box.daemon.paths)) if ch.name == "a2a-pushes"]
            assert check.status == "warn" and reason in check.detail and check.table
            assert check.fix is not None and "allow_private_push" in check.fix
    finally:
        await runner.cleanup()


async def test_a_revoked_link_is_pushed_nothing_more(tmp_path: Path) -> None:
    async with a_box(tmp_path, ["127.0.0.1/32"]) as box, webhook() as (hook_url, pushes):
        token = await box.token("auto")
        async with box.client(token) as client:
            task = await send(
                client, message(script({"wait": 60}, {"reply": "x"})), now=True, url=hook_url, token="t"
            )
            await until_state(client, task.id, {TaskState.TASK_STATE_WORKING})
        push = (await box.daemon.parts.a2a.face()).push  # type: ignore[union-attr]
        for _ in range(200):
            if any(r["state"] == "working" and r["delivered_at"] for r in await push.owed()):
                break
            await asyncio.sleep(0.05)
        async with client_for(box.daemon.paths.home) as oc:
            await oc.call("POST", f"/v1/clients/{box.client_ids[token]}/revoke", body={})
        for _ in range(200):
            if any(
                r["state"] == "canceled" and (r["given_up"] or r["delivered_at"]) for r in await push.owed()
            ):
                break
            await asyncio.sleep(0.05)
        ended = [r for r in await push.owed() if r["state"] == "canceled"]
        assert (
            ended and ended[0]["given_up"] == "the link that registered this webhook was revoked or expired"
        )
        assert all("task" not in body for _, body in pushes), "the end was not pushed"


async def test_an_agent_signed_in_with_oauth_speaks_a2a_fenced_to_its_own(tmp_path: Path) -> None:
    """Issue 29: a signed-in agent (OAuth + PKCE, approved with an agent pairing code) is an
    authenticated A2A caller like a link: it starts and follows its own tasks, sees no one else's,
    and its token opens nothing else under /v1. The card names the sign-in."""
    async with a_box(tmp_path, []) as box:
        async with client_for(box.daemon.paths.home) as oc:
            code = (await oc.call("POST", "/v1/pair", body={"access": "auto", "purpose": "agent"}))["code"]
        async with Agent(box.daemon) as agent:
            token = str((await agent.sign_in(code))["access_token"])
        linked = await box.token("auto")
        async with box.client(linked) as client:
            theirs = await send(client, message(script({"wait": 60}, {"reply": "x"})), now=True)
        async with box.client(token) as client:
            mine = await send(client, message(script({"reply": "from the agent"})))
            assert mine.status.state == TaskState.TASK_STATE_COMPLETED
            listed = await client.list_tasks(ListTasksRequest())
            assert {t.id for t in listed.tasks} == {mine.id}
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=theirs.id))
        async with httpx.AsyncClient(verify=box.ssl) as http:
            elsewhere = await http.get(box.url + "/v1/threads", headers={"Authorization": f"Bearer {token}"})
            card = (await http.get(box.url + "/.well-known/agent-card.json")).json()
        assert elsewhere.status_code == 401
        flow = card["securitySchemes"]["oauth"]["oauth2SecurityScheme"]["flows"]["authorizationCode"]
        assert flow["authorizationUrl"] == box.url + "/oauth/authorize" and flow["pkceRequired"] is True
        async with box.client(linked) as client:
            await client.cancel_task(CancelTaskRequest(id=theirs.id))


async def test_a_task_queued_behind_a_run_is_cancelled_and_never_starts(tmp_path: Path) -> None:
    """Issue 29: CancelTask of a task still queued behind another run of its thread cancels it
    (answered `canceled`); once the run before it ends, the thread starts nothing."""
    async with a_box(tmp_path, []) as box:
        token = await box.token("auto")
        async with box.client(token) as client:
            first = await send(client, message(script({"wait": 60}, {"reply": "first"})), now=True)
            await until_state(client, first.id, {TaskState.TASK_STATE_WORKING})
            queued = await send(
                client, message(script({"reply": "never"}), context_id=first.context_id), now=True
            )
            assert queued.status.state == TaskState.TASK_STATE_SUBMITTED
            answer = await client.cancel_task(CancelTaskRequest(id=queued.id))
            assert answer.status.state == TaskState.TASK_STATE_CANCELED
            await client.cancel_task(CancelTaskRequest(id=first.id))  # the thread's queue flows on
            await until_state(client, first.id, ENDED)
            again = await client.get_task(GetTaskRequest(id=queued.id))
            assert again.status.state == TaskState.TASK_STATE_CANCELED and not again.artifacts
            with pytest.raises(A2AError):  # it has ended: nothing more to cancel
                await client.cancel_task(CancelTaskRequest(id=queued.id))
        async with client_for(box.daemon.paths.home) as oc:
            thread = await oc.call("GET", f"/v1/threads/{first.context_id}")
            run = await oc.call("GET", f"/v1/threads/{first.context_id}/wait", params={"run": queued.id})
            assert thread["latestRun"]["id"] == queued.id and run["status"] == "cancelled"
            assert thread["latestRun"]["startedAt"] is None, "the cancelled run never started"


async def test_list_tasks_pages_newest_first_with_a_token_and_only_the_callers_own(tmp_path: Path) -> None:
    """Issue 29: ListTasks honours pageSize and pageToken (newest first by when each task was made;
    nextPageToken until the last page), lists only the caller's own, and refuses a token it did not
    give with a typed error."""
    async with a_box(tmp_path, []) as box:
        mine, other = await box.token("auto"), await box.token("auto")
        async with box.client(other) as client:
            theirs = await send(client, message(script({"reply": "theirs"})), now=True)
        async with box.client(mine) as client:
            first = await send(client, message(script({"reply": "0"})))
            made = [first.id]
            for n in range(1, 5):  # a new thread, and follow-ups in the first one
                context = first.context_id if n % 2 else ""
                made.append((await send(client, message(script({"reply": str(n)}), context_id=context))).id)
            seen: list[str] = []
            token = ""
            for _ in range(5):
                page = await client.list_tasks(ListTasksRequest(page_size=2, page_token=token))
                assert len(page.tasks) <= 2 and page.page_size == 2 and page.total_size == 5
                assert not any(task.artifacts for task in page.tasks), "no artifacts unless asked"
                seen += [task.id for task in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            assert seen == made[::-1], "newest first, each once, none of another's"
            assert theirs.id not in seen
            one = await client.list_tasks(
                ListTasksRequest(context_id=first.context_id, include_artifacts=True)
            )
            assert [t.id for t in one.tasks] == [made[3], made[1], made[0]]
            assert one.tasks[-1].artifacts[0].parts[0].text == "0"
            done = await client.list_tasks(
                ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=100)
            )
            assert {t.id for t in done.tasks} <= set(made)
            with pytest.raises(A2AError) as refused:
                await client.list_tasks(ListTasksRequest(page_token="not-a-token"))
            assert refused.value.data == {"peerdCode": "invalid_page_token"}
