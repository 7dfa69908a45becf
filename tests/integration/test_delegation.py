"""delegate_task end to end: local children (any provider) and children on a linked box."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api.localclient import LocalClient
from peerd.peer.client import REVOKED_MESSAGE
from tests.helpers import Pair, git, make_repo, script, two_daemons, wait_terminal


def runs_script(*runs: list[dict[str, Any]]) -> str:
    """A prompt whose script gives each run of the session its own steps (run 2 = the wake)."""
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


def delegate(**arguments: Any) -> dict[str, Any]:
    return {"tool": {"name": "delegate_task", "arguments": arguments, "check": True}}


READ_AND_REPORT = [
    {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
    {"reply": "PARENT GOT ${result}"},
]


async def items(client: LocalClient, thread_id: str) -> list[dict[str, Any]]:
    return list((await client.call("GET", f"/v1/threads/{thread_id}/items"))["items"])


async def tasks_of(client: LocalClient, thread_id: str) -> list[dict[str, Any]]:
    return list((await client.call("GET", "/v1/tasks", params={"threadId": thread_id}))["items"])


async def wait_run_number(
    client: LocalClient, thread_id: str, number: int, *, total: float = 60.0
) -> dict[str, Any]:
    """Wait until the thread's run `number` exists and ended (a wake run, say)."""
    deadline = asyncio.get_running_loop().time() + total
    while True:
        assert asyncio.get_running_loop().time() < deadline, f"run {number} of {thread_id} never ended"
        thread = await client.call("GET", f"/v1/threads/{thread_id}")
        latest = thread["latestRun"]
        if latest["number"] >= number:
            done = await wait_terminal(client, thread_id, latest["id"])
            if latest["number"] == number:
                return done
        events = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": 0, "limit": 1})
        cursor = events["nextCursor"]
        await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 5})


# --- local ----------------------------------------------------------------------------------------


async def test_a_local_task_wakes_its_parent_with_the_result(
    client: LocalClient, project: dict[str, Any]
) -> None:
    child = script({"reply": "CHILD DONE"})
    parent_prompt = runs_script([delegate(task=child, title="review it", role="review")], READ_AND_REPORT)
    launched = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": parent_prompt}
    )
    parent = launched["threadId"]
    assert (await wait_terminal(client, parent, launched["runId"]))["status"] == "completed"

    woken = await wait_run_number(client, parent, 2)
    assert woken["status"] == "completed"
    replies = [i["text"] for i in await items(client, parent) if i["kind"] == "assistant_message"]
    assert replies[-1] == "PARENT GOT CHILD DONE"

    [task] = await tasks_of(client, parent)
    assert task["status"] == "completed"
    assert task["result"] == "CHILD DONE"
    child_items = await items(client, task["childThreadId"])
    assert child_items[0]["text"].startswith("Act as the review sub-agent for this task.")
    # The wake run's message names the task, as the reference's does.
    wake_message = next(i for i in await items(client, parent) if i["runId"] == woken["runId"])
    assert wake_message["text"] == (
        f"Delegated task {task['taskId']} reached a terminal state. "
        f"Use task_status with taskId {task['taskId']} to read the result."
    )


async def test_wait_mode_returns_the_result_in_the_call_and_wakes_nobody(
    client: LocalClient, project: dict[str, Any]
) -> None:
    step = delegate(task=script({"reply": "WAITED"}), mode="wait")
    prompt = script(step, {"reply": "got ${result}"})
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    replies = [
        i["text"] for i in await items(client, launched["threadId"]) if i["kind"] == "assistant_message"
    ]
    assert replies == ["got WAITED"]
    thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["latestRun"]["number"] == 1, "the waiting call took the result: no wake run"


async def test_a_failed_child_reports_its_error(client: LocalClient, project: dict[str, Any]) -> None:
    prompt = script(
        delegate(task=script({"fail": "compiler exploded"}), mode="wait"), {"reply": "${status}: ${result}"}
    )
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    replies = [
        i["text"] for i in await items(client, launched["threadId"]) if i["kind"] == "assistant_message"
    ]
    assert replies == ["failed: compiler exploded"]


async def test_a_retried_delegation_is_one_task(client: LocalClient, project: dict[str, Any]) -> None:
    step = delegate(task=script({"reply": "x"}), clientRequestId="k")
    launched = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script(step, step)}
    )
    await wait_terminal(client, launched["threadId"], launched["runId"])
    assert len(await tasks_of(client, launched["threadId"])) == 1
    threads = (await client.call("GET", "/v1/threads"))["items"]
    assert len(threads) == 2  # the parent and one child


async def test_a_token_of_an_ended_run_is_refused(client: LocalClient, project: dict[str, Any]) -> None:
    # The run leaks its own token to a file (a test-only step), then ends.
    prompt = script({"run": 'printf %s "$PEERD_RUN_TOKEN" > token.txt'})
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    token = (Path(launched["worktreePath"]) / "token.txt").read_text()
    assert len(token) > 20
    connector = aiohttp.UnixConnector(path=str(client.socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(
            "http://peerd/v1/tools/delegate_task",
            json={"task": "x"},
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        assert resp.status == 403
        assert (await resp.json())["code"] == "parent_not_active"
    assert await tasks_of(client, launched["threadId"]) == []


async def wait_task(client: LocalClient, parent: str, task_id: str, *, while_status: str) -> dict[str, Any]:
    """Follow the parent's events (task changes are parent events) until the task leaves a status."""
    cursor = 0
    deadline = asyncio.get_running_loop().time() + 60.0
    while True:
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} stayed {while_status}"
        task: dict[str, Any] = await client.call("GET", f"/v1/tasks/{task_id}")
        if task["status"] != while_status:
            return task
        events = await client.call(
            "GET", f"/v1/threads/{parent}/events", params={"after": cursor, "timeout": 20}
        )
        cursor = events["nextCursor"]


# --- remote -------------------------------------------------------------------------------------


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[tuple[Pair, dict[str, Any]]]:
    async with linked_pair(tmp_path, watch_chunk_s=5) as found:
        yield found


@asynccontextmanager
async def linked_pair(tmp_path: Path, *, watch_chunk_s: float) -> AsyncIterator[tuple[Pair, dict[str, Any]]]:
    """A laptop linked to a box with `auto` access; both have a clone of one origin."""
    origin = tmp_path / "origin.git"
    make_repo(tmp_path / "seed", origin=None)
    git(tmp_path, "clone", "-q", "--bare", str(tmp_path / "seed"), str(origin))
    async with two_daemons(tmp_path, laptop_watch_chunk_s=watch_chunk_s) as pair:
        lc, bc = pair.lc, pair.bc
        for side, client in (("laptop", lc), ("box", bc)):
            git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
            await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
        await pair.link("auto")
        here = (await lc.call("GET", "/v1/projects"))["items"][0]
        yield pair, here


async def test_a_task_on_the_box_wakes_the_parent_with_its_reply(linked: tuple[Pair, dict[str, Any]]) -> None:
    pair, here = linked
    child = script({"write": {"path": "pricing.txt", "content": "fixed\n"}}, {"reply": "BOX DONE"})
    parent_prompt = runs_script(
        [delegate(task=child, target={"environmentId": pair.box_id}, clientRequestId="t1")], READ_AND_REPORT
    )
    launched = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": here["id"], "prompt": parent_prompt}
    )
    parent = launched["threadId"]
    woken = await wait_run_number(pair.lc, parent, 2)
    assert woken["status"] == "completed"
    replies = [i["text"] for i in await items(pair.lc, parent) if i["kind"] == "assistant_message"]
    assert replies[-1] == "PARENT GOT BOX DONE"

    [task] = await tasks_of(pair.lc, parent)
    remote = task["remoteChild"]
    assert task["status"] == "completed" and task["childThreadId"] is None
    assert remote["environmentId"] == pair.box_id and remote["label"] == "box"
    # The box's thread carries the lineage and the link that started it, and ran under the link's cap.
    there = await pair.bc.call("GET", f"/v1/threads/{remote['threadId']}")
    assert there["linkLabel"] == "laptop"
    assert there["delegatedFrom"]["threadId"] == parent
    assert there["runtimeMode"] == "auto"
    assert (Path(there["worktreePath"]) / "pricing.txt").read_text() == "fixed\n"
    laptop_repo = Path(here["path"])
    assert git(laptop_repo, "status", "--porcelain") == "", "the laptop's checkout stayed clean"


async def test_a_revoked_link_fails_the_task_with_the_reason(tmp_path: Path) -> None:
    # The laptop's watch chunk is the full 50 s: the box ends the revoked client's long-poll at once,
    # so the laptop learns of the revocation now, not at the end of its chunk.
    async with linked_pair(tmp_path, watch_chunk_s=50) as (pair, here):
        await _revoked_mid_task(pair, here, tmp_path)


async def _revoked_mid_task(pair: Pair, here: dict[str, Any], tmp_path: Path) -> None:
    hold = tmp_path / "never"
    child = script({"wait_for_file": str(hold)})
    prompt = script(delegate(task=child, target={"environmentId": pair.box_id}))
    launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": prompt})
    await wait_terminal(pair.lc, launched["threadId"], launched["runId"])
    [task] = await tasks_of(pair.lc, launched["threadId"])
    assert task["status"] == "running"
    client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
    await pair.bc.call("POST", f"/v1/clients/{client_id}/revoke")
    # Well inside the 50 s chunk (the guard fails the test when the long-poll is not cut short).
    status = await asyncio.wait_for(
        wait_task(pair.lc, launched["threadId"], task["taskId"], while_status="running"), 20
    )
    assert status["status"] == "failed"
    assert status["result"] == REVOKED_MESSAGE
    hold.write_text("release")
