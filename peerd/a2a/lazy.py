"""The A2A face, loaded on first need: the a2a-sdk (with protobuf and Starlette) costs some 11 MiB
that an idle daemon that nobody speaks A2A to does not pay (issue 33). It loads, in a thread, on
the first A2A request, or at start when there is A2A work to resume (a push owed or configured,
a task on a box followed: `store.owes_work`). `peerd status` reads given-up pushes from the store
without it. This module imports nothing of the SDK."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from peerd import contracts as c
from peerd.a2a import store
from peerd.errors import Unavailable
from peerd.operations import Caller, Operations
from peerd.runtime.background import import_in_thread

if TYPE_CHECKING:
    from peerd.a2a.http import A2AFace
    from peerd.a2a.push import PushService
    from peerd.a2a.remote import RemoteTasks

log = structlog.get_logger(__name__)

LOAD_TIMEOUT_S = 60.0  # a request waits this long for the first import (about a second)


class LazyA2A:
    """Serves `api/a2a_routes.Face`; builds the real `A2AFace` once, on first need."""

    def __init__(self, ops: Operations, *, label: str, allow_private_push: list[str]) -> None:
        self.ops = ops
        self.label = label
        self.allow_private_push = allow_private_push
        self._face: A2AFace | None = None
        self._loading: asyncio.Task[A2AFace] | None = None
        self._closed = False

    @property
    def loaded(self) -> bool:
        return self._face is not None

    @property
    def push(self) -> PushService:
        """The loaded face's push service (diagnostics and tests)."""
        return self._loaded().push

    @property
    def remote(self) -> RemoteTasks:
        return self._loaded().remote

    def _loaded(self) -> A2AFace:
        if self._face is None:
            raise Unavailable("peerd's A2A face is not loaded (no A2A request or owed work yet).")
        return self._face

    async def start(self) -> None:
        """At the daemon's start: load now only if there is A2A work to resume."""
        if await store.owes_work(self.ops.db):
            await self.face()

    async def face(self) -> A2AFace:
        if self._face is not None:
            return self._face
        if self._closed:
            raise Unavailable("peerd is stopping; the A2A face is closed.")
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load(), name="peerd.a2a.load")
        try:
            return await asyncio.wait_for(asyncio.shield(self._loading), LOAD_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable("peerd's A2A face is still loading; retry in a moment.") from None

    async def _load(self) -> A2AFace:
        module = await import_in_thread("peerd.a2a.http")
        face: A2AFace = module.A2AFace(self.ops, label=self.label, allow_private_push=self.allow_private_push)
        await face.start()  # owed pushes delivered again, tasks on boxes followed again
        self._face = face
        log.info("a2a.loaded")
        return face

    async def public_card(self, request: web.Request) -> web.StreamResponse:
        return await (await self.face()).public_card(request)

    async def serve(self, request: web.Request, caller: Caller) -> web.StreamResponse:
        return await (await self.face()).serve(request, caller)

    async def given_up(self) -> c.PushHealth:
        """The pushes given up lately (`peerd status`), from the store: the SDK is not needed."""
        return await store.pushes_given_up(
            self.ops.db, now=self.ops.clock(), window_s=store.GIVEN_UP_WINDOW_S, latest=5
        )

    async def close(self) -> None:
        self._closed = True
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._face is not None:
            await self._face.close()
