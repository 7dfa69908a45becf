"""kill -9 of the laptop's `peerd serve` in the middle of a move: the restarted daemon resumes it
to one live copy (the box is in this process, so the test can hold a step there while it kills)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from peerd.handoff import boxside
from tests.helpers import DaemonProcess, client_for, free_port, items, script, wait_terminal
from tests.support.handoff import WORK, box_daemon, clones, move_ended


@pytest.mark.parametrize("held", ["landing", "launch"])
async def test_a_killed_laptop_resumes_the_move_to_one_live_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    laptop_repo, box_repo = clones(tmp_path)
    async with box_daemon(tmp_path, free_port()) as box, client_for(box.paths.home) as bc:
        laptop = DaemonProcess(tmp_path / "laptop", label="laptop")
        laptop.start()
        try:
            await laptop.ready()
            async with client_for(laptop.home) as lc:
                here_project = (await lc.call("POST", "/v1/projects", body={"path": str(laptop_repo)}))["id"]
                await bc.call("POST", "/v1/projects", body={"path": str(box_repo)})
                code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
                await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
                launched = await lc.call(
                    "POST", "/v1/threads", body={"projectId": here_project, "prompt": WORK}
                )
                assert (await wait_terminal(lc, launched["threadId"], launched["runId"]))[
                    "status"
                ] == "completed"

                entered, gate, left = asyncio.Event(), asyncio.Event(), asyncio.Event()

                def holding(real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
                    async def held_step(*args: Any, **kwargs: Any) -> Any:
                        entered.set()
                        await gate.wait()  # the laptop is killed meanwhile; then the box goes on
                        try:
                            return await real(*args, **kwargs)
                        finally:
                            left.set()

                    return held_step

                if held == "landing":
                    monkeypatch.setattr(boxside, "land", holding(boxside.land))
                else:
                    assert box.handoff is not None
                    ops = box.handoff.ops
                    monkeypatch.setattr(ops, "thread_launch", holding(ops.thread_launch))
                message = script({"reply": "AFTER KILL -9"})
                body = {"to": "box", "message": message}
                answer = await lc.call("POST", f"/v1/threads/{launched['threadId']}/move", body=body)
            await asyncio.wait_for(entered.wait(), 30)
            laptop.kill()  # SIGKILL: nothing runs after this but what was committed
            gate.set()
            await asyncio.wait_for(left.wait(), 30)  # the box finishes the held step for a laptop gone
            monkeypatch.undo()
            laptop.start()
            await laptop.ready()
            async with client_for(laptop.home) as lc:
                move = await move_ended(lc, answer["move"]["moveId"])
                assert move["state"] == "moved", move
                there = move["movedTo"]["threadId"]
                assert (await lc.call("GET", f"/v1/threads/{launched['threadId']}"))["status"] == "moved"
            assert [t["id"] for t in (await bc.call("GET", "/v1/threads"))["items"]] == [there]
            assert (await wait_terminal(bc, there))["status"] == "completed"
            replies = [i["text"] for i in await items(bc, there) if i["kind"] == "assistant_message"]
            assert replies == ["AFTER KILL -9"]
        finally:
            laptop.kill()
