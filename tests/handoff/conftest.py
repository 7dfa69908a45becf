"""Two real daemons on loopback, linked (`auto`), each with a clone of one origin; and helpers to
start a thread with work of every kind and to follow a move."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from tests.helpers import client_for, free_port, git, make_repo, running_daemon, script, wait_terminal

# The thread here: one commit on its branch, an uncommitted edit of a tracked file, a new file.
WORK = script(
    {"write": {"path": "committed.txt", "content": "committed here\n"}},
    {
        "run": "git add committed.txt && git -c user.name=a -c user.email=a@x commit -qm 'work here'",
        "check": True,
    },
    {"edit": {"path": "README.md", "old": "# demo", "new": "# demo, edited here"}},
    {"write": {"path": "new.txt", "content": "new here\n"}},
    {"reply": "HERE DONE"},
)


@dataclass
class Linked:
    tmp: Path
    laptop: Daemon
    box: Daemon
    lc: LocalClient
    bc: LocalClient
    box_port: int
    here: str  # the laptop's project

    @property
    def box_id(self) -> str:
        assert self.box.identity is not None
        return self.box.identity.env_id

    @property
    def laptop_id(self) -> str:
        assert self.laptop.identity is not None
        return self.laptop.identity.env_id


def clones(tmp: Path) -> tuple[Path, Path]:
    origin = tmp / "origin.git"
    make_repo(tmp / "seed", origin=None)
    git(tmp, "clone", "-q", "--bare", str(tmp / "seed"), str(origin))
    for side in ("laptop", "box"):
        git(tmp, "clone", "-q", str(origin), str(tmp / f"{side}-repo"))
    return tmp / "laptop-repo", tmp / "box-repo"


@contextlib.asynccontextmanager
async def box_daemon(tmp: Path, port: int) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp / "box", label="box", listen=f"127.0.0.1:{port}") as box:
        yield box


@contextlib.asynccontextmanager
async def laptop_daemon(tmp: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp / "laptop", label="laptop", watch_chunk_s=5) as laptop:
        yield laptop


@contextlib.asynccontextmanager
async def linked(tmp: Path, *, access: str = "auto") -> AsyncIterator[Linked]:
    laptop_repo, box_repo = clones(tmp)
    port = free_port()
    async with (
        box_daemon(tmp, port) as box,
        laptop_daemon(tmp) as laptop,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        here = (await lc.call("POST", "/v1/projects", body={"path": str(laptop_repo)}))["id"]
        await bc.call("POST", "/v1/projects", body={"path": str(box_repo)})
        code = (await bc.call("POST", "/v1/pair", body={"access": access}))["code"]
        await lc.call("POST", "/v1/links", body={"code": code, "access": access})
        yield Linked(tmp, laptop, box, lc, bc, port, here)


async def worked_thread(pair: Linked, prompt: str = WORK) -> dict[str, Any]:
    launched: dict[str, Any] = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": pair.here, "prompt": prompt}
    )
    done = await wait_terminal(pair.lc, launched["threadId"], launched["runId"])
    assert done["status"] == "completed", done
    return launched


async def move_ended(client: LocalClient, move_id: str, total: float = 60.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total
    while True:
        move: dict[str, Any] = await client.call("GET", f"/v1/moves/{move_id}", params={"wait": 10})
        if move["state"] not in ("waiting", "moving") or loop.time() > deadline:
            return move


async def items(client: LocalClient, thread_id: str) -> list[dict[str, Any]]:
    return list((await client.call("GET", f"/v1/threads/{thread_id}/items"))["items"])
