"""A delegating thread's tool call items keep a reference to the task, not the task echoed
(`peerd/core/tool_items.py`), in the shape each provider reported the answer."""

from __future__ import annotations

import json

from peerd.core.tool_items import task_reference

TASK = {
    "taskId": "tsk_1",
    "status": "running",
    "title": "fix it",
    "parentThreadId": "thr_1",
    "remoteChild": {"environmentId": "ENV", "label": "box", "threadId": "thr_2", "runId": "run_2"},
    "placement": "box: 0 of 8 runs",
}


def test_the_scripted_providers_mapping_becomes_a_reference() -> None:
    data = {"arguments": {"task": "fix it"}, "result": TASK, "error": None}
    kept = task_reference("tool_call", "delegate_task", data)
    assert kept == {
        "arguments": {"task": "fix it"},
        "result": {"taskId": "tsk_1", "status": "running"},
        "error": None,
    }
    assert task_reference("tool_call", "task_cancel", data)["result"] == {
        "taskId": "tsk_1",
        "status": "running",
    }


def test_an_mcp_providers_json_text_becomes_a_reference_in_json_text() -> None:
    data = {
        "server": "peerd",
        "tool": "delegate_task",
        "arguments": {},
        "result": json.dumps(TASK),
        "status": "completed",
    }
    kept = task_reference("tool_call", "peerd.delegate_task", data)
    assert kept["result"] == '{"taskId":"tsk_1","status":"running"}'
    assert kept["status"] == "completed" and kept["server"] == "peerd"


def test_everything_else_is_kept_as_it_is() -> None:
    clipped = {
        "server": "peerd",
        "tool": "delegate_task",
        "result": json.dumps(TASK)[:40] + "...",
        "error": None,
    }
    failed = {"arguments": {}, "result": None, "error": {"code": "target_required", "message": "Pass it."}}
    other_server = {"server": "tracker", "tool": "delegate_task", "result": json.dumps(TASK)}
    status = {"arguments": {"taskId": "tsk_1"}, "result": {**TASK, "result": "DONE"}, "error": None}
    for text, data in (
        ("peerd.delegate_task", clipped),  # not JSON once clipped
        ("delegate_task", failed),
        ("tracker.delegate_task", other_server),  # another MCP server's tool of that name
        ("task_status", status),  # the read of the result is the content itself
    ):
        assert task_reference("tool_call", text, data) is data
    assert task_reference("notice", "delegate_task", {"result": TASK})["result"] is TASK
