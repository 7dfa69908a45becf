"""The orchestration engine: plan -> implement -> verify -> review -> integrate, one hop at a time.

Each packet is a small state machine persisted in `orchestration_packets`; each hop ends in a
typed receipt appended to `orchestration_receipts`, and a hop cannot start without the previous
hop's receipt (`_gate`). Every step is safe to repeat, which is what makes a restart resume:
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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from peerd import contracts as c
from peerd.core.runs import SHUTDOWN_REASON
from peerd.errors import Conflict, InvalidRequest, PeerdError
from peerd.operations import Caller, Operations
from peerd.orchestrate import gitops
from peerd.orchestrate import store as ostore
from peerd.orchestrate.models import (
    CoderChoice,
    ImplementationReceipt,
    IntegrationReceipt,
    PacketSpec,
    PlanReceipt,
    ReviewReceipt,
    VerificationResult,
)
from peerd.orchestrate.transport import GitTransport
from peerd.orchestrate.verdicts import (
    classify_verification,
    implementer_prompt,
    parse_plan_reply,
    parse_review_reply,
    planner_prompt,
    reviewer_prompt,
)
from peerd.peer.client import PeerUnreachable
from peerd.runtime import git
from peerd.runtime.feed import ChangeFeed
from peerd.store import projects
from peerd.store.db import Database

log = structlog.get_logger(__name__)

WAIT_CHUNK_S = 50.0
UNREACHABLE_BACKOFF_S = (2.0, 5.0, 15.0, 30.0, 60.0)
OUTPUT_TAIL = 20_000
RETRY_LIMIT = 1  # per class: content, environmental, redispatch, changes, plan, review answer


def feed_key(run_id: str) -> str:
    return f"orch:{run_id}"


class ReceiptMissing(PeerdError):
    code = "receipt_missing"


@dataclass(frozen=True)
class Settings:
    """What one orchestration was asked to do, as recorded with it."""

    coders: list[CoderChoice]
    assignment: dict[str, CoderChoice]
    reviewers: dict[str, CoderChoice]
    concurrency: int
    verify: str | None
    workarounds: list[str]
    planner: CoderChoice

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Settings:
        return cls(
            coders=[CoderChoice.model_validate(x) for x in request["coders"]],
            assignment={k: CoderChoice.model_validate(v) for k, v in request.get("assignment", {}).items()},
            reviewers={k: CoderChoice.model_validate(v) for k, v in request.get("reviewers", {}).items()},
            concurrency=int(request.get("concurrency", 3)),
            verify=request.get("verify"),
            workarounds=list(request.get("workarounds", [])),
            planner=CoderChoice.model_validate(request.get("planner") or request["coders"][0]),
        )


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.feed = feed
        self.ops = ops
        self.transport = GitTransport(ops)
        self.worktrees_dir = worktrees_dir
        self.clock = clock
        # Coders for packets a planner produced: resolved like the request's own packets.
        self._assign_more = assign_more
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # --- lifecycle ----------------------------------------------------------------------------

    def spawn(self, run_id: str) -> None:
        if run_id in self._tasks and not self._tasks[run_id].done():
            return
        self._tasks[run_id] = asyncio.create_task(self._drive(run_id), name=f"orchestrate:{run_id}")

    async def recover(self) -> None:
        for run_id in await ostore.all_runs(self.db, open_only=True):
            log.info("orchestrate.resume", run_id=run_id)
            self.spawn(run_id)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def changed(self, run_id: str) -> None:
        self.feed.changed(feed_key(run_id))

    def _caller(self, run_id: str) -> Caller:
        return Caller(namespace=f"orchestrate:{run_id}")

    async def cancel(self, run_id: str, reason: str | None) -> None:
        run = await ostore.get(self.db, run_id)
        if run.terminal:
            return
        await ostore.set_status(
            self.db, run_id, "cancelling", now=self.clock(), reason=reason or "Cancelled."
        )
        task = self._tasks.get(run_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._stop_packets(run_id, reason or "Cancelled.")
        await ostore.set_status(self.db, run_id, "cancelled", now=self.clock())
        self.changed(run_id)

    async def _stop_packets(self, run_id: str, reason: str) -> None:
        run = await ostore.get(self.db, run_id)
        for packet in run.packets:
            if packet.terminal or packet.state == "approved":
                continue
            for thread_id, env in self._live_threads(packet):
                try:
                    await self.ops.thread_interrupt(
                        self._caller(run_id),
                        thread_id,
                        c.ThreadInterrupt(
                            stop=True, reason=f"Orchestration {run_id} cancelled.", environment_id=env
                        ),
                    )
                except PeerdError as exc:
                    log.warning(
                        "orchestrate.stop_failed", run_id=run_id, thread_id=thread_id, error=exc.message
                    )
            await ostore.update_packet(
                self.db, run_id, packet.packet_id, now=self.clock(), state="cancelled", failure=reason
            )

    @staticmethod
    def _live_threads(packet: ostore.PacketRow) -> list[tuple[str, str | None]]:
        found: list[tuple[str, str | None]] = []
        if packet.thread_id:
            found.append((packet.thread_id, packet.environment))
        review = packet.retries.get("review_thread")
        if isinstance(review, str):
            env = packet.retries.get("review_env")
            found.append((review, env if isinstance(env, str) else None))
        return found

    # --- the run ------------------------------------------------------------------------------

    async def _drive(self, run_id: str) -> None:
        try:
            run = await ostore.get(self.db, run_id)
            if not run.packets and not await self._plan(run):
                return
            await ostore.set_status(self.db, run_id, "running", now=self.clock())
            self.changed(run_id)
            await self._schedule(run_id)
            await ostore.set_status(self.db, run_id, "integrating", now=self.clock())
            self.changed(run_id)
            summary = await self._integrate(run_id)
            await ostore.set_status(self.db, run_id, "completed", now=self.clock(), reason=summary)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("orchestrate.failed", run_id=run_id)
            message = (
                exc.message if isinstance(exc, PeerdError) else f"peerd failed while orchestrating: {exc}"
            )
            await ostore.set_status(self.db, run_id, "failed", now=self.clock(), reason=message)
        finally:
            self.changed(run_id)

    # --- hop 1: plan --------------------------------------------------------------------------

    async def _plan(self, run: ostore.RunRow) -> bool:
        settings = Settings.from_request(run.request)
        planner = settings.planner
        errors: list[str] | None = None
        thread_id: str | None = None
        for attempt in (1, 2):
            prompt = planner_prompt(
                run.task, verify_default=settings.verify, workarounds=settings.workarounds, errors=errors
            )
            if thread_id is None:
                launched = await self._launch(
                    run,
                    planner,
                    prompt,
                    key=f"plan:{attempt}",
                    runtime_mode="read-only",
                    base=run.base_commit,
                )
                thread_id, run_ref = launched.thread_id, launched.run_id
            else:
                # The send-back is a follow-up in the planner's own session: only what was wrong.
                again = (
                    "Your plan is not valid:\n"
                    + "\n".join(f"- {e}" for e in errors or [])
                    + "\nSend the whole corrected plan as JSON, in the same shape."
                )
                run_ref = await self._send(
                    run.id, thread_id, planner.environment, again, key=f"plan:{attempt}"
                )
            status = await self._wait(run.id, thread_id, run_ref, planner.environment)
            reply = await self._reply(run.id, thread_id, run_ref, planner.environment)
            if status != "completed":
                await self._fail_run(run.id, f"The planner's run ended {status}: {reply or 'no reply'}")
                return False
            packets, errors = parse_plan_reply(reply)
            if packets is not None:
                break
        else:
            await self._fail_run(
                run.id, "The plan was not valid after one send-back:\n" + "\n".join(errors or [])
            )
            return False
        request = await self._assign_more(run.request, packets)
        receipt = PlanReceipt(
            run_id=run.id, task=run.task, packets=packets, source="planner", planner=planner, notes=[]
        )
        await self._store_plan(run.id, receipt, request)
        return True

    async def _store_plan(self, run_id: str, receipt: PlanReceipt, request: dict[str, Any] | None) -> None:
        await ostore.add_receipt(self.db, run_id, None, "plan", receipt.wire(), now=self.clock())
        if request is not None:
            async with self.db.write() as tx:
                import json  # noqa: PLC0415

                await tx.execute(
                    "UPDATE orchestrations SET request = ? WHERE id = ?", (json.dumps(request), run_id)
                )
        await ostore.add_packets(
            self.db, run_id, [p.model_dump(mode="json") for p in receipt.packets], now=self.clock()
        )
        self.changed(run_id)

    async def record_given_plan(self, run_id: str, receipt: PlanReceipt) -> None:
        await self._store_plan(run_id, receipt, None)

    async def _fail_run(self, run_id: str, reason: str) -> None:
        await ostore.set_status(self.db, run_id, "failed", now=self.clock(), reason=reason)
        self.changed(run_id)

    # --- scheduling ---------------------------------------------------------------------------

    async def _schedule(self, run_id: str) -> None:
        in_flight: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                run = await ostore.get(self.db, run_id)
                settings = Settings.from_request(run.request)
                states = {p.packet_id: p.state for p in run.packets}
                for packet in run.packets:
                    if packet.packet_id in in_flight or packet.terminal or packet.state == "approved":
                        continue
                    deps = PacketSpec.model_validate(packet.spec).depends_on
                    blocked = [d for d in deps if states.get(d) in ("parked", "failed", "cancelled")]
                    if blocked:
                        await self._park(
                            run_id, packet.packet_id, f"Dependency {', '.join(blocked)} did not make it."
                        )
                        continue
                    if any(states.get(d) not in ("approved", "integrated") for d in deps):
                        continue
                    if packet.state == "queued" and len(in_flight) >= settings.concurrency:
                        continue
                    in_flight[packet.packet_id] = asyncio.create_task(
                        self._packet(run_id, packet.packet_id), name=f"packet:{run_id}:{packet.packet_id}"
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
                            await self._park(run_id, packet_id, f"peerd failed on this packet: {message}")
        finally:
            for task in in_flight.values():
                task.cancel()
            for task in in_flight.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _park(self, run_id: str, packet_id: str, why: str) -> None:
        await ostore.update_packet(self.db, run_id, packet_id, now=self.clock(), state="parked", failure=why)
        self.changed(run_id)

    async def _set(self, orch_id: str, packet_id: str, **changes: Any) -> None:
        await ostore.update_packet(self.db, orch_id, packet_id, now=self.clock(), **changes)
        self.changed(orch_id)

    # --- one packet ---------------------------------------------------------------------------

    async def _packet(self, run_id: str, packet_id: str) -> None:
        while True:
            run = await ostore.get(self.db, run_id)
            packet = next(p for p in run.packets if p.packet_id == packet_id)
            if packet.terminal or packet.state == "approved" or run.terminal:
                return
            if packet.state == "queued":
                await self._start_packet(run, packet)
            elif packet.state == "implementing":
                await self._implementing(run, packet)
            elif packet.state == "verifying":
                await self._verifying(run, packet)
            elif packet.state == "reviewing":
                await self._reviewing(run, packet)
            else:
                raise InvalidRequest(f"Packet {packet_id} is in an unknown state {packet.state!r}.")

    async def _start_packet(self, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
        await self._gate(run.id, None, "plan")
        settings = Settings.from_request(run.request)
        coder = (
            settings.assignment.get(packet.packet_id)
            or settings.coders[packet.position % len(settings.coders)]
        )
        base = await self._base_for(run, packet)
        await self._set(
            run.id,
            packet.packet_id,
            state="implementing",
            hop="implement",
            attempt=1,
            coder=coder.model_dump(mode="json"),
            environment=coder.environment,
            branch=f"orchestrate/{run.id}/{packet.packet_id}",
            retries={"base": base, "sends": 0},
        )

    async def _base_for(self, run: ostore.RunRow, packet: ostore.PacketRow) -> str:
        """The exact commit a packet starts from: the run's base, or its dependencies' work."""
        deps = PacketSpec.model_validate(packet.spec).depends_on
        tips = [p.commit_sha for p in run.packets if p.packet_id in deps and p.commit_sha]
        if not tips:
            return run.base_commit
        if len(tips) == 1:
            return tips[0]
        project = await projects.get(self.db, run.project_id)
        repo = Path(project.path)
        branch = f"orchestrate/{run.id}/base-{packet.packet_id}"
        worktree = self.worktrees_dir / "orchestrate" / run.id / f"base-{packet.packet_id}"
        await git.create_worktree(repo, worktree, branch, tips[0])
        try:
            for dep in run.packets:
                if dep.packet_id in deps and dep.commit_sha and dep.commit_sha != tips[0] and dep.branch:
                    merged = await gitops.merge_into(
                        repo, worktree, dep.branch, f"Merge {dep.packet_id} as a base"
                    )
                    if not merged.merged:
                        raise Conflict(
                            f"The dependencies of {packet.packet_id} conflict: {', '.join(merged.conflicts)}"
                        )
            return await gitops.head(worktree)
        finally:
            await git.remove_worktree(repo, worktree, delete_branch=None)

    def _coder(self, packet: ostore.PacketRow) -> CoderChoice:
        return CoderChoice.model_validate(packet.coder)

    async def _implementing(self, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
        settings = Settings.from_request(run.request)
        spec = PacketSpec.model_validate(packet.spec)
        coder = self._coder(packet)
        memo = dict(packet.retries)
        if packet.thread_id is None:
            prompt = implementer_prompt(
                spec,
                workspace_root=f"the git worktree you start in (branch {packet.branch})",
                base_commit=str(memo["base"]),
                branch=str(packet.branch),
                workarounds=settings.workarounds,
                previous_failure=memo.get("previous_failure"),
                review_changes=None,
            )
            memo["prompt"] = prompt
            launched = await self._launch(
                run,
                coder,
                prompt,
                key=f"{packet.packet_id}:impl:{packet.attempt}",
                runtime_mode="auto",
                base=str(memo["base"]),
                branch=packet.branch,
            )
            await self._set(
                run.id, packet.packet_id, thread_id=launched.thread_id, run_id=launched.run_id, retries=memo
            )
            packet.thread_id, packet.run_id = launched.thread_id, launched.run_id
        pending = memo.get("pending_send")
        if isinstance(pending, str) and packet.run_id == memo.get("pending_after"):
            n = int(memo.get("sends", 0)) + 1
            run_id = await self._send(
                run.id, packet.thread_id, coder.environment, pending, key=f"{packet.packet_id}:send:{n}"
            )
            memo.update(sends=n, pending_send=None, pending_after=None)
            await self._set(run.id, packet.packet_id, run_id=run_id, retries=memo)
            packet.run_id = run_id
        assert packet.thread_id is not None and packet.run_id is not None  # noqa: S101  # set just above
        status = await self._wait(run.id, packet.thread_id, packet.run_id, coder.environment)
        if status == "interrupted" and await self._stopped_by_shutdown(
            run.id, packet.thread_id, coder.environment
        ):
            # A daemon restart (here or on the box) cut the coder off: it goes on in the same
            # session, without counting as a retry.
            n = int(memo.get("resumes", 0)) + 1
            text = (
                "peerd restarted while you were working; what you did so far is in your workspace. Continue "
                "the task below from where you were, then report.\n\n" + str(memo.get("prompt") or "")
            )
            run_ref = await self._send(
                run.id, packet.thread_id, coder.environment, text, key=f"{packet.packet_id}:resume:{n}"
            )
            memo["resumes"] = n
            await self._set(run.id, packet.packet_id, run_id=run_ref, retries=memo)
            return
        report = await self._reply(run.id, packet.thread_id, packet.run_id, coder.environment)
        memo["report"] = report
        if status != "completed":
            await self._redispatch_or_park(
                run, packet, memo, "coder_error", f"The coder's run ended {status}: {report}"
            )
            return
        tip, recovered = await self._collect(run, packet, coder)
        memo["recovered"] = recovered
        if tip is None or tip == memo["base"]:
            await self._redispatch_or_park(run, packet, memo, "empty_diff", "The coder changed nothing.")
            return
        await self._set(run.id, packet.packet_id, state="verifying", commit_sha=tip, retries=memo)

    async def _collect(
        self, run: ostore.RunRow, packet: ostore.PacketRow, coder: CoderChoice
    ) -> tuple[str | None, list[str]]:
        """Commit the coder's work on the packet branch, here (after containment) or on the box."""
        project = await projects.get(self.db, run.project_id)
        repo = Path(project.path)
        spec = PacketSpec.model_validate(packet.spec)
        message = f"{spec.id}: {spec.goal}"[:200]
        assert packet.thread_id is not None and packet.branch is not None  # noqa: S101
        if coder.environment is not None:
            tip, _ = await self.transport.fetch_result(
                coder.environment, packet.thread_id, repo, packet.branch, message
            )
            return tip, []
        thread = await self.ops.thread_show(self._caller(run.id), packet.thread_id)
        worktree = Path(thread.worktree_path)
        # Containment first: edits that escaped into the orchestrator's own checkout come back,
        # scoped to the packet's files only (anything else there may be the user's own work).
        recovered: list[str] = []
        dirty = await gitops.dirty_paths(repo)
        if dirty:
            recovered = await gitops.recover_escaped(repo, worktree, spec.files)
        await gitops.commit_all(worktree, message)
        return await gitops.head(worktree), recovered

    async def _redispatch_or_park(
        self, run: ostore.RunRow, packet: ostore.PacketRow, memo: dict[str, Any], why: str, detail: str
    ) -> None:
        """Empty diff, coder error or timeout: another coder once, never more."""
        settings = Settings.from_request(run.request)
        failed = VerificationResult(
            command=PacketSpec.model_validate(packet.spec).verify,
            exit_code=None,
            passed=False,
            timed_out=why == "timeout",
            output_tail=detail[-OUTPUT_TAIL:],
            classification=why,
        )
        await self._record_impl(run, packet, memo, None, failed)
        if int(memo.get("redispatch", 0)) >= RETRY_LIMIT:
            await self._park(run.id, packet.packet_id, f"{detail} (already re-dispatched once)")
            return
        current = self._coder(packet)
        others = [
            x
            for x in settings.coders
            if (x.backend, x.model, x.environment) != (current.backend, current.model, current.environment)
        ]
        if not others:
            await self._park(run.id, packet.packet_id, f"{detail} (no other coder to re-dispatch to)")
            return
        nxt = others[0].model_copy(update={"reason": f"re-dispatched after {why} from {current.spec}"})
        memo.update(redispatch=int(memo.get("redispatch", 0)) + 1, previous_failure=detail)
        if packet.thread_id is not None and current.environment is None:
            # The first coder's worktree goes (its branch stays, for a look); the next coder
            # starts clean from the same base on a branch of its own.
            with contextlib.suppress(PeerdError):
                await self.ops.thread_archive(self._caller(run.id), packet.thread_id)
        await self._set(
            run.id,
            packet.packet_id,
            state="implementing",
            attempt=packet.attempt + 1,
            coder=nxt.model_dump(mode="json"),
            environment=nxt.environment,
            thread_id=None,
            run_id=None,
            branch=f"orchestrate/{run.id}/{packet.packet_id}-{packet.attempt + 1}",
            retries=memo,
        )

    async def _record_impl(
        self,
        run: ostore.RunRow,
        packet: ostore.PacketRow,
        memo: dict[str, Any],
        commit: str | None,
        verification: VerificationResult,
    ) -> None:
        project = await projects.get(self.db, run.project_id)
        repo = Path(project.path)
        base = str(memo.get("base", run.base_commit))
        files: list[str] = []
        stat = ""
        if commit is not None and commit != base:
            files = await gitops.changed_files(repo, base, commit)
            stat = await gitops.diff_stat(repo, base, commit)
        coder = self._coder(packet)
        receipt = ImplementationReceipt(
            packet_id=packet.packet_id,
            attempt=packet.attempt,
            coder=coder,
            environment=coder.environment,
            branch=str(packet.branch),
            base_commit=base,
            commit=commit,
            files_changed=files,
            diff_stat=stat,
            verification=verification,
            report=str(memo.get("report") or ""),
            recovered_paths=list(memo.get("recovered") or []),
        )
        await ostore.add_receipt(
            self.db, run.id, packet.packet_id, "implementation", receipt.wire(), now=self.clock()
        )

    async def _verifying(self, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
        spec = PacketSpec.model_validate(packet.spec)
        memo = dict(packet.retries)
        assert packet.commit_sha is not None and packet.branch is not None  # noqa: S101
        project = await projects.get(self.db, run.project_id)
        repo = Path(project.path)
        worktree = self.worktrees_dir / "orchestrate" / run.id / f"verify-{packet.packet_id}"
        await git.remove_worktree(repo, worktree, delete_branch=None)
        await _detached_worktree(repo, worktree, packet.commit_sha)
        try:
            check = await gitops.run_check(worktree, spec.verify)
            kind = (
                "passed"
                if check.passed
                else classify_verification(check.exit_code, check.timed_out, check.output)
            )
            if kind == "environmental" and int(memo.get("environmental", 0)) < RETRY_LIMIT:
                # The orchestrator's own re-run outside any coder sandbox is authoritative.
                memo["environmental"] = int(memo.get("environmental", 0)) + 1
                check = await gitops.run_check(worktree, spec.verify)
                kind = (
                    "passed"
                    if check.passed
                    else classify_verification(check.exit_code, check.timed_out, check.output)
                )
        finally:
            await git.remove_worktree(repo, worktree, delete_branch=None)
        verification = VerificationResult(
            command=spec.verify,
            exit_code=check.exit_code,
            passed=check.passed,
            timed_out=check.timed_out,
            output_tail=check.output[-OUTPUT_TAIL:],
            classification=kind,
        )
        await self._record_impl(run, packet, memo, packet.commit_sha, verification)
        if verification.passed:
            await self._set(run.id, packet.packet_id, state="reviewing", hop="review", retries=memo)
            return
        if kind == "content" and int(memo.get("content", 0)) < RETRY_LIMIT:
            memo["content"] = int(memo.get("content", 0)) + 1
            memo["pending_send"] = (
                f"The verification command failed on your work:\n\n$ {spec.verify}\n{check.output[-8000:]}\n\n"
                "Fix it in the same workspace, run the command again, and report."
            )
            memo["pending_after"] = packet.run_id
            await self._set(run.id, packet.packet_id, state="implementing", hop="fix", retries=memo)
            return
        await self._park(
            run.id,
            packet.packet_id,
            f"Verification failed ({kind}):\n$ {spec.verify}\n{check.output[-OUTPUT_TAIL:]}",
        )

    async def _gate(self, run_id: str, packet_id: str | None, kind: str, **expect: Any) -> dict[str, Any]:
        """A hop starts only with the previous hop's receipt, and only one that lets it start."""
        receipt = await ostore.latest_receipt(self.db, run_id, packet_id, kind)
        if receipt is None or any(_dig(receipt, key) != value for key, value in expect.items()):
            raise ReceiptMissing(f"Packet {packet_id}: no {kind} receipt allows this hop ({expect}).")
        return receipt

    async def _reviewing(self, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
        impl = await self._gate(run.id, packet.packet_id, "implementation", **{"verification.passed": True})
        if impl.get("commit") != packet.commit_sha:
            raise ReceiptMissing(f"Packet {packet.packet_id}: the passing receipt is for another commit.")
        settings = Settings.from_request(run.request)
        spec = PacketSpec.model_validate(packet.spec)
        memo = dict(packet.retries)
        reviewer = settings.reviewers.get(packet.packet_id) or settings.coders[-1]
        project = await projects.get(self.db, run.project_id)
        assert packet.commit_sha is not None  # noqa: S101
        base = str(memo.get("base", run.base_commit))
        diff = await gitops.diff_text(Path(project.path), base, packet.commit_sha)
        verification = VerificationResult.model_validate(impl["verification"])
        round_n = int(memo.get("changes", 0)) + 1
        thread_id = memo.get("review_thread") if memo.get("review_round") == round_n else None
        review_run = memo.get("review_run")
        env = reviewer.environment  # a reviewer on a box gets the packet's commit sent there first
        if not isinstance(thread_id, str):
            launched = await self._launch(
                run, reviewer, reviewer_prompt(spec, diff, verification), key=f"{packet.packet_id}:review:{round_n}",
                runtime_mode="read-only", base=packet.commit_sha,
            )  # fmt: skip
            thread_id, review_run = launched.thread_id, launched.run_id
            memo.update(review_thread=thread_id, review_run=review_run, review_round=round_n, review_env=env)
            await self._set(run.id, packet.packet_id, retries=memo)
        assert isinstance(review_run, str)  # noqa: S101
        verdict, errors = None, ["no reply"]
        for ask in (1, 2):
            status = await self._wait(run.id, thread_id, review_run, env)
            reply = await self._reply(run.id, thread_id, review_run, env)
            verdict, errors = (
                parse_review_reply(reply) if status == "completed" else (None, [f"run {status}"])
            )
            if verdict is not None or ask == 2:
                break
            review_run = await self._send(
                run.id, thread_id, env,
                "Your answer was not a valid verdict:\n" + "\n".join(errors) + "\nAnswer with the JSON verdict only.",
                key=f"{packet.packet_id}:review:{round_n}:again",
            )  # fmt: skip
            memo["review_run"] = review_run
            await self._set(run.id, packet.packet_id, retries=memo)
        if verdict is None:
            await self._park(
                run.id, packet.packet_id, "The reviewer gave no valid verdict: " + "; ".join(errors)
            )
            return
        receipt = ReviewReceipt(
            packet_id=packet.packet_id,
            attempt=packet.attempt,
            reviewer=reviewer,
            verdict=verdict.verdict,
            evidence=verdict.evidence,
            summary=verdict.summary,
        )
        await ostore.add_receipt(
            self.db, run.id, packet.packet_id, "review", receipt.wire(), now=self.clock()
        )
        if verdict.verdict == "approve":
            await self._set(run.id, packet.packet_id, state="approved", hop=None, retries=memo)
        elif verdict.verdict == "request_changes" and int(memo.get("changes", 0)) < RETRY_LIMIT:
            memo["changes"] = round_n
            lines = [f"- {e.file}{':' + str(e.line) if e.line else ''}: {e.reason}" for e in verdict.evidence]
            memo["pending_send"] = (
                "The reviewer requested changes:\n" + "\n".join(lines) + "\nMake them, verify, and report."
            )
            memo["pending_after"] = packet.run_id
            await self._set(run.id, packet.packet_id, state="implementing", hop="changes", retries=memo)
        else:
            why = "rejected" if verdict.verdict == "reject" else "requested changes again"
            await self._park(run.id, packet.packet_id, f"The reviewer {why}: {verdict.summary}")

    # --- hop 5: integrate ---------------------------------------------------------------------

    async def _integrate(self, run_id: str) -> str:
        run = await ostore.get(self.db, run_id)
        settings = Settings.from_request(run.request)
        project = await projects.get(self.db, run.project_id)
        repo = Path(project.path)
        worktree = self.worktrees_dir / "orchestrate" / run.id / "integration"
        await git.create_worktree(repo, worktree, run.branch, run.base_commit)
        merged: list[str] = []
        conflicts: dict[str, list[str]] = {}
        try:
            for packet in run.packets:
                if packet.state == "integrated" and packet.branch:
                    merged.append(packet.packet_id)
                    continue
                if packet.state != "approved" or not packet.branch:
                    continue
                await self._gate(run.id, packet.packet_id, "review", verdict="approve")
                result = await gitops.merge_into(
                    repo, worktree, packet.branch, f"Integrate {packet.packet_id}"
                )
                if result.merged:
                    merged.append(packet.packet_id)
                    await self._set(run.id, packet.packet_id, state="integrated")
                else:
                    conflicts[packet.packet_id] = result.conflicts
                    await self._park(
                        run.id,
                        packet.packet_id,
                        "Merge conflict in " + ", ".join(result.conflicts) + ":\n" + result.output,
                    )
            verification = None
            if settings.verify and merged:
                check = await gitops.run_check(worktree, settings.verify)
                verification = _verification(settings.verify, check)
            tip = await gitops.head(worktree)
        finally:
            await git.remove_worktree(repo, worktree, delete_branch=None)
        receipt = IntegrationReceipt(
            branch=run.branch, base_commit=run.base_commit, merged=merged, conflicts=conflicts,
            verification=verification, commit=tip if merged else None,
        )  # fmt: skip
        await ostore.add_receipt(self.db, run.id, None, "integration", receipt.wire(), now=self.clock())
        await self._cleanup(run_id)
        parked = [
            p.packet_id
            for p in (await ostore.get(self.db, run_id)).packets
            if p.state in ("parked", "cancelled")
        ]
        check_text = (
            "no full check"
            if verification is None
            else ("check passed" if verification.passed else "check FAILED")
        )
        summary = f"{len(merged)} packet(s) integrated on {run.branch} ({check_text})"
        return summary + (f"; parked: {', '.join(parked)}" if parked else "")

    async def _cleanup(self, run_id: str) -> None:
        """Remove the worktrees of the packet and review threads, here and on boxes (their
        branches stay); a box that is away keeps them, which is only disk."""
        run = await ostore.get(self.db, run_id)
        caller = self._caller(run_id)
        for packet in run.packets:
            for thread_id, env in self._live_threads(packet):
                with contextlib.suppress(PeerdError):
                    if env is None:
                        await self.ops.thread_archive(caller, thread_id)
                    else:  # on the box, through the link that started it (the fence allows it)
                        await self.ops.forward_raw(env, "POST", f"/v1/threads/{thread_id}/archive")

    # --- threads --------------------------------------------------------------------------------

    async def _launch(
        self,
        run: ostore.RunRow,
        coder: CoderChoice,
        prompt: str,
        *,
        key: str,
        runtime_mode: str,
        base: str,
        branch: str | None = None,
    ) -> c.ThreadLaunchResult:
        project = await projects.get(self.db, run.project_id)
        project_id = project.id
        if coder.environment is not None:
            project_id = await self._remote_project(coder.environment, project)
            await self.transport.send_base(coder.environment, project_id, Path(project.path), base)
        req = c.ThreadLaunch(
            project_id=project_id,
            prompt=prompt,
            provider=coder.backend,
            model=coder.model,
            title=f"{run.id} {key}"[:200],
            runtime_mode=runtime_mode,
            client_request_id=f"{run.id}:{key}",
            environment_id=coder.environment,
            branch=branch,
            base_commit=base,
        )
        return await self.ops.thread_launch(self._caller(run.id), req)

    async def _remote_project(self, env: str, project: c.Project) -> str:
        page = await self.ops.project_list(self._caller("remote"), c.ProjectList(environment_id=env))
        for remote in page.items:
            if remote.repository_key and remote.repository_key == project.repository_key:
                return remote.id
        raise InvalidRequest(
            f"{env} has no checkout of {project.repository_key or project.name}: clone it there and "
            "`peerd project add` it."
        )

    async def _send(self, run_id: str, thread_id: str, env: str | None, text: str, *, key: str) -> str:
        req = c.ThreadSend(text=text, client_request_id=f"{run_id}:{key}", environment_id=env)
        return (await self.ops.thread_send(self._caller(run_id), thread_id, req)).run_id

    async def _wait(self, run_id: str, thread_id: str, run_ref: str, env: str | None) -> str:
        """Wait for a run to end, in long-poll chunks; a box that is away is waited for."""
        failures = 0
        while True:
            try:
                result = await self.ops.thread_wait(
                    self._caller(run_id),
                    thread_id,
                    c.ThreadWait(run_id=run_ref, timeout=WAIT_CHUNK_S, environment_id=env),
                )
            except PeerUnreachable:
                await asyncio.sleep(UNREACHABLE_BACKOFF_S[min(failures, len(UNREACHABLE_BACKOFF_S) - 1)])
                failures += 1
                continue
            failures = 0
            if result.terminal:
                return str(result.status)

    async def _stopped_by_shutdown(self, run_id: str, thread_id: str, env: str | None) -> bool:
        thread = await self.ops.thread_show(self._caller(run_id), thread_id, env)
        return thread.latest_run is not None and thread.latest_run.reason == SHUTDOWN_REASON

    async def _reply(self, run_id: str, thread_id: str, run_ref: str, env: str | None) -> str:
        page = await self.ops.thread_read(
            self._caller(run_id), thread_id, c.ThreadRead(run_id=run_ref, limit=100, environment_id=env)
        )
        texts = [i.text for i in page.items if i.kind == "assistant_message"]
        failures = [i.text for i in page.items if i.kind == "error"]
        return texts[-1] if texts else ("\n".join(failures) or "")


async def _detached_worktree(repo: Path, worktree: Path, commit: str) -> None:
    """A throwaway checkout of `commit` for running a check, on no branch."""
    worktree.parent.mkdir(parents=True, exist_ok=True)
    await git._git(repo, "worktree", "prune")  # the runtime's git runner
    await git._git(repo, "worktree", "add", "--detach", "--", str(worktree), commit)


def _verification(command: str, check: gitops.CheckResult) -> VerificationResult:
    kind = "passed" if check.passed else classify_verification(check.exit_code, check.timed_out, check.output)
    return VerificationResult(
        command=command,
        exit_code=check.exit_code,
        passed=check.passed,
        timed_out=check.timed_out,
        output_tail=check.output[-OUTPUT_TAIL:],
        classification=kind,
    )


def _dig(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
