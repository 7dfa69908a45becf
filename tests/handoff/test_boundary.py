"""What a link may do on the side a thread moves to: it never moves a branch another thread owns
there, a kept ref is never replaced, and work a link started is never moved by that machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd.errors import PeerdError
from tests.helpers import git, script, wait_terminal
from tests.support.handoff import linked


async def test_a_link_never_moves_a_branch_another_thread_owns(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        box_project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]["id"]
        own = await pair.bc.call(
            "POST", "/v1/threads", body={"projectId": box_project, "prompt": script({"reply": "x"})}
        )
        await wait_terminal(pair.bc, own["threadId"])
        await pair.bc.call("POST", f"/v1/threads/{own['threadId']}/archive", body={})
        branch = f"peerd/{own['threadId']}"
        box_repo = tmp_path / "box-repo"
        tip = git(box_repo, "rev-parse", branch).strip()
        tree = git(box_repo, "rev-parse", f"{tip}^{{tree}}").strip()
        child = git(box_repo, "commit-tree", "-p", tip, "-m", "descends", tree).strip()
        assert pair.laptop.peers is not None
        path = f"/v1/projects/{box_project}/moved-branch"
        body = {"moveId": "mov_" + "a" * 20, "branch": branch, "tip": child}
        landed = await pair.laptop.peers.call(pair.box_id, "POST", path, body=body)
        assert landed["branch"] is None and landed["keptRef"] == f"refs/peerd/moved/{body['moveId']}"
        assert git(box_repo, "rev-parse", branch).strip() == tip, "the owner's branch did not move"
        # The kept ref is created once, never replaced by another tip under the same move id.
        other = git(box_repo, "commit-tree", "-p", tip, "-m", "another", tree).strip()
        with pytest.raises(PeerdError) as refused:
            await pair.laptop.peers.call(pair.box_id, "POST", path, body={**body, "tip": other})
        assert refused.value.code == "conflict"
        assert git(box_repo, "rev-parse", landed["keptRef"]).strip() == child
        # The owner's branches (main) are not a moved thread's name at all.
        with pytest.raises(PeerdError) as main:
            await pair.laptop.peers.call(pair.box_id, "POST", path, body={**body, "branch": "main"})
        assert main.value.code == "invalid_request"
