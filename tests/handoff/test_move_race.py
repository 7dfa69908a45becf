"""Issue 26, case 1 end to end: a thread whose only change is a same-size edit made in the second
its worktree was checked out moves with that edit; the box's copy has the new text."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from peerd.runtime import git as rgit
from tests.helpers import git, script, wait_terminal
from tests.support.handoff import linked, loc_git, move_ended, next_second, stat_as_recorded

pytestmark = pytest.mark.slow

# The agent's first and only step: `# demo` -> `# DEMO`, the same size.
EDIT = script({"edit": {"path": "README.md", "old": "# demo", "new": "# DEMO"}}, {"reply": "EDITED"})


async def test_a_same_size_edit_made_as_the_worktree_was_checked_out_moves_with_the_thread(
    tmp_path: Path,
) -> None:
    async with linked(tmp_path) as pair:
        laptop_repo = tmp_path / "laptop-repo"
        # The edit lands in the checkout's second in most launches; its stat is then what the
        # index recorded (checked, not assumed), the case a copied index missed.
        for _ in range(8):
            await next_second()
            launched = await pair.lc.call(
                "POST", "/v1/threads", body={"projectId": pair.here, "prompt": EDIT}
            )
            done = await wait_terminal(pair.lc, launched["threadId"], launched["runId"])
            assert done["status"] == "completed", done
            worktree = Path(launched["worktreePath"])
            where = await rgit.locate_worktree(laptop_repo, worktree, restore=False)
            if stat_as_recorded(where, "README.md"):
                break
        else:
            pytest.fail("no launch edited README.md within the second its worktree was checked out")
        assert loc_git(where, "status", "--porcelain") == " M README.md\n"
        here = launched["threadId"]
        await asyncio.sleep(1.1)  # the move comes later than that second

        message = script({"run": "cat README.md", "check": True}, {"reply": "THERE DONE"})
        body = {"to": "box", "message": message, "clientRequestId": "race"}
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body=body)
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved", move
        assert git(laptop_repo, "show", f"{move['snapshot']}:README.md") == "# DEMO\n"
        there = move["movedTo"]["threadId"]
        assert (await wait_terminal(pair.bc, there))["status"] == "completed"
        box_tree = Path((await pair.bc.call("GET", f"/v1/threads/{there}"))["worktreePath"])
        assert (box_tree / "README.md").read_text() == "# DEMO\n"
        # The thread here keeps its worktree exactly as it was.
        assert loc_git(where, "status", "--porcelain") == " M README.md\n"
        assert (worktree / "README.md").read_text() == "# DEMO\n"
