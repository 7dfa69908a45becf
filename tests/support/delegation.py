"""Delegation: scripts that delegate, reading a thread's items and tasks, waiting for a wake run or a
task's change, and a laptop linked to a box with clones of one origin (`linked_pair`, the fixture
`linked`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config
from tests.helpers import Pair, git, make_repo, two_daemons, wait_terminal


def runs_script(*runs: list[dict[str, Any]]) -> str:
    """A prompt whose script gives each run of the session its own steps (run 2 = the wake)."""
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


def delegate(**arguments: Any) -> dict[str, Any]:
    return {"tool": {"name": "delegate_task", "arguments": arguments, "check": True}}


READ_AND_REPORT = [
    {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
    {"reply": "PARENT GOT ${result}"},
]


async def tasks_of(client: LocalClient, thread_id: str) -> list[dict[str, Any]]:
    return list((await client.call("GET", "/v1/tasks", params={"threadId": thread_id}))["items"])


async def wait_run_number(
    client: LocalClient, thread_id: str, number: int, *, total: float = 60.0
) -> dict[str, Any]:
    """Wait until the thread's run `number` exists and ended (a wake run, say)."""
    deadline = asyncio.get_running_loop().time() + total
    while True:
        assert asyncio.get_running_loop().time() < deadline, f"run {number} of {thread_id} never ended"
        thread = await client.call("GET", f"/v1/threads/{thread_id}")
        latest = thread["latestRun"]
        if latest["number"] >= number:
            done = await wait_terminal(client, thread_id, latest["id"])
            if latest["number"] == number:
                return done
        events = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": 0, "limit": 1})
        cursor = events["nextCursor"]
        await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 5})


async def wait_task(client: LocalClient, parent: str, task_id: str, *, while_status: str) -> dict[str, Any]:
    """Follow the parent's events (task changes are parent events) until the task leaves a status."""
    cursor = 0
    deadline = asyncio.get_running_loop().time() + 60.0
    while True:
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} stayed {while_status}"
        task: dict[str, Any] = await client.call("GET", f"/v1/tasks/{task_id}")
        if task["status"] != while_status:
            return task
        events = await client.call(
            "GET", f"/v1/threads/{parent}/events", params={"after": cursor, "timeout": 20}
        )
        cursor = events["nextCursor"]


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[tuple[Pair, dict[str, Any]]]:
    async with linked_pair(tmp_path, watch_chunk_s=5) as found:
        yield found


@asynccontextmanager
async def linked_pair(
    tmp_path: Path, *, watch_chunk_s: float, settings: Config | None = None
) -> AsyncIterator[tuple[Pair, dict[str, Any]]]:
    """A laptop linked to a box with `auto` access; both have a clone of one origin."""
    origin = tmp_path / "origin.git"
    make_repo(tmp_path / "seed", origin=None)
    git(tmp_path, "clone", "-q", "--bare", str(tmp_path / "seed"), str(origin))
    async with two_daemons(tmp_path, laptop_watch_chunk_s=watch_chunk_s, settings=settings) as pair:
        lc, bc = pair.lc, pair.bc
        for side, client in (("laptop", lc), ("box", bc)):
            git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
            await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
        await pair.link("auto")
        here = (await lc.call("GET", "/v1/projects"))["items"][0]
        yield pair, here
