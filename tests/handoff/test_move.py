"""`peerd thread move` between two real daemons: the git work and the conversation travel, the
thread there continues, the thread here refuses new runs, a retry is the same move."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from peerd.api.localclient import LocalClient
from peerd.errors import PeerdError
from tests.helpers import git, items, script, wait_terminal
from tests.support.handoff import Linked, linked, move_ended, worked_thread


async def test_a_thread_moves_with_its_commits_edits_new_files_and_transcript(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        worktree = Path(launched["worktreePath"])
        status_before = git(worktree, "status", "--porcelain")
        message = script(
            {"run": "cat committed.txt README.md new.txt", "check": True}, {"reply": "THERE DONE"}
        )
        body = {"to": "box", "message": message, "clientRequestId": "m1"}
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body=body)
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved", move
        there = move["movedTo"]["threadId"]
        assert move["movedTo"]["environmentId"] == pair.box_id

        # The thread there has the work and continues with the scripted provider.
        done = await wait_terminal(pair.bc, there)
        assert done["status"] == "completed", done
        seen = await items(pair.bc, there)
        command = next(i for i in seen if i["kind"] == "command")
        assert "committed here" in command["data"]["output"]
        assert "# demo, edited here" in command["data"]["output"]
        assert "new here" in command["data"]["output"]
        # Its prompt says it was moved, from where, the transcript (quoted), then the message.
        prompt = seen[0]["text"]
        assert seen[0]["kind"] == "user_message"
        assert "This thread was moved here from laptop" in prompt and here in prompt
        assert "> HERE DONE" in prompt
        assert prompt.endswith(message)
        thread_there = await pair.bc.call("GET", f"/v1/threads/{there}")
        assert thread_there["movedFrom"] == {"environmentId": pair.laptop_id, "threadId": here}
        assert thread_there["branch"] == f"peerd/{here}"  # the branch's name travelled

        # The thread here is moved, points there, and takes no new runs; its worktree is untouched.
        thread_here = await pair.lc.call("GET", f"/v1/threads/{here}")
        assert thread_here["status"] == "moved"
        assert thread_here["movedTo"] == {"environmentId": pair.box_id, "threadId": there}
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", f"/v1/threads/{here}/runs", body={"text": "still there?"})
        assert refused.value.code == "thread_moved"
        assert there in refused.value.message
        assert git(worktree, "status", "--porcelain") == status_before

        # A retried move is the same move: one thread there.
        again = await pair.lc.call("POST", f"/v1/threads/{here}/move", body=body)
        assert again["move"]["moveId"] == move["moveId"] and again["move"]["replayed"]
        box_threads = (await pair.bc.call("GET", "/v1/threads"))["items"]
        assert [t["id"] for t in box_threads] == [there]


async def test_a_live_run_refuses_the_move_unless_it_is_interrupted(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        hold = tmp_path / "never"
        launched = await pair.lc.call(
            "POST",
            "/v1/threads",
            body={"projectId": pair.here, "prompt": script({"wait_for_file": str(hold)})},
        )
        here = launched["threadId"]
        await pair.lc.call("GET", f"/v1/threads/{here}/wait", params={"timeout": 0.5})
        with pytest.raises(PeerdError) as busy:
            await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box"})
        assert busy.value.code == "thread_busy"
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box", "interrupt": True})
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved", move
        run = (await pair.lc.call("GET", f"/v1/threads/{here}"))["latestRun"]
        assert run["status"] == "interrupted"


async def test_the_agent_tool_moves_its_own_thread_once_its_run_ends(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        hold = tmp_path / "release"
        there_script = script({"reply": "CONTINUED THERE"})
        prompt = script(
            {"write": {"path": "wip.txt", "content": "agent wip\n"}},
            {
                "tool": {
                    "name": "thread_move",
                    "arguments": {"to": "box", "message": there_script},
                    "check": True,
                }
            },
            {"wait_for_file": str(hold)},
            {"reply": "MOVING ON"},
        )
        launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": pair.here, "prompt": prompt})
        here = launched["threadId"]
        for _ in range(200):  # the tool call recorded the move; the run is still live
            events = await pair.lc.call(
                "GET", f"/v1/threads/{here}/events", params={"after": 0, "limit": 100}
            )
            if any(e["type"] == "move.updated" for e in events["events"]):
                break
            await pair.lc.call("GET", f"/v1/threads/{here}/wait", params={"timeout": 0.1})
        [recorded] = [e for e in events["events"] if e["type"] == "move.updated"]
        # While the agent's run is live the move waits: one live copy, nothing launched there.
        await asyncio.sleep(1.0)  # a time for a wrong commit point to come: an absence has no event
        waiting = await pair.lc.call("GET", f"/v1/moves/{recorded['data']['moveId']}")
        assert waiting["state"] == "waiting", waiting
        assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []
        thread = await pair.lc.call("GET", f"/v1/threads/{here}")
        assert thread["status"] == "active" and thread["latestRun"]["status"] == "running"
        hold.write_text("go")
        assert (await wait_terminal(pair.lc, here, launched["runId"]))["status"] == "completed"
        tool_item = next(i for i in await items(pair.lc, here) if i["kind"] == "tool_call")
        move_id = tool_item["data"]["result"]["move"]["moveId"]
        move = await move_ended(pair.lc, move_id)
        assert move["state"] == "moved" and move["startedBy"] == f"run:{launched['runId']}"
        there = move["movedTo"]["threadId"]
        assert (await wait_terminal(pair.bc, there))["status"] == "completed"
        seen = await items(pair.bc, there)
        assert "> MOVING ON" in seen[0]["text"]  # the transcript has the run's last reply
        assert [i["text"] for i in seen if i["kind"] == "assistant_message"] == ["CONTINUED THERE"]
        worktree = Path((await pair.bc.call("GET", f"/v1/threads/{there}"))["worktreePath"])
        assert (worktree / "wip.txt").read_text() == "agent wip\n"


async def test_a_message_before_the_commit_point_cancels_the_move(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        hold = tmp_path / "release"
        prompt = script(
            {"tool": {"name": "thread_move", "arguments": {"to": "box"}, "check": True}},
            {"wait_for_file": str(hold)},
        )
        launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": pair.here, "prompt": prompt})
        here = launched["threadId"]
        move_id = None
        for _ in range(200):
            events = await pair.lc.call(
                "GET", f"/v1/threads/{here}/events", params={"after": 0, "limit": 100}
            )
            found = [e for e in events["events"] if e["type"] == "move.updated"]
            if found:
                move_id = found[0]["data"]["moveId"]
                break
            await pair.lc.call("GET", f"/v1/threads/{here}/wait", params={"timeout": 0.1})
        assert move_id is not None
        sent = await pair.lc.call(
            "POST", f"/v1/threads/{here}/runs", body={"text": script({"reply": "STAYED"})}
        )
        hold.write_text("go")
        assert (await wait_terminal(pair.lc, here, sent["runId"]))["status"] == "completed"
        move = await pair.lc.call("GET", f"/v1/moves/{move_id}")
        assert move["state"] == "cancelled"
        thread = await pair.lc.call("GET", f"/v1/threads/{here}")
        assert thread["status"] == "active" and thread["movedTo"] is None
        assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []


async def test_a_thread_a_link_started_is_not_moved_from_the_box(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        there_project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]["id"]
        async with contextlib_forwarded(pair) as forwarded:
            launched = await forwarded.call(
                "POST", "/v1/threads", body={"projectId": there_project, "prompt": script({"reply": "x"})}
            )
        await wait_terminal(pair.bc, launched["threadId"])
        with pytest.raises(PeerdError) as refused:
            await pair.bc.call("POST", f"/v1/threads/{launched['threadId']}/move", body={"to": "anywhere"})
        assert refused.value.code == "move_refused"
        assert "owns it" in refused.value.message
        # Not even listed as movable: a dry run (which needs no target) is refused the same way.
        with pytest.raises(PeerdError) as listed:
            await pair.bc.call("POST", f"/v1/threads/{launched['threadId']}/move", body={"dryRun": True})
        assert listed.value.code == "move_refused"


def contextlib_forwarded(pair: Linked) -> LocalClient:
    """The laptop's client for calls forwarded to the box (`--env box`)."""
    return LocalClient(pair.laptop.paths.socket, environment_id=pair.box_id)


async def test_dry_run_lists_who_can_take_it_and_why_not(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        launched = await worked_thread(pair)
        here = launched["threadId"]
        path = f"/v1/threads/{here}/move"
        [fits] = (await pair.lc.call("POST", path, body={"dryRun": True}))["candidates"]
        assert fits["fits"] and fits["label"] == "box" and fits["projectId"]
        await pair.bc.call("DELETE", f"/v1/projects/{fits['projectId']}")
        [no_project] = (await pair.lc.call("POST", path, body={"dryRun": True}))["candidates"]
        assert not no_project["fits"] and "no project with repository" in no_project["reason"]
        await pair.box.shutdown()
        [away] = (await pair.lc.call("POST", path, body={"dryRun": True}))["candidates"]
        assert not away["fits"] and away["reason"].startswith("not reachable")
        # Nothing was recorded by the dry runs; a real move to the unreachable box is refused first.
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", path, body={"to": "box"})
        assert refused.value.code == "unreachable"
        assert (await pair.lc.call("GET", f"/v1/threads/{here}"))["status"] == "active"
