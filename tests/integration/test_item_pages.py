"""Rule: item pages carry no default-valued item field (`textOffset` 0, `textTruncated` false,
`nextTextOffset` null, `data` {}), so the first page of a delegated parent fits in 3.8 KiB;
readers (the contract model, the CLI's stream, the follower's reply reader) take a missing field as
its default, and a long text still says where to read on."""

from __future__ import annotations

import json
from typing import Any

from peerd import contracts as c
from peerd.api.localclient import LocalClient
from tests.helpers import script, wait_terminal
from tests.support.delegation import wait_run_number

DEFAULTS = {"textOffset", "textTruncated", "nextTextOffset"}


def runs_script(*runs: list[dict[str, Any]]) -> str:
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


async def test_a_delegated_parents_first_page_has_no_default_fields(
    client: LocalClient, project: dict[str, Any]
) -> None:
    delegate = {
        "tool": {
            "name": "delegate_task",
            "arguments": {"task": script({"reply": "CHILD DONE"})},
            "check": True,
        }
    }
    read = {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}}
    prompt = runs_script([delegate], [read, {"reply": "PARENT GOT ${result}"}])
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    parent = launched["threadId"]
    await wait_terminal(client, parent, launched["runId"])
    # The wake run (run 2) is queued when the child's task ends, then ends too.
    await wait_run_number(client, parent, 2, total=30)
    page = await client.call("GET", f"/v1/threads/{parent}/items")
    assert len(page["items"]) >= 4, page["items"]  # prompt, tool call, wake, ...)
    size = len(json.dumps(page, separators=(",", ":")))
    assert size <= 3.8 * 1024, size
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
