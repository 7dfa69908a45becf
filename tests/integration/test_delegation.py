"""delegate_task end to end: local children (any provider) and children on a linked box."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from peerd.api.localclient import LocalClient
from peerd.peer.client import REVOKED_MESSAGE
from tests.helpers import Pair, git, items, script, wait_terminal
from tests.support.delegation import (
    READ_AND_REPORT,
    delegate,
    linked,
    linked_pair,
    runs_script,
    tasks_of,
    wait_run_number,
    wait_task,
)

__all__ = ["linked"]  # the fixture (tests/support/delegation.py)

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


# --- remote -------------------------------------------------------------------------------------


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
