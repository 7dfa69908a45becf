"""A laptop and a box as daemons in the test's event loop (for faults set from inside: a store made
full, a link routed through `tests/faultproxy.py`), linked, each with a clone of one origin."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from tests.faultproxy import FaultProxy
from tests.faults.harness import clones
from tests.helpers import client_for, free_port, running_daemon


@dataclass
class Pair:
    laptop: Daemon
    box: Daemon
    lc: LocalClient
    bc: LocalClient
    box_id: str
    here: str  # the laptop's project
    there: str  # the box's project
    proxy: FaultProxy | None = None

    def home(self, side: str) -> Path:
        return (self.laptop if side == "laptop" else self.box).paths.home

    def db(self, side: str) -> Path:
        return self.daemon(side).paths.db

    def daemon(self, side: str) -> Daemon:
        return self.laptop if side == "laptop" else self.box

    async def forwarded(self, method: str, path: str, **kw: Any) -> Any:
        """A call the laptop forwards to the box (`--env box`)."""
        async with LocalClient(self.laptop.paths.socket, environment_id=self.box_id) as c:
            return await c.call(method, path, **kw)


@contextlib.asynccontextmanager
async def linked_pair(
    tmp: Path, *, watch_chunk_s: float = 50.0, proxied: bool = False
) -> AsyncIterator[Pair]:
    laptop_repo, box_repo = clones(tmp)
    box_port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(FaultProxy(box_port)) if proxied else None
        advertise = (proxy.url,) if proxy is not None else ()
        box = await stack.enter_async_context(
            running_daemon(tmp / "box", label="box", listen=f"127.0.0.1:{box_port}", advertise=advertise)
        )
        laptop = await stack.enter_async_context(
            running_daemon(tmp / "laptop", label="laptop", watch_chunk_s=watch_chunk_s)
        )
        lc = await stack.enter_async_context(client_for(laptop.paths.home))
        bc = await stack.enter_async_context(client_for(box.paths.home))
        here = (await lc.call("POST", "/v1/projects", body={"path": str(laptop_repo)}))["id"]
        there = (await bc.call("POST", "/v1/projects", body={"path": str(box_repo)}))["id"]
        code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
        box_id = (await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"}))["environmentId"]
        yield Pair(laptop, box, lc, bc, box_id, here, there, proxy)
