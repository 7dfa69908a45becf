"""Issue 29: an A2A message peerd places on a linked box (`environmentId: "auto"`) is a task the
laptop follows there: two real daemons on loopback over TLS, the official a2a-sdk client on the
laptop's owner socket. The task completes there and is answered here, a retry of the message
reaches the same thread, a follow-up goes to the same thread there, it is cancelled there (live or
queued), it waits for a person there (`input-required`), it is pushed and streamed here, and it
survives a restart of either daemon.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError, TaskNotFoundError
from aiohttp import web

from peerd.a2a import remote as remote_module
from peerd.api.localclient import LocalClient
from peerd.api.oauth import PAIRING_GRANT
from peerd.config import A2AConfig, Config, PlacementConfig
from peerd.core import pairing_code
from peerd.daemon import Daemon
from peerd.errors import PeerdError, PeerUnreachable
from peerd.paths import Paths
from tests.helpers import client_for, free_port, make_repo, running_daemon, script
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # two daemons

# The laptop never takes `auto` work itself: the box (linked, same repository) is the one choice.
LAPTOP = Config(
    placement=PlacementConfig(preference="manual-only"), a2a=A2AConfig(allow_private_push=["127.0.0.1/32"])
)
DONE = {TaskState.TASK_STATE_COMPLETED}
ENDED = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}


@asynccontextmanager
async def owner_a2a(daemon: Daemon, *, streaming: bool = False) -> AsyncIterator[Client]:
    """The a2a-sdk client on a daemon's owner socket (no card is served there: it is given)."""
    transport = httpx.AsyncHTTPTransport(uds=str(Paths(daemon.paths.home).socket))
    http = httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60)
    card = AgentCard(
        name="peerd laptop",
        supported_interfaces=[
            AgentInterface(
                url="http://localhost/v1/a2a/jsonrpc", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
    )
    config = ClientConfig(streaming=streaming, httpx_client=http, supported_protocol_bindings=["JSONRPC"])
    client = await create_client(card, client_config=config)
    try:
        yield client
    finally:
        await client.close()
        await http.aclose()


async def set_up(laptop: Daemon, box: Daemon, tmp_path: Path) -> str:
    """Link the laptop to the box, one clone of one origin on each: the laptop's project id."""
    async with client_for(laptop.paths.home) as lc, client_for(box.paths.home) as bc:
        here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "laptop-repo"))})
        await bc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))})
        code = await bc.call("POST", "/v1/pair", body={"access": "auto"})
        await lc.call("POST", "/v1/links", body={"code": code["code"], "access": "auto"})
    return str(here["id"])


def placed(text: str, project_id: str, *, message_id: str | None = None, **meta: str) -> Message:
    msg = Message(message_id=message_id or uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)])
    msg.metadata.update({"environmentId": "auto", "projectId": project_id, **meta})
    return msg


def follow_up(text: str, context_id: str) -> Message:
    return Message(
        message_id=uuid.uuid4().hex, role=Role.ROLE_USER, context_id=context_id, parts=[Part(text=text)]
    )


async def send(client: Client, msg: Message, *, now: bool = False, **push: Any) -> Task:
    request = SendMessageRequest(message=msg)
    request.configuration.return_immediately = now
    if push:
        request.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(**push))
    async for event in client.send_message(request):
        if event.HasField("task"):
            return event.task
    raise AssertionError("no task answered")


async def until_state(client: Client, task_id: str, states: set[int], within: float = 30.0) -> Task:
    task: Task = await eventually(
        lambda: client.get_task(GetTaskRequest(id=task_id)),
        what=f"task {task_id} in {[TaskState.Name(s) for s in states]}",
        until=lambda task: task.status.state in states,
        within=within,
    )
    return task


async def link_client_of(daemon: Daemon) -> tuple[Client, httpx.AsyncClient]:
    """An A2A client of `daemon`'s network listener with a link's token (another machine's)."""
    async with client_for(daemon.paths.home) as oc:
        code = pairing_code.decode(str((await oc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]))
    assert daemon.identity is not None
    tls = ssl.create_default_context(cadata=daemon.identity.cert_pem.decode())
    tls.check_hostname = False
    url = daemon.advertised_urls()[0]
    form = {
        "grant_type": PAIRING_GRANT,
        "code_id": code.code_id,
        "code_secret": code.secret,
        "client_label": "elsewhere",
        "access": "auto",
    }
    async with httpx.AsyncClient(verify=tls) as http:
        token = (await http.post(url + "/oauth/token", data=form)).json()["access_token"]
    http = httpx.AsyncClient(verify=tls, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=["JSONRPC"])
    return await create_client(url, client_config=config), http


async def box_run(bc: LocalClient, thread_id: str, run_id: str, *, wait: float = 0) -> dict[str, Any]:
    waited: dict[str, Any] = await bc.call(
        "GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": wait}
    )
    return waited


async def test_an_auto_message_placed_on_the_box_is_followed_to_its_end_across_restarts(
    tmp_path: Path,
) -> None:
    box_listen = f"127.0.0.1:{free_port()}"  # the box comes back where the laptop's link points
    async with running_daemon(tmp_path / "box", label="box", listen=box_listen) as box:
        async with running_daemon(tmp_path / "laptop", label="laptop", settings=LAPTOP) as laptop:
            project_id = await set_up(laptop, box, tmp_path)
            async with owner_a2a(laptop) as client, client_for(box.paths.home) as bc:
                msg = placed(script({"reply": "from the box"}), project_id)
                task = await send(client, msg)
                assert task.status.state == TaskState.TASK_STATE_COMPLETED, (
                    "a blocking send waits for the box"
                )
                assert task.artifacts[0].parts[0].text == "from the box"
                there = await bc.call("GET", f"/v1/threads/{task.context_id}")
                assert there["linkLabel"] == "laptop" and there["latestRun"]["id"] == task.id, (
                    "it ran on the box"
                )
                async with client_for(laptop.paths.home) as lc:
                    with pytest.raises(PeerdError) as here:
                        await lc.call("GET", f"/v1/threads/{task.context_id}")
                    assert here.value.code == "thread_not_found", "nothing ran on the laptop"

                again = await send(client, msg)  # the same messageId: the same thread and run there
                assert (again.id, again.context_id) == (task.id, task.context_id)
                assert len((await bc.call("GET", "/v1/threads"))["items"]) == 1
                with pytest.raises(A2AError) as reused:  # the same messageId for another message
                    await send(
                        client, placed(script({"reply": "other"}), project_id, message_id=msg.message_id)
                    )
                assert reused.value.data == {"peerdCode": "idempotency_key_reused"}

                follow = await send(client, follow_up(script({"reply": "second"}), task.context_id))
                assert follow.context_id == task.context_id and follow.id != task.id
                assert follow.status.state == TaskState.TASK_STATE_COMPLETED
                assert follow.artifacts[0].parts[0].text == "second"

                listed = await client.list_tasks(ListTasksRequest(include_artifacts=True))
                assert [t.id for t in listed.tasks] == [follow.id, task.id]

                # Sent, and the laptop stops while it runs there.
                slow = await send(
                    client, placed(script({"wait": 2}, {"reply": "late"}), project_id), now=True
                )
        # The laptop is down: the box finishes the run, and then restarts itself.
        async with client_for(box.paths.home) as bc:
            assert (await box_run(bc, slow.context_id, slow.id, wait=30))["status"] == "completed"
    async with (
        running_daemon(tmp_path / "box", label="box", listen=box_listen),
        running_daemon(tmp_path / "laptop", label="laptop", settings=LAPTOP) as laptop,
        owner_a2a(laptop) as client,
    ):
        late = await until_state(client, slow.id, DONE)
        assert late.artifacts[0].parts[0].text == "late", "followed again after the restarts"
        first = await client.get_task(GetTaskRequest(id=task.id))
        assert first.status.state == TaskState.TASK_STATE_COMPLETED
        assert first.artifacts[0].parts[0].text == "from the box"


async def test_a_task_placed_on_the_box_is_cancelled_there_live_or_queued(tmp_path: Path) -> None:
    async with (
        running_daemon(tmp_path / "box", label="box") as box,
        running_daemon(tmp_path / "laptop", label="laptop", settings=LAPTOP) as laptop,
    ):
        project_id = await set_up(laptop, box, tmp_path)
        async with owner_a2a(laptop) as client, client_for(box.paths.home) as bc:
            live = await send(client, placed(script({"wait": 60}, {"reply": "never"}), project_id), now=True)
            await eventually(
                lambda: box_run(bc, live.context_id, live.id),
                what="the run live on the box",
                until=lambda run: run["status"] == "running",
                within=30,
            )
            queued = await send(
                client, follow_up(script({"reply": "never either"}), live.context_id), now=True
            )
            assert queued.status.state == TaskState.TASK_STATE_SUBMITTED
            answer = await client.cancel_task(CancelTaskRequest(id=queued.id))
            assert answer.status.state == TaskState.TASK_STATE_CANCELED, "queued there: cancelled at once"
            await client.cancel_task(CancelTaskRequest(id=live.id))
            cancelled = await until_state(client, live.id, ENDED)
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            assert (await box_run(bc, live.context_id, live.id))["status"] == "interrupted"
            assert (await box_run(bc, live.context_id, queued.id))["status"] == "cancelled"
            thread = await bc.call("GET", f"/v1/threads/{live.context_id}")
            assert thread["latestRun"]["id"] == queued.id and thread["latestRun"]["startedAt"] is None
        # Another machine linked to the laptop learns nothing of the owner's tasks on the box.
        other, http = await link_client_of(laptop)
        try:
            for ask in (
                other.get_task(GetTaskRequest(id=live.id)),
                other.cancel_task(CancelTaskRequest(id=live.id)),
                other.subscribe(SubscribeToTaskRequest(id=live.id)).__anext__(),
            ):
                with pytest.raises(TaskNotFoundError):
                    await ask
            assert list((await other.list_tasks(ListTasksRequest())).tasks) == []
            with pytest.raises(TaskNotFoundError):  # nor follows up in its thread there
                await send(other, follow_up(script({"reply": "x"}), live.context_id), now=True)
        finally:
            await other.close()
            await http.aclose()


async def test_a_task_on_the_box_waits_for_a_person_there_and_is_streamed_and_pushed_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_module, "FOLLOW_CHUNK_S", 0.5)  # each look at the box waits less
    got: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook_url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        async with (
            running_daemon(tmp_path / "box", label="box") as box,
            running_daemon(tmp_path / "laptop", label="laptop", settings=LAPTOP) as laptop,
        ):
            project_id = await set_up(laptop, box, tmp_path)
            async with owner_a2a(laptop) as client, client_for(box.paths.home) as bc:
                msg = placed(
                    script({"run": "echo a > a.txt"}, {"reply": "approved and done"}),
                    project_id,
                    runtimeMode="approval-required",
                )
                task = await send(client, msg, url=hook_url, token="hook-secret")
                if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:  # answered at its 45 s bound
                    task = await until_state(client, task.id, {TaskState.TASK_STATE_INPUT_REQUIRED})
                asked = task.status.message.parts[0].text
                assert asked.startswith("Waiting for a person to approve ") and "(on box)" in asked, asked

                states: list[int] = []

                async def stream() -> None:
                    async with owner_a2a(laptop, streaming=True) as streaming:
                        async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
                            if event.HasField("task"):
                                states.append(event.task.status.state)
                            elif event.HasField("status_update"):
                                states.append(event.status_update.status.state)

                following = asyncio.create_task(stream())
                await eventually(lambda: states, what="the stream's first event", within=30)
                (approval,) = (await bc.call("GET", "/v1/approvals"))["items"]
                await bc.call(
                    "POST", f"/v1/approvals/{approval['id']}/decision", body={"decision": "approve"}
                )
                await asyncio.wait_for(following, 60)
                assert states[0] == TaskState.TASK_STATE_INPUT_REQUIRED
                assert states[-1] == TaskState.TASK_STATE_COMPLETED
                done = await client.get_task(GetTaskRequest(id=task.id))
                assert done.artifacts[0].parts[0].text == "approved and done"

            def pushed_states() -> list[str]:
                return [
                    (body.get("task") or body.get("statusUpdate", {})).get("status", {}).get("state", "")
                    for body in got
                ]

            await eventually(
                pushed_states,
                what="the end pushed",
                until=lambda states: "TASK_STATE_COMPLETED" in states,
                within=30,
            )
            assert "TASK_STATE_INPUT_REQUIRED" in pushed_states()
            final = next(body["task"] for body in got if "task" in body)
            assert final["id"] == task.id and final["artifacts"][0]["parts"][0]["text"] == "approved and done"
    finally:
        await runner.cleanup()


async def test_a_launch_whose_answer_was_lost_is_sent_again_and_a_retry_gets_the_same_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded before it leaves: the box made the thread but its answer never came back (the
    client is told `unreachable`); the laptop sends the launch again by itself, follows the task,
    and the client's retry of the message gets that same task, one thread there."""
    async with (
        running_daemon(tmp_path / "box", label="box") as box,
        running_daemon(tmp_path / "laptop", label="laptop", settings=LAPTOP) as laptop,
    ):
        project_id = await set_up(laptop, box, tmp_path)
        assert laptop.parts is not None
        ops = (await laptop.parts.a2a.face()).remote.ops
        real = ops.launch_placed

        async def answer_lost(caller: Any, placed: Any) -> Any:
            await real(caller, placed)  # the box has it ...
            raise PeerUnreachable("box did not answer (test)")  # ... the answer is lost on the way

        monkeypatch.setattr(ops, "launch_placed", answer_lost)
        async with owner_a2a(laptop) as client, client_for(box.paths.home) as bc:
            msg = placed(script({"reply": "sent once"}), project_id)
            with pytest.raises(A2AError) as lost:
                await send(client, msg)
            assert lost.value.data == {"peerdCode": "unreachable"}
            listed = await eventually(
                lambda: client.list_tasks(ListTasksRequest()),
                what="the task, sent again by the laptop itself",
                until=lambda page: len(page.tasks) == 1,
                within=30,
            )
            task = await until_state(client, listed.tasks[0].id, DONE)
            again = await send(client, msg)
            assert (again.id, again.context_id) == (task.id, task.context_id)
            assert again.artifacts[0].parts[0].text == "sent once"
            assert len((await bc.call("GET", "/v1/threads"))["items"]) == 1, "one thread there"
