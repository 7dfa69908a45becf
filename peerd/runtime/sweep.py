"""The sweep of open work: its I/O shell. Once a minute (and once right after start-up) it reads
the open rows (`peerd/store/sweep.py:snapshot`), asks the pure rule (`peerd/core/liveness.py:sweep`)
which of them nothing owns, owes or ends, and applies each fix through the feature that owns that
kind of record: the run manager (a run cut like a daemon stop cuts it; a queue started), the
approvals service (a question withdrawn), the task settlement (`Delegation.on_run_end`, or the
task ended when its link is gone) and the move driver (`HandoffService.start`). Each fix is logged
(`sweep.fixed`, the record's id and the typed action; no prompt or secret). A failing sweep is
logged and tried again at the next tick; it never stops the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.liveness import Fix, Owners, sweep
from peerd.store import sweep as sweep_store
from peerd.store.db import Database

log = structlog.get_logger(__name__)

SWEEP_EVERY_S = 60.0


@dataclass
class SweepHooks:
    """What the sweep asks of the features that own each kind of record."""

    owners: Callable[[], Owners]
    cut_run: Callable[[str, str], Awaitable[None]]  # (run id, reason)
    start_queue: Callable[[str], Awaitable[None]]  # thread id
    withdraw: Callable[[str, str], Awaitable[None]]  # (approval id, reason)
    settle: Callable[[str], Awaitable[None]]  # a local task's child thread id
    end_task: Callable[[str, str], Awaitable[None]]  # (task id, reason): failed
    resume_moves: Callable[[], Awaitable[None]]
    resume_waits: Callable[[], Awaitable[None]] | None = None  # every open wait nobody watches


class Sweeper:
    def __init__(
        self, db: Database, hooks: SweepHooks, *, clock: Clock = SYSTEM_CLOCK, every_s: float = SWEEP_EVERY_S
    ) -> None:
        self.db = db
        self.hooks = hooks
        self.clock = clock
        self.every_s = every_s
        self.fixed = 0  # fixes applied since start (tests and `status` read it)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="peerd.sweep")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.once()
            except Exception:
                log.warning("sweep.failed", exc_info=True)
            await self.clock.sleep(self.every_s)

    async def once(self) -> list[Fix]:
        """One sweep: the fixes it applied."""
        snap = await sweep_store.snapshot(self.db, now=self.clock())
        # What this daemon runs is read after the rows: a run started meanwhile is in it.
        fixes = sweep(snap, self.hooks.owners())
        resumed: set[str] = set()
        for fix in fixes:
            if fix.action in ("resume_move", "resume_wait"):
                if fix.action in resumed:
                    continue  # one call resumes them all
                resumed.add(fix.action)
            try:
                await self._apply(fix)
            except Exception:
                log.warning("sweep.fix_failed", action=fix.action, record=fix.id, exc_info=True)
                continue
            self.fixed += 1
            log.info("sweep.fixed", action=fix.action, record=fix.id, reason=fix.reason)
        return fixes

    async def _apply(self, fix: Fix) -> None:
        hooks = self.hooks
        if fix.action == "cut_run":
            if fix.id in hooks.owners().runs:  # started between the read and now: it is owned
                return
            await hooks.cut_run(fix.id, fix.reason)
        elif fix.action == "start_queue":
            await hooks.start_queue(fix.id)
        elif fix.action == "withdraw_approval":
            await hooks.withdraw(fix.id, fix.reason)
        elif fix.action == "settle_task":
            await hooks.settle(fix.id)
        elif fix.action == "end_task":
            await hooks.end_task(fix.id, fix.reason)
        elif fix.action == "resume_move":
            await hooks.resume_moves()
        elif fix.action == "resume_wait" and hooks.resume_waits is not None:
            await hooks.resume_waits()
