"""Orchestration, loaded on first need: the engine and the service (with the hops, the coder
resolution and their models) cost some 3 MiB that an idle daemon nobody orchestrates with does not
pay (issue 33). They load, in a thread, on the first `/v1/orchestrations` request, or at start when
the store owes orchestration work (`owes_work`): then the engine resumes it (`Engine.recover`)
before anything else asks. This module imports neither the engine nor the service.

Durability: what an orchestration owes is in the store (its status, its packets' memos), never only
in memory, and `owes_work` is a superset of what `Engine.recover` resumes (an orchestration not
ended; a cancelled one whose packets still owe a stop to a coder's thread), so nothing owed waits
for a request that may never come."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from peerd.errors import Unavailable
from peerd.orchestrate.front import FrontParts, OrchestrateRequest
from peerd.orchestrate.states import TERMINAL_RUN, RunState
from peerd.runtime.background import import_in_thread
from peerd.store.db import Database
from peerd.store.sqltext import sql_list

if TYPE_CHECKING:
    from peerd.orchestrate.service import Orchestrations

log = structlog.get_logger(__name__)

LOAD_TIMEOUT_S = 60.0  # a request waits this long for the first import (well under a second)
MODULE = "peerd.orchestrate.service"  # imports the engine and everything it drives
_OWED = (
    f"SELECT 1 FROM orchestrations o WHERE o.status NOT IN {sql_list(sorted(TERMINAL_RUN))}"  # noqa: S608  # state names
    " OR (o.status = ? AND EXISTS (SELECT 1 FROM orchestration_packets p"
    " WHERE p.orchestration_id = o.id AND p.retries LIKE ?)) LIMIT 1"
)


async def owes_work(db: Database) -> bool:
    """Whether the store holds orchestration work to resume: an orchestration not ended (any state
    but completed, failed or cancelled: a state added later counts too), or a cancelled one whose
    packets' memos still owe a stop (`stop_owed`, written only while not empty)."""
    cancelled: RunState = "cancelled"
    row = await db.fetchone(_OWED, (cancelled, '%"stop_owed"%'))
    return row is not None


class LazyOrchestrations:
    """Serves `api/orchestrate.py`'s routes; builds the real `Orchestrations` (and its engine) once,
    on first need."""

    def __init__(self, parts: FrontParts) -> None:
        self.parts = parts
        self._service: Orchestrations | None = None
        self._loading: asyncio.Task[Orchestrations] | None = None
        self._closed = False

    @property
    def loaded(self) -> bool:
        return self._service is not None

    async def start(self) -> None:
        """At the daemon's start: load now only if the store owes orchestration work."""
        if await owes_work(self.parts.db):
            await self.service()

    async def service(self) -> Orchestrations:
        if self._service is not None:
            return self._service
        if self._closed:
            raise Unavailable("peerd is stopping; orchestration is closed.")
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(
                self._load(), name="peerd.orchestrate.load"
            )
        try:
            return await asyncio.wait_for(asyncio.shield(self._loading), LOAD_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable("peerd's orchestration engine is still loading; retry in a moment.") from None

    async def _load(self) -> Orchestrations:
        module = await import_in_thread(MODULE)
        service: Orchestrations = module.build(self.parts)
        # Every open orchestration continues where it was, and owed stops are delivered: at the
        # start that owed them, or (nothing owed then) a no-op on the first request.
        await service.engine.recover()
        self._service = service
        log.info("orchestrate.loaded")
        return service

    # --- the routes' calls (`api/orchestrate.py`) ----------------------------------------------

    async def start_run(self, req: OrchestrateRequest) -> dict[str, Any]:
        return await (await self.service()).start(req)

    async def info(self, run_id: str) -> dict[str, Any]:
        return await (await self.service()).info(run_id)

    async def list(self) -> list[dict[str, Any]]:
        return await (await self.service()).list()

    async def wait(self, run_id: str, *, after: float, seconds: float) -> dict[str, Any]:
        return await (await self.service()).wait(run_id, after=after, seconds=seconds)

    async def cancel(self, run_id: str, reason: str | None) -> dict[str, Any]:
        return await (await self.service()).cancel(run_id, reason)

    async def close(self) -> None:
        """Recorded state is resumed at the next start."""
        self._closed = True
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self._service is not None:
            await self._service.engine.close()
