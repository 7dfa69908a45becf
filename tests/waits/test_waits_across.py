"""Across machines: a box's thread (a laptop's delegated task) waits on its pull request there, and
the laptop's parent is woken through the follower once the wait's wake on the box ended, with its
reply (the box's feed counts an open wait as the child's own open work: `tasks/feedstore.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import Config, WaitsConfig
from tests.helpers import items
from tests.support.delegation import delegate, linked_pair, runs_script, wait_run_number
from tests.support.stubgh import StubGh, failing, pending

pytestmark = pytest.mark.slow  # two daemons

Json = dict[str, Any]


async def test_a_box_childs_wait_wakes_the_laptops_parent_through_the_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gh = StubGh.install(tmp_path / "bin", monkeypatch)  # the box's gh (both daemons share PATH here)
    gh.play(pending(), pending(), failing())
    settings = Config(waits=WaitsConfig(poll_seconds=0.05))
    async with linked_pair(tmp_path, watch_chunk_s=5, settings=settings) as (pair, project):
        child = runs_script(
            [{"tool": {"name": "wait_for_github", "arguments": {"pr": "7", "until": "checks"}, "check": True}},
             {"reply": "waiting on CI"}],
            [{"reply": "CI FAILED ON THE BOX"}],
        )  # fmt: skip
        parent_script = runs_script(
            [delegate(task=child, target={"environmentId": "box"}), {"reply": "delegated"}],
            [{"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
             {"reply": "PARENT GOT ${result}"}],
        )  # fmt: skip
        parent = await pair.lc.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": parent_script}
        )
        woken = await wait_run_number(pair.lc, parent["threadId"], 2)
        assert woken["status"] == "completed"
        [task] = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": parent["threadId"]}))["items"]
        assert (task["status"], task["result"]) == ("completed", "CI FAILED ON THE BOX")
        [wait] = (await pair.bc.call("GET", "/v1/waits"))["items"]  # the wait lives on the box
        assert wait["outcome"] == "failed" and wait["threadId"] == task["remoteChild"]["threadId"]
        assert (await pair.lc.call("GET", "/v1/waits"))["items"] == []
        replies = [
            i["text"] for i in await items(pair.lc, parent["threadId"]) if i["kind"] == "assistant_message"
        ]
        assert replies[-1] == "PARENT GOT CI FAILED ON THE BOX"
        assert (await pair.lc.call("GET", f"/v1/threads/{parent['threadId']}"))["latestRun"]["number"] == 2
