"""Handoff: two real daemons on loopback, linked (`auto`), each with a clone of one origin
(`linked`); a thread with work of every kind (`worked_thread`); following a move (`move_ended`);
and the git-level helpers of the snapshot tests (a repository, its index as git records it,
commits' trees)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.config import Config
from peerd.daemon import Daemon
from peerd.runtime.git import GitLocation
from tests.helpers import (
    GIT_ENV,
    client_for,
    free_port,
    git,
    make_repo,
    running_daemon,
    script,
    wait_terminal,
)

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
async def box_daemon(tmp: Path, port: int, settings: Config | None = None) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp / "box", label="box", listen=f"127.0.0.1:{port}", settings=settings) as box:
        yield box


@contextlib.asynccontextmanager
async def laptop_daemon(tmp: Path, settings: Config | None = None) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp / "laptop", label="laptop", watch_chunk_s=5, settings=settings) as laptop:
        yield laptop


@contextlib.asynccontextmanager
async def linked(tmp: Path, *, access: str = "auto", settings: Config | None = None) -> AsyncIterator[Linked]:
    """`settings` (both daemons'): a console on port 0, say (tests/support/console.py)."""
    laptop_repo, box_repo = clones(tmp)
    port = free_port()
    async with (
        box_daemon(tmp, port, settings) as box,
        laptop_daemon(tmp, settings) as laptop,
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


# The kernel stamps files from a coarse clock that may lag `time.time()` by a tick (a few ms).
MARGIN_S = 0.02


def project(tmp: Path) -> Path:
    repo = make_repo(tmp / "repo", origin=None)
    (repo / "calc.py").write_text("a - b\n")
    git(repo, "add", "calc.py")
    git(repo, "commit", "-q", "-m", "calc")
    return repo


async def next_second() -> None:
    """Sleep until just after the wall clock's next whole second."""
    await asyncio.sleep(1 - time.time() % 1 + MARGIN_S)


def loc_git(where: GitLocation, *args: str) -> str:
    argv = ["git", f"--git-dir={where.git_dir}", f"--work-tree={where.work_tree}", *args]
    # Looking never writes the index (`git status` would refresh it, and so hide the case).
    env = {**os.environ, **GIT_ENV, "GIT_OPTIONAL_LOCKS": "0"}
    return subprocess.run(
        argv, cwd=where.work_tree, env=env, capture_output=True, text=True, check=True
    ).stdout


def stat_as_recorded(where: GitLocation, path: str) -> bool:
    """Whether `path`'s lstat is what the index recorded for it, as git compares them (whole
    seconds of mtime and ctime, inode, size): git then calls it unchanged unless it is racy."""
    debug = loc_git(where, "ls-files", "--debug", "--", path)
    fields = dict(re.findall(r"(ctime|mtime|ino|size): (\d+)", debug))
    info = os.lstat(where.work_tree / path)
    seen = {
        "ctime": int(info.st_ctime),
        "mtime": int(info.st_mtime),
        "ino": info.st_ino,
        "size": info.st_size,
    }
    return all(int(fields[k]) == v for k, v in seen.items())


def tree_files(repo: Path, commit: str) -> dict[str, tuple[str, bytes]]:
    """The tree of `commit`, path -> (mode, bytes); a nested repository's entry holds its commit id."""
    listing = git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).split("\0")
    rows = [(line.split("\t", 1)[0].split(), line.split("\t", 1)[1]) for line in listing if line]
    found = {path: (meta[0], meta[2].encode()) for meta, path in rows if meta[1] == "commit"}
    blobs = [(meta, path) for meta, path in rows if meta[1] == "blob"]
    shas = "".join(f"{meta[2]}\n" for meta, _ in blobs).encode()
    out = subprocess.run(
        ["git", "cat-file", "--batch"], cwd=repo, input=shas, capture_output=True, check=True
    )
    data = out.stdout
    for meta, path in blobs:
        header, data = data.split(b"\n", 1)
        size = int(header.split()[2])
        found[path] = (meta[0], data[:size])
        data = data[size + 1 :]
    return found
