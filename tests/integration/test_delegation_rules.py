"""delegate_task's rules: whole long replies, namespaces, project matching, targets and modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.core.runs import RunFact
from peerd.errors import PeerdError
from peerd.tasks.rules import settlement
from tests.helpers import Pair, git, items, script, wait_terminal
from tests.support.delegation import delegate, linked, runs_script, tasks_of, wait_run_number

__all__ = ["linked"]  # the fixture (tests/support/delegation.py)


async def tool_results(pair: Pair, thread_id: str) -> list[dict[str, Any]]:
    return [i["data"] for i in await items(pair.lc, thread_id) if i["kind"] == "tool_call"]


async def run_parent(pair: Pair, here: dict[str, Any], *steps: dict[str, Any], **extra: Any) -> str:
    launched = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": here["id"], "prompt": script(*steps), **extra}
    )
    await wait_terminal(pair.lc, launched["threadId"], launched["runId"])
    return str(launched["threadId"])


@pytest.mark.slow
async def test_a_45000_character_reply_from_the_box_arrives_whole(
    linked: tuple[Pair, dict[str, Any]],
) -> None:
    pair, here = linked
    child = script({"reply_repeat": {"text": "0123456789", "times": 4500}})
    prompt = runs_script(
        [delegate(task=child, target={"environmentId": pair.box_id})],
        [{"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}}],
    )
    launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": prompt})
    await wait_run_number(pair.lc, launched["threadId"], 2)
    [task] = await tasks_of(pair.lc, launched["threadId"])
    assert task["status"] == "completed"
    assert task["result"] == "0123456789" * 4500


def test_a_later_run_someone_else_started_is_never_the_result() -> None:
    launched = RunFact("run_1", 1, "completed", "user")
    later_user = RunFact("run_2", 2, "completed", "user")
    settled, result = settlement(launched, [launched, later_user], open_children=False, queue_held=False)
    assert settled and result.id == "run_1"
    wake = RunFact("run_3", 3, "completed", "wake")
    settled, result = settlement(
        launched, [launched, later_user, wake], open_children=False, queue_held=False
    )
    assert settled and result.id == "run_3", "the child's own wake run carries its final reply"
    pending_wake = RunFact("run_3", 3, "queued", "wake")
    assert settlement(launched, [launched, pending_wake], open_children=False, queue_held=False)[0] is False
    assert settlement(launched, [launched], open_children=True, queue_held=False)[0] is False


@pytest.mark.slow
async def test_the_same_key_from_another_thread_is_another_task_and_thread_there(
    linked: tuple[Pair, dict[str, Any]],
) -> None:
    pair, here = linked
    step = delegate(
        task=script({"reply": "x"}), target={"environmentId": pair.box_id}, clientRequestId="same"
    )
    first = await run_parent(pair, here, step)
    second = await run_parent(pair, here, step)
    [a], [b] = await tasks_of(pair.lc, first), await tasks_of(pair.lc, second)
    assert a["taskId"] != b["taskId"]
    assert a["remoteChild"]["threadId"] != b["remoteChild"]["threadId"]
    assert len((await pair.bc.call("GET", "/v1/threads"))["items"]) == 2


@pytest.mark.slow
async def test_project_matching_there(linked: tuple[Pair, dict[str, Any]], tmp_path: Path) -> None:
    pair, here = linked
    # A second clone of the same origin on the box makes the match ambiguous.
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(tmp_path / "box-repo-2"))
    second = await pair.bc.call(
        "POST", "/v1/projects", body={"path": str(tmp_path / "box-repo-2"), "name": "again"}
    )
    parent = await run_parent(pair, here, delegate(task="x", target={"environmentId": pair.box_id}))
    error = (await tool_results(pair, parent))[0]["error"]
    assert error["code"] == "invalid_request"
    assert (
        "Several projects there have this repository" in error["message"] and second["id"] in error["message"]
    )
    # Naming the project settles it.
    named = delegate(
        task=script({"reply": "ok"}), target={"environmentId": pair.box_id, "projectId": second["id"]}
    )
    parent = await run_parent(pair, here, named)
    assert (await tool_results(pair, parent))[0]["error"] is None


@pytest.mark.slow
async def test_no_matching_project_there_lists_how_to_pick_one(
    linked: tuple[Pair, dict[str, Any]], tmp_path: Path
) -> None:
    pair, _ = linked
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    git(lonely, "init", "-q")
    git(lonely, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    git(lonely, "remote", "add", "origin", "https://github.com/someone/else.git")
    project = await pair.lc.call("POST", "/v1/projects", body={"path": str(lonely)})
    parent = await run_parent(pair, project, delegate(task="x", target={"environmentId": pair.box_id}))
    error = (await tool_results(pair, parent))[0]["error"]
    assert error["code"] == "invalid_request"
    assert "No project there has this repository (github.com/someone/else)" in error["message"]


@pytest.mark.slow
async def test_another_provider_there_needs_a_model(linked: tuple[Pair, dict[str, Any]]) -> None:
    pair, here = linked
    step = delegate(task="x", target={"environmentId": pair.box_id, "provider": "codex"})
    parent = await run_parent(pair, here, step)
    assert (await tool_results(pair, parent))[0]["error"]["code"] == "target_required"


@pytest.mark.slow
async def test_modes_asked_for_are_checked_against_the_parent(linked: tuple[Pair, dict[str, Any]]) -> None:
    pair, here = linked
    step = delegate(task="x", target={"environmentId": pair.box_id}, runtimeMode="full-access")
    parent = await run_parent(pair, here, step, runtimeMode="auto")
    error = (await tool_results(pair, parent))[0]["error"]
    assert error["code"] == "runtime_mode_escalation_denied"
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == [], "refused here: nothing was sent"
    assert await tasks_of(pair.lc, parent) == [], "nothing recorded either"


@pytest.mark.slow
async def test_a_task_is_read_only_by_its_parent(linked: tuple[Pair, dict[str, Any]]) -> None:
    pair, here = linked
    owner = await run_parent(pair, here, delegate(task=script({"reply": "x"}), mode="wait"))
    [task] = await tasks_of(pair.lc, owner)
    snoop = await run_parent(
        pair, here, {"tool": {"name": "task_status", "arguments": {"taskId": task["taskId"]}}}
    )
    error = (await tool_results(pair, snoop))[0]["error"]
    assert error["code"] == "task_not_found"
    assert f"does not belong to thread {snoop}" in error["message"]


@pytest.mark.slow
async def test_a_forwarded_key_reused_with_another_body_is_refused(
    linked: tuple[Pair, dict[str, Any]],
) -> None:
    pair, _ = linked
    there = (await pair.bc.call("GET", "/v1/projects"))["items"][0]
    body = {
        "environmentId": pair.box_id,
        "projectId": there["id"],
        "clientRequestId": "k",
        "prompt": script({"reply": "a"}),
    }
    await pair.lc.call("POST", "/v1/threads", body=body)
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/threads", body={**body, "prompt": script({"reply": "b"})})
    assert err.value.code == "idempotency_key_reused"


@pytest.mark.slow
async def test_a_failed_run_there_reports_its_error_and_the_model_is_inherited(
    linked: tuple[Pair, dict[str, Any]],
) -> None:
    pair, here = linked
    step = delegate(
        task=script({"fail": "box compiler exploded"}), target={"environmentId": pair.box_id}, mode="wait"
    )
    parent = await run_parent(pair, here, step, {"reply": "${status}: ${result}"}, model="model-a")
    replies = [i["text"] for i in await items(pair.lc, parent) if i["kind"] == "assistant_message"]
    assert replies == ["failed: box compiler exploded"]
    [task] = await tasks_of(pair.lc, parent)
    there = await pair.bc.call("GET", f"/v1/threads/{task['remoteChild']['threadId']}")
    assert there["model"] == "model-a", "provider and model inherit from the parent"


@pytest.mark.slow
async def test_a_cancel_after_the_result_keeps_it_and_still_stops_follow_up_work_there(
    linked: tuple[Pair, dict[str, Any]],
) -> None:
    pair, here = linked
    step = delegate(task=script({"reply": "first"}), target={"environmentId": pair.box_id}, mode="wait")
    parent = await run_parent(pair, here, step)
    [task] = await tasks_of(pair.lc, parent)
    assert task["status"] == "completed"
    cancelled = await pair.lc.call("POST", f"/v1/tasks/{task['taskId']}/cancel", body={"reason": "late"})
    assert (cancelled["status"], cancelled["result"]) == ("completed", "first"), "first result wins"
    there = await pair.bc.call("GET", f"/v1/threads/{task['remoteChild']['threadId']}")
    assert there["queueHeld"] is True, "follow-up work there is stopped"
    assert cancelled["stopOwed"] is False


@pytest.mark.slow
async def test_a_cancel_the_box_refuses_says_so_and_owes_nothing(
    linked: tuple[Pair, dict[str, Any]], tmp_path: Path
) -> None:
    pair, here = linked
    step = delegate(
        task=script({"wait_for_file": str(tmp_path / "never")}), target={"environmentId": pair.box_id}
    )
    parent = await run_parent(pair, here, step)
    [task] = await tasks_of(pair.lc, parent)
    client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
    await pair.bc.call("POST", f"/v1/clients/{client_id}/revoke")
    cancelled = await pair.lc.call("POST", f"/v1/tasks/{task['taskId']}/cancel", body={"reason": "stop"})
    assert cancelled["status"] in ("cancelled", "failed")  # the follower may see the revocation first
    if cancelled["status"] == "cancelled":
        assert cancelled["result"].startswith(
            "Cancelled: stop. It could not be stopped in box and may still run there:"
        )
    assert cancelled["stopOwed"] is False, "a refusal for good owes nothing: no retry storm"
    (tmp_path / "never").write_text("release")
