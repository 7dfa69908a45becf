"""A move survives a crash of either daemon and ends with one live copy; a branch there only
moves to a descendant of itself."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from peerd.handoff.service import HandoffService
from tests.helpers import client_for, git, items, script, wait_terminal
from tests.support.eventually import eventually
from tests.support.handoff import box_daemon, laptop_daemon, linked, move_ended, worked_thread


def stop_at(service: HandoffService, step: str) -> asyncio.Event:
    """Block the move before `step` as a crash would leave it (the daemon is then stopped)."""
    reached = asyncio.Event()

    async def fault(name: str) -> None:
        if name == step:
            reached.set()
            await asyncio.Event().wait()  # forever: the daemon stops under it

    service.fault = fault
    return reached


async def _crash_laptop_at(tmp_path: Path, step: str) -> None:
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        assert pair.laptop.handoff is not None
        reached = stop_at(pair.laptop.handoff, step)
        body = {"to": "box", "message": script({"reply": "AFTER THE CRASH"})}
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body=body)
        await asyncio.wait_for(reached.wait(), 30)
        await pair.laptop.shutdown()  # what is recorded is what a crash would leave
        async with laptop_daemon(tmp_path) as laptop, client_for(laptop.paths.home) as lc:
            move = await move_ended(lc, answer["move"]["moveId"])
            assert move["state"] == "moved", move
            there = move["movedTo"]["threadId"]
            # One live copy: the thread here is moved, exactly one thread there, and it continued.
            assert (await lc.call("GET", f"/v1/threads/{here}"))["status"] == "moved"
            assert [t["id"] for t in (await pair.bc.call("GET", "/v1/threads"))["items"]] == [there]
            assert (await wait_terminal(pair.bc, there))["status"] == "completed"
            replies = [i["text"] for i in await items(pair.bc, there) if i["kind"] == "assistant_message"]
            assert replies == ["AFTER THE CRASH"]


async def test_a_laptop_crash_before_the_launch_resumes_to_one_live_copy(tmp_path: Path) -> None:
    await _crash_laptop_at(tmp_path, "launch")


async def test_a_laptop_crash_after_the_box_launched_reaches_the_same_thread(tmp_path: Path) -> None:
    await _crash_laptop_at(tmp_path, "record-launch")


async def test_a_laptop_crash_before_the_landing_was_recorded_resumes(tmp_path: Path) -> None:
    await _crash_laptop_at(tmp_path, "record-landing")


async def test_a_box_that_is_down_mid_move_gets_the_move_when_it_is_back(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        assert pair.laptop.handoff is not None
        reached = asyncio.Event()
        release = asyncio.Event()
        steps: list[str] = []

        async def fault(name: str) -> None:
            steps.append(name)
            if name == "launch" and not release.is_set():
                reached.set()
                await release.wait()

        pair.laptop.handoff.fault = fault
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box"})
        await asyncio.wait_for(reached.wait(), 30)
        await pair.box.shutdown()
        release.set()
        await eventually(  # the launch fails (unreachable) and is retried
            lambda: steps.count("launch") >= 2, what="the move's launch tried again", within=30
        )
        assert (await pair.lc.call("GET", f"/v1/moves/{answer['move']['moveId']}"))["state"] == "moving"
        async with box_daemon(tmp_path, pair.box_port) as box, client_for(box.paths.home) as bc:
            move = await move_ended(pair.lc, answer["move"]["moveId"], total=90)
            assert move["state"] == "moved", move
            assert [t["id"] for t in (await bc.call("GET", "/v1/threads"))["items"]] == [
                move["movedTo"]["threadId"]
            ]


async def test_a_diverged_branch_there_is_kept_and_never_overwritten(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        box_repo = tmp_path / "box-repo"
        # The box has a branch of the thread's name with other work on it.
        git(box_repo, "checkout", "-q", "-b", f"peerd/{here}")
        (box_repo / "theirs.txt").write_text("the box's own work\n")
        git(box_repo, "add", "theirs.txt")
        git(box_repo, "commit", "-qm", "box work")
        theirs = git(box_repo, "rev-parse", "HEAD").strip()
        git(box_repo, "checkout", "-q", "main")
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box"})
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved", move
        assert move["keptRef"] == f"refs/peerd/moved/{move['moveId']}"
        assert git(box_repo, "rev-parse", f"peerd/{here}").strip() == theirs, "the box's branch is untouched"
        assert git(box_repo, "rev-parse", move["keptRef"]).strip() == move["snapshot"]
        there = await pair.bc.call("GET", f"/v1/threads/{move['movedTo']['threadId']}")
        assert there["branch"] == f"peerd/{there['id']}"  # a branch of its own, at the moved work
        await wait_terminal(pair.bc, there["id"])
        assert (Path(there["worktreePath"]) / "new.txt").read_text() == "new here\n"
        assert not (Path(there["worktreePath"]) / "theirs.txt").exists()


async def test_a_branch_there_behind_the_moved_work_that_the_owner_made_is_kept(tmp_path: Path) -> None:
    """A branch of the thread's name that the box's owner made by hand (peerd has no record of
    it: the owner's) is not fast-forwarded, even though the moved work descends from it: the
    moved work is kept beside it (a link's own branch does fast-forward: test_ownership.py)."""
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        box_repo = tmp_path / "box-repo"
        git(box_repo, "branch", f"peerd/{here}", "main")  # an ancestor of the moved work
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box"})
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved" and move["keptRef"] == f"refs/peerd/moved/{move['moveId']}", move
        assert (
            git(box_repo, "rev-parse", f"peerd/{here}").strip() == git(box_repo, "rev-parse", "main").strip()
        )
        assert git(box_repo, "rev-parse", move["keptRef"]).strip() == move["snapshot"]
        with contextlib.suppress(Exception):
            await wait_terminal(pair.bc, move["movedTo"]["threadId"])
