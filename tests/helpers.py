"""Test helpers: real git repositories, real daemons (in-process or as subprocesses), scripts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from peerd.api.listener_rules import ListenerLimits
from peerd.api.localclient import LocalClient
from peerd.config import Config
from peerd.daemon import Daemon, DaemonConfig
from peerd.errors import DaemonNotRunning
from peerd.paths import Paths
from peerd.peer.identity import Identity, server_ssl_context
from tests.support.eventually import eventually

GIT_ENV = {
    "GIT_AUTHOR_NAME": "peerd tests",
    "GIT_AUTHOR_EMAIL": "tests@peerd.invalid",
    "GIT_COMMITTER_NAME": "peerd tests",
    "GIT_COMMITTER_EMAIL": "tests@peerd.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def make_repo(path: Path, *, origin: str | None = "git@github.com:peerd/demo.git") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# demo\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    if origin:
        git(path, "remote", "add", "origin", origin)
    return path


def script(*steps: dict[str, Any]) -> str:
    """A prompt holding an inline script for the `script` provider."""
    return "```peerd-script\n" + json.dumps({"steps": list(steps)}) + "\n```"


def free_port() -> int:
    """A loopback port free now: for a daemon that must listen at the same address after a restart."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def running_daemon(
    home: Path,
    *,
    label: str = "test",
    listen: str | None = "127.0.0.1:0",
    tls: bool = True,
    watch_chunk_s: float = 50.0,
    settings: Config | None = None,
    advertise: tuple[str, ...] = (),
    listener_limits: ListenerLimits | None = None,
) -> AsyncIterator[Daemon]:
    """A real daemon in this event loop: real Unix socket, real TLS listener (plain HTTP with
    `tls=False`, loopback only), real SQLite file."""
    config = DaemonConfig(
        home=home,
        label=label,
        listen=listen,
        tls=tls,
        watch_chunk_s=watch_chunk_s,
        settings=settings or Config(),
        advertise=advertise,
        listener_limits=listener_limits or ListenerLimits(),
    )
    daemon = Daemon(config)
    try:
        await daemon.start()
        yield daemon
    finally:
        await daemon.shutdown()


async def wait_started(
    home: Path, proc: subprocess.Popen[bytes] | None, *, timeout: float, label: str
) -> None:
    """Until the daemon at `home` (started as `proc`) has started: its early answer ("starting": no
    network listener yet) is not that; its exit, or `timeout`, says why with its log."""
    log = home / "daemon.log"

    def tail() -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:]) if log.exists() else ""

    async def started() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{label} exited: {tail()}")
        async with client_for(home) as client:
            return bool((await client.call("GET", "/v1/status")).get("state") != "starting")

    try:  # a socket that does not exist yet has no event to wait on
        await eventually(started, what=f"{label} started", within=timeout, ignoring=(DaemonNotRunning,))
    except AssertionError as late:
        raise TimeoutError(f"{late}; its log: {tail()}") from None


@asynccontextmanager
async def client_for(home: Path) -> AsyncIterator[LocalClient]:
    async with LocalClient(Paths(home).socket) as client:
        yield client


async def wait_terminal(
    client: LocalClient, thread_id: str, run_id: str | None = None, total: float = 30
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total
    while True:
        result: dict[str, Any] = await client.call(
            "GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": min(10.0, total)}
        )
        if result["terminal"] or loop.time() > deadline:
            return result
        run_id = result["runId"]


async def events_until(
    client: LocalClient,
    thread_id: str,
    found: Callable[[dict[str, Any]], bool],
    *,
    after: int = 0,
    total: float = 15,
) -> tuple[dict[str, Any], int]:
    """Long-poll the event cursor until an event matches; (that event, the cursor after it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total
    while loop.time() < deadline:
        page = await client.call(
            "GET", f"/v1/threads/{thread_id}/events", params={"after": after, "timeout": 5}
        )
        for event in page["events"]:
            if found(event):
                return event, event["seq"]
        after = page["nextCursor"]
    raise AssertionError(f"no matching event on thread {thread_id} within {total} s")


async def wait_status(client: LocalClient, thread_id: str, run_id: str, status: str) -> int:
    def match(e: dict[str, Any]) -> bool:
        return e["type"] == "run.updated" and e["data"]["runId"] == run_id and e["data"]["status"] == status

    _, cursor = await events_until(client, thread_id, match)
    return cursor


async def items(client: LocalClient, thread_id: str) -> list[dict[str, Any]]:
    """A thread's items (its first page)."""
    return list((await client.call("GET", f"/v1/threads/{thread_id}/items"))["items"])


class DaemonProcess:
    """`peerd serve` as a real subprocess, for crash and signal tests."""

    def __init__(self, home: Path, *, label: str = "proc") -> None:
        self.home = home
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / "daemon.log", "ab")  # noqa: SIM115  # closed with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "peerd",
                "--home",
                str(self.home),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--label",
                self.label,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    async def ready(self, timeout: float = 20.0) -> None:
        await wait_started(self.home, self.proc, timeout=timeout, label="the daemon")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def exited(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@dataclasses.dataclass
class Pair:
    """Two real daemons in this loop, "laptop" and "box", with a local client for each."""

    laptop: Daemon
    box: Daemon
    lc: LocalClient  # the laptop's local client
    bc: LocalClient  # the box's local client

    @property
    def box_id(self) -> str:
        assert self.box.identity is not None
        return self.box.identity.env_id

    @property
    def box_url(self) -> str:
        return self.box.advertised_urls()[0]

    async def code(self, access: str = "auto", **extra: Any) -> str:
        data = await self.bc.call("POST", "/v1/pair", body={"access": access, **extra})
        return str(data["code"])

    async def link(self, access: str = "auto", *, code: str | None = None, **extra: Any) -> dict[str, Any]:
        code = code or await self.code(access)
        body = {"code": code, "access": access, **extra}
        result: dict[str, Any] = await self.lc.call("POST", "/v1/links", body=body)
        return result

    async def remote(self, method: str, path: str, **kw: Any) -> Any:
        assert self.laptop.peers is not None
        return await self.laptop.peers.call(self.box_id, method, path, **kw)


@asynccontextmanager
async def two_daemons(
    tmp_path: Path, *, laptop_watch_chunk_s: float = 50.0, settings: Config | None = None
) -> AsyncIterator[Pair]:
    async with (
        running_daemon(
            tmp_path / "laptop", label="laptop", watch_chunk_s=laptop_watch_chunk_s, settings=settings
        ) as laptop,
        running_daemon(tmp_path / "box", label="box", settings=settings) as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        yield Pair(laptop, box, lc, bc)


def notify_socket(kind: str, tmp_path: Path) -> tuple[socket.socket, str]:
    """A bound datagram socket standing in for systemd, and the NOTIFY_SOCKET value naming it:
    a path (`kind="path"`) or an abstract name (`"abstract"`, written `@name`)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if kind == "path":
        path = tmp_path / "notify"
        if len(os.fsencode(path)) > 100:
            sock.close()
            pytest.skip("the temp dir's path is too long for a Unix socket")
        sock.bind(str(path))
        return sock, str(path)
    name = f"peerd-test-{uuid.uuid4().hex}"
    sock.bind("\0" + name)
    return sock, "@" + name


def processes_in(directory: str) -> list[int]:
    """Processes whose working directory is `directory` (a CLI and its helpers run in the worktree)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str((entry / "cwd").readlink()) == directory:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@asynccontextmanager
async def pinned_server(app: web.Application, identity: Identity) -> AsyncIterator[str]:
    """`app` served over TLS on loopback with `identity`'s certificate (a fake box); yields its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl_context(identity))
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"https://{host}:{port}"
    finally:
        await runner.cleanup()
