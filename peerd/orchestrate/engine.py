"""The orchestration engine: plan -> implement -> verify -> review -> integrate, one hop at a time.

Each packet is a small state machine persisted in `orchestration_packets`; each hop ends in a
typed receipt appended to `orchestration_receipts`, and a hop cannot start without the previous
hop's receipt (`OrchestrationContext.gate`). Every step is safe to repeat, which is what makes a restart resume:
launches and sends carry idempotency keys derived from (run, packet, hop, attempt), commits and
verifications are repeated as they stand, and waits are simply waited again.

Packet states:

    queued -> implementing -> verifying -> reviewing -> approved -> integrated
                 ^   |            |            |
                 |   +-- coder error / empty diff: another coder once (redispatch)
                 +-------+ content failure: same coder once (fix)
                 +--------------------------- request_changes: implementer once (changes)
    any -> parked (a limit reached, reject, dependency failed, conflict) | cancelled

Limits: one retry per class (content, environmental, redispatch, changes), never more.

This module drives runs (plan, schedule, integrate, cancel); the packet hops are in `implement.py`
and `review.py`, and what they share (settings, gate, coder threads) in `context.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog

from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.errors import InvalidRequest, PeerdError, ReceiptMissing, StateChanged
from peerd.operations import Operations
from peerd.orchestrate import cleanup, prwait, runsteps, spend, userwork
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings, feed_key
from peerd.orchestrate.implement import implementing, start_packet
from peerd.orchestrate.integrate import deliver_run, ending, integrate
from peerd.orchestrate.models import PacketSpec, PlanReceipt
from peerd.orchestrate.overlaps import overlap_warnings, serialize_overlaps, shared_files
from peerd.orchestrate.placing import place_coder
from peerd.orchestrate.review import reviewing, verifying
from peerd.orchestrate.verdicts import (
    parse_plan_reply,
    planner_prompt,
)
from peerd.runtime.feed import ChangeFeed
from peerd.store import projects
from peerd.store.db import Database
from peerd.waits.pace import GhPace

log = structlog.get_logger(__name__)


def plan_checks(packets: list[PacketSpec], request: dict[str, Any]) -> tuple[list[PacketSpec], list[str]]:
    """Packets that share files without a dependency: warned about, or, with
    --serialize-overlaps, made to run one after the other."""
    serialize = bool((request.get("flags") or {}).get("serializeOverlaps"))
    pairs = shared_files(packets)
    if serialize and pairs:
        packets = serialize_overlaps(packets)
    return packets, overlap_warnings(pairs, serialized=serialize)


__all__ = ["Engine", "ReceiptMissing", "feed_key"]


class Engine:
    """Drives orchestrations inside the daemon; one asyncio task per open orchestration."""

    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        ops: Operations,
        *,
        worktrees_dir: Path,
        assign_more: Callable[[dict[str, Any], list[PacketSpec]], Awaitable[dict[str, Any]]],
        clock: Clock = SYSTEM_CLOCK,
        gh_pace: GhPace | None = None,
        pr_poll_s: float = prwait.POLL_S,
    ) -> None:
        self.ctx = OrchestrationContext(db, feed, ops, worktrees_dir=worktrees_dir, clock=clock)
        # --until: how a run polls its pull request (the daemon's one gh pace, shared with the
        # waits; `[waits] poll_seconds`).
        self._poller = prwait.Poller(gh_pace or GhPace(clock), poll_s=pr_poll_s)
        # Coders for packets a planner produced: resolved like the request's own packets.
        self._assign_more = assign_more
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # --- lifecycle ----------------------------------------------------------------------------

    def spawn(self, run_id: str) -> None:
        if run_id in self._tasks and not self._tasks[run_id].done():
            return
        self._tasks[run_id] = asyncio.create_task(self._drive(run_id), name=f"orchestrate:{run_id}")

    async def recover(self) -> None:
        for run_id in await ostore.all_runs(self.ctx.db, open_only=True):
            run = await ostore.get(self.ctx.db, run_id)
            log.info("orchestrate.resume", run_id=run_id, status=run.status)
            if run.status == "cancelling":  # the daemon died in the middle of a cancel: finish it
                self._background(run_id, self._finish_cancel(run_id, run.reason or "Cancelled."))
            else:
                self.spawn(run_id)
        for run_id in await ostore.all_runs(self.ctx.db, status="cancelled"):
            if any(p.memo.stop_owed for p in (await ostore.get(self.ctx.db, run_id)).packets):
                self._background(f"owed:{run_id}", cleanup.deliver_owed(self.ctx, run_id))

    def _background(self, key: str, coro: Coroutine[Any, Any, None]) -> None:
        if key in self._tasks and not self._tasks[key].done():
            coro.close()
            return
        self._tasks[key] = asyncio.create_task(coro, name=f"orchestrate:{key}")

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def cancel(self, run_id: str, reason: str | None) -> None:
        run = await ostore.get(self.ctx.db, run_id)
        if run.terminal:
            return
        await ostore.set_status(
            self.ctx.db, run_id, "cancelling", now=self.ctx.clock(), reason=reason or "Cancelled."
        )
        task = self._tasks.get(run_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._finish_cancel(run_id, reason or "Cancelled.")

    async def _finish_cancel(self, run_id: str, reason: str) -> None:
        await prwait.end_wait(self.ctx, run_id, reason)  # --until: the wait on the pull request ends
        owed = await cleanup.stop_packets(self.ctx, run_id, reason)
        self.ctx.changed(run_id)
        await cleanup.clean_up(self.ctx, run_id)
        await ostore.set_status(self.ctx.db, run_id, "cancelled", now=self.ctx.clock())
        self.ctx.changed(run_id)
        if owed:
            self._background(f"owed:{run_id}", cleanup.deliver_owed(self.ctx, run_id))

    # --- the run ------------------------------------------------------------------------------

    async def _drive(self, run_id: str) -> None:
        try:
            run = await ostore.get(self.ctx.db, run_id)
            if not run.packets and not await self._plan(run):
                return
            if run.status == ostore.WAITING:  # --until: resumed while it waited on its pull request
                await self._until(run_id, "")
                return
            await ostore.set_status(self.ctx.db, run_id, "running", now=self.ctx.clock())
            self.ctx.changed(run_id)
            await self._schedule(run_id)
            if (why := await spend.check(self.ctx, await ostore.get(self.ctx.db, run_id), None)) is not None:
                await self._fail_run(run_id, why)  # past the whole run's budget: nothing more starts
                return
            await ostore.set_status(self.ctx.db, run_id, "integrating", now=self.ctx.clock())
            self.ctx.changed(run_id)
            summary = await integrate(self.ctx, run_id)
            await deliver_run(self.ctx, run_id, summary)
            if await self._until(run_id, summary):  # --until: the wait on the pull request ends the run
                return
            await cleanup.clean_up(self.ctx, run_id)
            ended = await ending(self.ctx, run_id)  # completed, not_integrated or check_failed
            await ostore.set_status(self.ctx.db, run_id, ended, now=self.ctx.clock(), reason=summary)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("orchestrate.failed", run_id=run_id)
            message = (
                exc.message if isinstance(exc, PeerdError) else f"peerd failed while orchestrating: {exc}"
            )
            await self._fail_run(run_id, message)
        finally:
            self.ctx.changed(run_id)

    async def _until(self, run_id: str, summary: str) -> bool:
        """--until: wait on the run's pull request (`prwait.follow`); False when the run has none
        to wait on (it ends as any run). A fix packet goes round the run again (`_drive`: schedule,
        integrate, deliver to the same branch, then back here); any other end is the run's."""
        ended = await prwait.follow(self.ctx, run_id, summary, self._poller)
        if ended is None:  # no --until; or cancelled while it waited, and the cancel ends it
            return (await ostore.get(self.ctx.db, run_id)).status in (
                ostore.WAITING,
                "cancelling",
                "cancelled",
            )
        if isinstance(ended, prwait.Fixing):
            await self._drive(run_id)
            return True
        await cleanup.clean_up(self.ctx, run_id)
        # The pull request ended well: the run still ends by what its integration found (nothing
        # integrated, or the full check failed here, is said whatever GitHub's checks said).
        status = await ending(self.ctx, run_id) if ended.status == "completed" else ended.status
        await ostore.set_status(self.ctx.db, run_id, status, now=self.ctx.clock(), reason=ended.why)
        return True

    # --- hop 1: plan --------------------------------------------------------------------------

    async def _plan(self, run: ostore.RunRow) -> bool:
        settings = Settings.from_request(run.request)
        planner = await place_coder(self.ctx, run, settings.planner, "plan", runtime_mode="read-only")
        errors: list[str] = []
        thread_id: str | None = None
        planner_runs: list[str] = []
        for attempt in range(1, runsteps.PLAN_ATTEMPTS + 1):
            start = runsteps.decide_plan_attempt(
                runsteps.PlanAttempt(attempt, await spend.check(self.ctx, run, None), errors)
            )
            if isinstance(start, runsteps.FailRun):
                await self._fail_run(run.id, start.why)
                return False
            budget = await spend.budget_for(self.ctx, run, None, start.key)
            if isinstance(start, runsteps.LaunchPlanner) or thread_id is None:
                prompt = planner_prompt(
                    run.task,
                    verify_default=settings.verify,
                    workarounds=settings.workarounds,
                    errors=errors or None,
                )
                launched = await self.ctx.launch(
                    run,
                    planner,
                    prompt,
                    key=start.key,
                    runtime_mode="read-only",
                    base=run.base_commit,
                    role="planner",
                    budget=budget,
                )
                thread_id, run_ref = launched.thread_id, launched.run_id
            else:
                run_ref = await self.ctx.send(
                    run.id, thread_id, planner.environment, start.text, key=start.key, budget=budget
                )
            planner_runs.append(run_ref)
            status = await self.ctx.wait(run.id, thread_id, run_ref, planner.environment)
            await spend.record_run(self.ctx, run.id, None, thread_id, run_ref, planner.environment, "planner")
            over_budget = await spend.check(self.ctx, run, None)
            reply, parsed, errors = None, None, []
            if over_budget is None:
                reply = await self.ctx.reply(run.id, thread_id, run_ref, planner.environment)
                if status == "completed":
                    parsed, errors = parse_plan_reply(reply)
            ended = runsteps.decide_plan_ended(
                runsteps.PlanEnded(attempt, over_budget, status, reply, parsed, errors)
            )
            if isinstance(ended, runsteps.FailRun):
                await self._fail_run(run.id, ended.why)
                return False
            if isinstance(ended, runsteps.AcceptPlan):
                await self.ctx.archive(run.id, thread_id, planner.environment)  # planning is done
                packets = ended.packets
                break
        else:  # pragma: no cover  # decide_plan_ended fails the run at the last attempt
            raise AssertionError("the plan hop ended without a decision")
        packets, notes = plan_checks(packets, run.request)
        if settings.user_work and not run.request.get("includeDirty"):
            project = await projects.get(self.ctx.db, run.project_id)
            if overlap := userwork.dirty_in_packets(packets, settings.user_work):
                await self._fail_run(run.id, userwork.refusal(overlap, Path(project.path)).message)
                return False
        request = await self._assign_more(run.request, packets)
        receipt = PlanReceipt(
            run_id=run.id, task=run.task, packets=packets, source="planner", planner=planner, notes=notes,
            **await spend.receipt_fields(self.ctx, run, None, planner_runs),
        )  # fmt: skip
        await self._store_plan(run.id, receipt, request)
        return True

    async def _store_plan(self, run_id: str, receipt: PlanReceipt, request: dict[str, Any] | None) -> None:
        specs = [p.model_dump(mode="json") for p in receipt.packets]
        await ostore.record_plan(
            self.ctx.db, run_id, receipt.wire(), specs, request=request, now=self.ctx.clock()
        )
        self.ctx.changed(run_id)

    async def record_given_plan(self, run_id: str, receipt: PlanReceipt) -> None:
        await self._store_plan(run_id, receipt, None)

    async def _fail_run(self, run_id: str, reason: str) -> None:
        """The run ends failed; what it made is cleaned up first (unless --keep)."""
        with contextlib.suppress(Exception):
            await prwait.end_wait(self.ctx, run_id, reason)  # --until: an open wait ends with it
        with contextlib.suppress(Exception):
            await cleanup.stop_packets(self.ctx, run_id, reason)
        await cleanup.clean_up(self.ctx, run_id)
        await ostore.set_status(self.ctx.db, run_id, "failed", now=self.ctx.clock(), reason=reason)
        self.ctx.changed(run_id)

    # --- scheduling ---------------------------------------------------------------------------

    async def _schedule(self, run_id: str) -> None:
        in_flight: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                run = await ostore.get(self.ctx.db, run_id)
                settings = Settings.from_request(run.request)
                seen = [
                    runsteps.Scheduled(p.packet_id, p.state, PacketSpec.model_validate(p.spec).depends_on)
                    for p in run.packets
                ]
                whole = await spend.check(self.ctx, run, None)  # past it: no new hop starts
                for effect in runsteps.schedule(
                    seen, in_flight.keys(), concurrency=settings.concurrency, over_budget=whole
                ):
                    if isinstance(effect, runsteps.Park):
                        with contextlib.suppress(StateChanged):  # moved meanwhile: the next pass sees it
                            await self.ctx.park(run_id, effect.packet_id, effect.why, expect=effect.expect)
                    else:
                        in_flight[effect.packet_id] = asyncio.create_task(
                            self._packet(run_id, effect.packet_id), name=f"packet:{run_id}:{effect.packet_id}"
                        )
                if not in_flight:
                    return
                done, _ = await asyncio.wait(in_flight.values(), return_when=asyncio.FIRST_COMPLETED)
                for packet_id, task in list(in_flight.items()):
                    if task in done:
                        del in_flight[packet_id]
                        if (exc := task.exception()) is not None:
                            message = exc.message if isinstance(exc, PeerdError) else str(exc)
                            log.error(
                                "orchestrate.packet_crashed", run_id=run_id, packet=packet_id, error=message
                            )
                            await self.ctx.park(run_id, packet_id, f"peerd failed on this packet: {message}")
        finally:
            for task in in_flight.values():
                task.cancel()
            for task in in_flight.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # --- one packet ---------------------------------------------------------------------------

    async def _packet(self, run_id: str, packet_id: str) -> None:
        while True:
            run = await ostore.get(self.ctx.db, run_id)
            packet = next(p for p in run.packets if p.packet_id == packet_id)
            if packet.terminal or packet.state == "approved" or run.terminal:
                return
            if (why := await spend.check(self.ctx, run, packet_id)) is not None:
                await spend.stop_over_budget(self.ctx, run_id, packet, why)
                return
            try:
                if packet.state == "queued":
                    await start_packet(self.ctx, run, packet)
                elif packet.state == "implementing":
                    await implementing(self.ctx, run, packet)
                elif packet.state == "verifying":
                    await verifying(self.ctx, run, packet)
                elif packet.state == "reviewing":
                    await reviewing(self.ctx, run, packet)
                else:
                    raise InvalidRequest(f"Packet {packet_id} is in an unknown state {packet.state!r}.")
            except StateChanged as exc:  # another writer moved it first: decide again from there
                log.info("orchestrate.state_changed", run_id=run_id, packet=packet_id, now=exc.current)

    # --- threads --------------------------------------------------------------------------------
