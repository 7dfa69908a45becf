"""Approvals on one machine, with real daemons and the scripted coder asking before each guarded
step at approval-required (its host protocol is the same shape as the real CLIs')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import ApprovalsConfig, Config
from peerd.errors import PeerdError
from tests.helpers import client_for, items, make_repo, running_daemon, script, wait_terminal
from tests.support.approvals import launch, new_approval, pending_approvals
from tests.support.delegation import delegate, runs_script
from tests.support.eventually import eventually

Json = dict[str, Any]


async def test_approve_runs_the_command_and_deny_tells_the_coder_why(
    client: LocalClient, project: Json, repo: Path
) -> None:
    launched = await launch(
        client,
        project,
        script(
            {"run": "echo yes > approved.txt"},
            {"run": "echo no > denied.txt"},
            {"reply": "done"},
        ),
    )
    (first,) = await pending_approvals(client)
    assert first["kind"] == "command" and first["detail"]["command"] == "echo yes > approved.txt"
    assert first["threadId"] == launched["threadId"] and first["runId"] == launched["runId"]
    assert first["onBox"] is False and first["deadlineAt"] > first["createdAt"]
    assert not (repo / "approved.txt").exists()  # nothing runs before the decision
    decided = await client.call("POST", f"/v1/approvals/{first['id']}/decision", body={"decision": "approve"})
    assert decided["status"] == "approved" and decided["decidedBy"] == "owner"

    second = await new_approval(client, {first["id"]}, seconds=15)
    assert second is not None and second["detail"]["command"] == "echo no > denied.txt"
    await client.call(
        "POST", f"/v1/approvals/{second['id']}/decision", body={"decision": "deny", "reason": "not that one"}
    )
    await wait_terminal(client, launched["threadId"], launched["runId"], total=15)
    thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["latestRun"]["status"] == "completed"
    assert (repo / "approved.txt").read_text() == "yes\n"
    assert not (repo / "denied.txt").exists()
    texts = [i["text"] for i in await items(client, launched["threadId"])]
    assert any("not that one" in t for t in texts)  # what the coder was told
    # The first decision stands.
    with pytest.raises(PeerdError) as late:
        await client.call("POST", f"/v1/approvals/{first['id']}/decision", body={"decision": "deny"})
    assert late.value.code == "approval_decided"
    everything = await client.call("GET", "/v1/approvals", params={"all": "true"})
    assert {a["status"] for a in everything["items"]} == {"approved", "denied"}


async def test_the_deadline_denies_and_the_coder_is_told(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    settings = Config(approvals=ApprovalsConfig(deadline_minutes=0.01))  # 0.6 s
    async with (
        running_daemon(tmp_path / "home", settings=settings) as daemon,
        client_for(daemon.paths.home) as c,
    ):
        project = await c.call("POST", "/v1/projects", body={"path": str(repo)})
        launched = await launch(c, project, script({"run": "touch late.txt"}, {"reply": "after"}))
        await wait_terminal(c, launched["threadId"], launched["runId"], total=15)
        assert not (repo / "late.txt").exists()
        texts = [i["text"] for i in await items(c, launched["threadId"])]
        assert any("before its deadline" in t for t in texts)
        (record,) = (await c.call("GET", "/v1/approvals", params={"all": "true"}))["items"]
        assert record["status"] == "expired" and record["decidedBy"] == "deadline"


async def test_a_restart_while_pending_withdraws_the_question(tmp_path: Path) -> None:
    """Issue 26, case 7: a question outlives no run. The daemon stopped while the question waited:
    the restart cut the run and withdrew the question before serving anything, and a decision on
    it is refused with `approval_withdrawn` (it would land nowhere)."""
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    ask = {"run": "echo once >> ran.txt"}
    steps = runs_script([ask], [ask, {"reply": "finished"}])
    async with running_daemon(home) as daemon, client_for(daemon.paths.home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(repo)})
        launched = await launch(c, project, steps)
        (asked,) = await pending_approvals(c)
    async with running_daemon(home) as daemon, client_for(daemon.paths.home) as c:
        assert (await c.call("GET", "/v1/approvals"))["items"] == []
        record = await c.call("GET", f"/v1/approvals/{asked['id']}")
        assert record["status"] == "cancelled" and "withdrawn" in record["reason"]
        with pytest.raises(PeerdError) as refused:
            await c.call("POST", f"/v1/approvals/{asked['id']}/decision", body={"decision": "approve"})
        assert refused.value.code == "approval_withdrawn"
        thread = await c.call("GET", f"/v1/threads/{launched['threadId']}")
        assert thread["latestRun"]["id"] == launched["runId"]  # nothing was queued for it
        assert thread["latestRun"]["status"] == "interrupted"
        assert not (repo / "ran.txt").exists()
        # The person sends again: the run asks anew, and that question is decided as usual.
        sent = await c.call("POST", f"/v1/threads/{launched['threadId']}/runs", body={"text": "Go on."})
        (again,) = await pending_approvals(c)
        assert again["id"] != asked["id"] and again["runId"] == sent["runId"]
        await c.call("POST", f"/v1/approvals/{again['id']}/decision", body={"decision": "approve"})
        done = await wait_terminal(c, launched["threadId"], sent["runId"], total=20)
        assert done["status"] == "completed", done
        assert (repo / "ran.txt").read_text() == "once\n"


async def test_a_local_childs_question_goes_to_the_person_and_shows_on_its_task(
    client: LocalClient, project: Json
) -> None:
    """A delegated child's question is never put to its parent agent: the task says it waits for
    a person's approval, and the person's decision lets the child go on."""
    child = script({"run": "echo child > child.txt"}, {"reply": "CHILD DONE"})
    parent = runs_script(
        [delegate(task=child, runtimeMode="approval-required", clientRequestId="c1"), {"reply": "sent"}],
        [{"reply": "woken"}],
    )
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": parent})
    (question,) = await pending_approvals(client)
    (task,) = (await client.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
    shown = await client.call("GET", f"/v1/tasks/{task['taskId']}")
    assert shown["awaitingApproval"] == {
        "approvalId": question["id"],
        "summary": question["summary"],
        "environmentId": None,
    }
    assert question["parentTaskId"] == task["taskId"] and question["parentThreadId"] == launched["threadId"]
    await client.call("POST", f"/v1/approvals/{question['id']}/decision", body={"decision": "approve"})
    shown = await eventually(
        lambda: client.call("GET", f"/v1/tasks/{task['taskId']}"),
        what="the local child's task completed",
        until=lambda t: t["status"] == "completed",
        within=20,
    )
    assert shown["status"] == "completed" and shown["awaitingApproval"] is None
    assert "CHILD DONE" in (shown["result"] or "")


async def test_a_question_withdrawn_by_a_restart_queues_no_run(tmp_path: Path) -> None:
    """After a restart the person talks to the thread, then tries the old question's decision: it
    was withdrawn at start-up, so it is refused and starts nothing."""
    repo = make_repo(tmp_path / "repo")
    home = tmp_path / "home"
    async with running_daemon(home) as daemon, client_for(daemon.paths.home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(repo)})
        launched = await launch(c, project, runs_script([{"run": "touch late.txt"}], [{"reply": "moved on"}]))
        (asked,) = await pending_approvals(c)
    async with running_daemon(home) as daemon, client_for(daemon.paths.home) as c:
        sent = await c.call("POST", f"/v1/threads/{launched['threadId']}/runs", body={"text": "Never mind."})
        await wait_terminal(c, launched["threadId"], sent["runId"], total=15)
        with pytest.raises(PeerdError) as refused:
            await c.call("POST", f"/v1/approvals/{asked['id']}/decision", body={"decision": "approve"})
        assert refused.value.code == "approval_withdrawn"
        thread = await c.call("GET", f"/v1/threads/{launched['threadId']}")
        assert thread["latestRun"]["id"] == sent["runId"]  # nothing new was queued
        assert not (repo / "late.txt").exists()
