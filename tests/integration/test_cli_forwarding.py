"""The CLI acts in a linked environment with --env, and shows delegated tasks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import Pair, script, wait_terminal
from tests.support.delegation import delegate
from tests.support.forwarding import linked  # noqa: F401  # the fixture


async def peerd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


async def test_env_option_and_task_commands(linked: tuple[Pair, dict[str, Any], dict[str, Any]]) -> None:  # noqa: F811
    pair, here, there = linked
    home = pair.laptop.paths.home
    listed, launched = await asyncio.gather(
        peerd(home, "project", "list", "--env", "box", "--json"),
        peerd(
            home,
            "thread",
            "launch",
            "--env",
            "box",
            "--project",
            there["id"],
            "--prompt",
            script({"reply": "hi"}),
            "--wait",
            "30",
            "--json",
        ),
    )
    assert listed.returncode == 0, listed.stderr
    assert [p["id"] for p in json.loads(listed.stdout)] == [there["id"]]
    assert launched.returncode == 0, launched.stderr
    result = json.loads(launched.stdout)
    assert result["wait"]["status"] == "completed"
    shown = await peerd(home, "thread", "show", result["threadId"], "--env", "box")
    assert shown.returncode == 0 and "assistant message: hi" in shown.stdout
    assert (await pair.bc.call("GET", f"/v1/threads/{result['threadId']}"))["linkLabel"] == "laptop"

    parent = await pair.lc.call(
        "POST",
        "/v1/threads",
        body={
            "projectId": here["id"],
            "prompt": script(delegate(task=script({"reply": "done"}), mode="wait")),
        },
    )
    await wait_terminal(pair.lc, parent["threadId"], parent["runId"])
    tasks_json = await peerd(home, "task", "list", parent["threadId"], "--json")
    [task] = json.loads(tasks_json.stdout)
    assert task["status"] == "completed"
    show = await peerd(home, "task", "show", task["taskId"])
    assert show.returncode == 0 and show.stdout.rstrip().endswith("done")
    missing = await peerd(home, "task", "show", "tsk_nope")
    assert missing.returncode == 1 and "task_not_found" in missing.stderr
