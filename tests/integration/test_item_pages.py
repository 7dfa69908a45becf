"""Rule: item pages carry no default-valued item field (`textOffset` 0, `textTruncated` false,
`nextTextOffset` null, `data` {}), are sent as compact JSON, and a delegating thread's items keep a
reference to the task, not the task echoed (`peerd/core/tool_items.py`), so the first page of a
delegated parent fits in 3.8 KiB as sent (measured in the bytes the server sends, here and for a
child on a linked box); readers (the contract model, the CLI's stream, the follower's reply reader)
take a missing field as its default, and a long text still says where to read on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd import contracts as c
from peerd.api.localclient import LocalClient
from tests.helpers import Pair, script, wait_terminal
from tests.support.delegation import READ_AND_REPORT, delegate, linked, wait_run_number

__all__ = ["linked"]  # the fixture (tests/support/delegation.py)

BUDGET = int(3.8 * 1024)  # the peer product's wire budget for a thread's first page
DEFAULTS = {"textOffset", "textTruncated", "nextTextOffset"}


def runs_script(*runs: list[dict[str, Any]]) -> str:
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


async def sent(socket: Path, path: str) -> bytes:
    """The bytes of the answer's body exactly as the daemon sent them."""
    connector = aiohttp.UnixConnector(path=str(socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(f"http://peerd{path}") as resp,
    ):
        assert resp.status == 200
        return await resp.read()


def the_delegation_is_referenced(page: dict[str, Any], task_id: str) -> None:
    [call] = [i for i in page["items"] if i["kind"] == "tool_call" and i["text"] == "delegate_task"]
    assert call["data"]["result"] == {"taskId": task_id, "status": "running"}, call  # not the task echoed


async def test_a_delegated_parents_first_page_has_no_default_fields(
    client: LocalClient, project: dict[str, Any]
) -> None:
    prompt = runs_script([delegate(task=script({"reply": "CHILD DONE"}))], READ_AND_REPORT)
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    parent = launched["threadId"]
    await wait_terminal(client, parent, launched["runId"])
    # The wake run (run 2) is queued when the child's task ends, then ends too.
    await wait_run_number(client, parent, 2, total=30)
    raw = await sent(client.socket_path, f"/v1/threads/{parent}/items")
    page = json.loads(raw)
    assert len(page["items"]) >= 4, page["items"]  # prompt, tool call, wake, ...)
    assert len(raw) <= BUDGET, len(raw)
    assert raw == json.dumps(page, separators=(",", ":")).encode(), "compact JSON on the wire"
    [task] = (await client.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
    the_delegation_is_referenced(page, task["taskId"])
    for item in page["items"]:
        assert not DEFAULTS & item.keys(), item
        assert item.get("data") != {}
    # The contract reads a page without them as it was.
    parsed = c.ThreadReadResult.model_validate(page)
    assert all(
        i.text_offset == 0 and not i.text_truncated and i.next_text_offset is None for i in parsed.items
    )


async def test_a_long_text_still_says_where_to_read_on(client: LocalClient, project: dict[str, Any]) -> None:
    launched = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script({"reply": "x" * 5000})}
    )
    await wait_terminal(client, launched["threadId"], launched["runId"])
    page = await client.call(
        "GET", f"/v1/threads/{launched['threadId']}/items", params={"maxCharsPerItem": 1000}
    )
    reply = next(i for i in page["items"] if i["kind"] == "assistant_message")
    assert reply["textTruncated"] is True and reply["nextTextOffset"] == 1000 and "textOffset" not in reply
    rest = await client.call(
        "GET",
        f"/v1/threads/{launched['threadId']}/items",
        params={"itemId": reply["id"], "textOffset": 1000, "maxCharsPerItem": 1000},
    )
    assert rest["items"][0]["textOffset"] == 1000


@pytest.mark.slow  # two daemons
async def test_a_parent_with_a_child_on_a_linked_box_fits_too(linked: tuple[Pair, dict[str, Any]]) -> None:
    pair, here = linked
    child = script({"reply": "BOX DONE"})
    prompt = runs_script(
        [delegate(task=child, target={"environmentId": pair.box_id}, clientRequestId="t1")], READ_AND_REPORT
    )
    launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": prompt})
    parent = launched["threadId"]
    await wait_terminal(pair.lc, parent, launched["runId"])
    await wait_run_number(pair.lc, parent, 2, total=30)
    raw = await sent(pair.laptop.paths.socket, f"/v1/threads/{parent}/items")
    assert len(raw) <= BUDGET, len(raw)
    [task] = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
    assert task["remoteChild"]["label"] == "box"
    the_delegation_is_referenced(json.loads(raw), task["taskId"])
