"""A laptop and a box in this event loop that a test stops and starts on the same homes (`Machines`;
the fixture `m`: both linked with `auto`, each with a clone of one origin), children held on a
signal file (`held_child`, the fixture `signals`), and the bounded waits the durability tests use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from peerd.tasks.delegation import Delegation
from peerd.tasks.follower import Follower
from tests.helpers import client_for, free_port, git, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.delegation import READ_AND_REPORT, delegate, runs_script, tasks_of
from tests.support.delegation import wait_run_number as wait_run_number_unbounded
from tests.support.delegation import wait_task as wait_task_unbounded

CHUNK_S = 2.0  # the laptop follower's long-poll chunk in these tests
WAIT_S = 30.0  # a broken rule fails a test after this long instead of hanging it


async def wait_task(client: LocalClient, parent: str, task_id: str, *, while_status: str) -> dict[str, Any]:
    return await asyncio.wait_for(
        wait_task_unbounded(client, parent, task_id, while_status=while_status), WAIT_S
    )


async def task_ended(client: LocalClient, parent: str, task_id: str) -> dict[str, Any]:
    """Until the task leaves pending and running."""
    task = await wait_task(client, parent, task_id, while_status="pending")
    return (
        task
        if task["status"] != "running"
        else await wait_task(client, parent, task_id, while_status="running")
    )


async def wait_run_number(client: LocalClient, thread_id: str, number: int) -> dict[str, Any]:
    return await asyncio.wait_for(wait_run_number_unbounded(client, thread_id, number), WAIT_S)


class Machines:
    """A laptop and a box (in this event loop) that a test can stop and start on the same homes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.box_listen = f"127.0.0.1:{free_port()}"
        self._stacks: dict[str, contextlib.AsyncExitStack] = {}
        self._daemons: dict[str, Daemon] = {}
        self._clients: dict[str, LocalClient] = {}
        self.box_id = ""
        self.here: dict[str, Any] = {}  # the laptop's project
        self.there: dict[str, Any] = {}  # the box's project

    def home(self, side: str) -> Path:
        return self.tmp / side

    async def start(self, side: str) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            if side == "laptop":
                cm = running_daemon(self.home(side), label="laptop", watch_chunk_s=CHUNK_S)
            else:
                cm = running_daemon(self.home(side), label="box", listen=self.box_listen)
            self._daemons[side] = await stack.enter_async_context(cm)
            self._clients[side] = await stack.enter_async_context(client_for(self.home(side)))
        except BaseException:
            await stack.aclose()
            raise
        self._stacks[side] = stack

    async def stop(self, side: str) -> None:
        stack = self._stacks.pop(side)
        self._daemons.pop(side)
        self._clients.pop(side)
        await stack.aclose()

    async def close(self) -> None:
        for side in ("laptop", "box"):
            if side in self._stacks:
                await self.stop(side)

    @property
    def laptop(self) -> Daemon:
        return self._daemons["laptop"]

    @property
    def lc(self) -> LocalClient:
        return self._clients["laptop"]

    @property
    def bc(self) -> LocalClient:
        return self._clients["box"]

    @property
    def delegation(self) -> Delegation:
        assert self.laptop.followers is not None
        return self.laptop.followers.delegation

    def follower(self) -> Follower | None:
        assert self.laptop.followers is not None
        return self.laptop.followers._followers.get(self.box_id)

    async def parent(self, prompt: str) -> tuple[str, str]:
        launched = await self.lc.call(
            "POST", "/v1/threads", body={"projectId": self.here["id"], "prompt": prompt}
        )
        return launched["threadId"], launched["runId"]

    async def box_threads(self) -> list[dict[str, Any]]:
        return list((await self.bc.call("GET", "/v1/threads", params={"includeArchived": True}))["items"])


async def setup_repos(tmp: Path) -> Path:
    origin = tmp / "origin.git"
    make_repo(tmp / "seed", origin=None)
    git(tmp, "clone", "-q", "--bare", str(tmp / "seed"), str(origin))
    for side in ("laptop", "box"):
        git(tmp, "clone", "-q", str(origin), str(tmp / f"{side}-repo"))
    return origin


async def link(lc: LocalClient, bc: LocalClient) -> str:
    code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
    linked = await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    return str(linked["environmentId"])


@pytest.fixture
async def m(tmp_path: Path) -> AsyncIterator[Machines]:
    """A laptop linked to a box with `auto` access; both have a clone of one origin."""
    await setup_repos(tmp_path)
    async with started(Machines(tmp_path), tmp_path) as machines:
        yield machines


M = TypeVar("M", bound="Machines")


@contextlib.asynccontextmanager
async def started(machines: M, tmp_path: Path) -> AsyncIterator[M]:
    """Both daemons started, each clone added as a project, the laptop linked (`auto`)."""
    try:
        await machines.start("box")
        await machines.start("laptop")
        machines.here = await machines.lc.call(
            "POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")}
        )
        machines.there = await machines.bc.call(
            "POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")}
        )
        machines.box_id = await link(machines.lc, machines.bc)
        yield machines
    finally:
        await machines.close()


@pytest.fixture
def signals() -> Iterator[Path]:
    """Files the box's confined runs can see (read-only): outside /tmp and peerd's homes."""
    with signal_dir() as path:
        yield path


async def started_file(m: Machines, thread_id: str) -> Path:
    """Where a `held_child` running as box thread `thread_id` says it started: its worktree."""
    return Path((await m.bc.call("GET", f"/v1/threads/{thread_id}"))["worktreePath"]) / "started"


async def wait_file(client: LocalClient, thread_id: str, path: Path) -> None:
    """Follow a thread's events until `path` exists with content (a step of its run writes it)."""

    async def follow() -> None:
        cursor = 0
        while not (path.exists() and path.read_text()):
            events = await client.call(
                "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 10}
            )
            cursor = events["nextCursor"]

    await asyncio.wait_for(follow(), WAIT_S)


def held_child(hold: Path, reply: str = "CHILD DONE") -> str:
    """A child that says it started (a file in its worktree), then waits for `hold`, then replies."""
    return script({"run": "printf started > started"}, {"wait_for_file": str(hold)}, {"reply": reply})


async def delegated_and_running(m: Machines, child: str, key: str) -> tuple[str, dict[str, Any]]:
    """A parent whose first run delegates `child` to the box (async) and ends; the task is running."""
    parent, run = await m.parent(
        runs_script(
            [delegate(task=child, target={"environmentId": m.box_id}, clientRequestId=key)], READ_AND_REPORT
        )
    )
    assert (await wait_terminal(m.lc, parent, run))["status"] == "completed"
    [task] = await tasks_of(m.lc, parent)
    assert task["status"] == "running", task
    return parent, task
