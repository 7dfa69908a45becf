"""`peerd orchestrate --access approval-required`: each implementer's edit waits for a person; the
orchestration shows the packet waiting with the question, and the approval lets it go on to
verification, review and integration."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import client_for, running_daemon
from tests.support.approvals import pending_approvals
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    settings,
    start,
    steps,
)


async def test_an_implementers_edit_waits_for_a_person_and_goes_on_when_approved(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix.\n\n" + steps(FIX_ADD, {"reply": "fixed"}), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], access="approval-required")
        assert info["access"] == "approval-required"
        (question,) = await pending_approvals(client, seconds=30)
        assert question["kind"] == "file_change" and "calc.py" in str(question["summary"])
        shown = await client.call("GET", f"/v1/orchestrations/{info['id']}")
        waiting = packets_of(shown)["fix-add"]["awaitingApproval"]
        assert waiting == {"approvalId": question["id"], "summary": question["summary"]}
        await client.call("POST", f"/v1/approvals/{question['id']}/decision", body={"decision": "approve"})
        done = await finished(client, info["id"])
    assert done["status"] == "completed", done
    assert packets_of(done)["fix-add"]["awaitingApproval"] is None
