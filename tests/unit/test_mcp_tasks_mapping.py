"""The Tasks extension's shapes for peerd's tasks (`peerd.api.mcp_tasks`, pure) and who may see and
answer them (`peerd.api.mcp_taskport.visible_parent`, `may_answer`)."""

from __future__ import annotations

from typing import Any

import pytest

from peerd import contracts as c
from peerd.api import mcp_tasks as mt
from peerd.api.mcp_taskport import may_answer, visible_parent
from peerd.core.access import LinkContext, ModeCap
from peerd.errors import CapabilityDenied
from peerd.operations import Caller

TASKS = {mt.TASKS_EXTENSION: {}}
APPROVAL = c.TaskApproval(approval_id="ap_1", summary="run `make`")


def info(status: Any = "running", **fields: Any) -> c.TaskInfo:
    return c.TaskInfo(
        task_id="tsk_1", status=status, title="t", parent_thread_id="thr_1", created_at=0.0, **fields
    )


def test_only_delegate_task_of_a_client_declaring_the_extension_becomes_a_task() -> None:
    assert mt.wants_task("delegate_task", TASKS)
    assert not mt.wants_task("delegate_task", None)
    assert not mt.wants_task("delegate_task", {})
    assert not mt.wants_task("delegate_task", {"io.modelcontextprotocol/other": {}})
    assert not mt.wants_task("delegate_task", {mt.TASKS_EXTENSION: True})  # settings are an object
    assert not mt.wants_task("thread_launch", TASKS)


@pytest.mark.parametrize(
    ("status", "approval", "expected"),
    [
        ("pending", None, "working"),
        ("running", None, "working"),
        ("running", APPROVAL, "input_required"),
        ("pending", APPROVAL, "input_required"),
        ("completed", None, "completed"),
        ("failed", None, "completed"),  # the tool's result says failed: `failed` is for JSON-RPC errors
        ("interrupted", None, "completed"),
        ("cancelled", None, "cancelled"),
        ("completed", APPROVAL, "completed"),  # a stale approval never reopens an ended task
    ],
)
def test_states(status: str, approval: c.TaskApproval | None, expected: str) -> None:
    assert mt.mcp_status(info(status, awaiting_approval=approval)) == expected


def test_the_handle_is_the_seed_task_with_result_type_task() -> None:
    handle = mt.created(info("pending"))
    assert handle["resultType"] == "task" and handle["taskId"] == "tsk_1" and handle["status"] == "working"
    assert handle["createdAt"] == "1970-01-01T00:00:00.000Z" and handle["ttlMs"] is None
    assert handle["pollIntervalMs"] == mt.POLL_INTERVAL_MS and "result" not in handle


def test_an_approval_is_the_one_input_request_keyed_by_its_id() -> None:
    body = mt.task_body(info("running", awaiting_approval=APPROVAL))
    assert body["status"] == "input_required"
    (key,) = body["inputRequests"]
    request = body["inputRequests"][key]
    assert key == "ap_1" and request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "form" and "run `make`" in request["params"]["message"]
    assert request["params"]["requestedSchema"]["properties"]["decision"]["enum"] == ["approve", "deny"]


def test_a_completed_task_inlines_the_result_and_no_poll_interval() -> None:
    body = mt.task_body(info("completed", ended_at=5.0), result={"content": []})
    assert body["result"] == {"content": []} and "pollIntervalMs" not in body
    assert body["lastUpdatedAt"] == "1970-01-01T00:00:05.000Z"
    assert "result" not in mt.task_body(info("cancelled"), result={"content": []})


@pytest.mark.parametrize(
    ("response", "verdict"),
    [
        ({"action": "accept", "content": {"decision": "approve"}}, "approve"),
        ({"action": "accept", "content": {"decision": "deny"}}, "deny"),
        ({"action": "decline"}, "deny"),
        ({"action": "cancel"}, "deny"),
        ({"action": "accept", "content": {"decision": "yes"}}, None),
        ({"action": "accept"}, None),
        ("approve", None),
    ],
)
def test_an_answer_to_the_outstanding_approval(response: Any, verdict: str | None) -> None:
    expected = None if verdict is None else ("ap_1", verdict)
    assert mt.answers(APPROVAL, {"ap_1": response}) == expected


def test_answers_to_keys_not_outstanding_are_ignored() -> None:
    approve = {"action": "accept", "content": {"decision": "approve"}}
    assert mt.answers(APPROVAL, {"ap_other": approve}) is None
    assert mt.answers(None, {"ap_1": approve}) is None


def test_a_run_lists_its_own_threads_tasks_the_owner_all_and_a_bare_link_none() -> None:
    run = Caller(namespace="thread:thr_1", thread_id="thr_1", run_id="run_1")
    assert visible_parent(run) == "thr_1"
    assert visible_parent(Caller.local()) is None
    link = LinkContext(client_id="cl_1", label="laptop", access="auto", cap=ModeCap("auto", "default"))
    with pytest.raises(CapabilityDenied):
        visible_parent(Caller.for_link(link))


def test_an_agent_never_answers_an_approval_a_person_does() -> None:
    assert may_answer(Caller(namespace="thread:thr_1", thread_id="thr_1", run_id="run_1")) is not None
    assert may_answer(Caller.local()) is None
    # An outside agent signed in to /mcp (issue 29) acts without a run: still an agent, never the person.
    agent = LinkContext("cl_a", "claude", "auto", ModeCap("auto", "default"), own_threads_only=True)
    assert may_answer(Caller.for_link(agent)) is not None


def test_a_wait_asks_its_client_only_at_2026_for_a_thread_here_and_a_client_that_elicits() -> None:
    wait = {"threadId": "thr_1"}
    assert mt.asks_on_wait("thread_wait", wait, elicits=True, modern=True) == "thr_1"
    assert mt.asks_on_wait("thread_wait", wait, elicits=False, modern=True) is None
    assert mt.asks_on_wait("thread_wait", wait, elicits=True, modern=False) is None
    assert mt.asks_on_wait("thread_wait", {**wait, "environmentId": "box"}, elicits=True, modern=True) is None
    assert mt.asks_on_wait("thread_read", wait, elicits=True, modern=True) is None
    assert mt.asks_on_wait("thread_wait", {}, elicits=True, modern=True) is None
