"""`HandoffService`: moving a thread to a linked environment, driven from the machine it leaves.

`move` checks, records the move (`waiting`) and starts its driver; the driver waits for the
thread's runs to end, passes the commit point, then does the steps `machine.next_step` names, each
recorded when done, with transient failures retried (1 s doubling to 60 s). `start` resumes every
unfinished move after a restart (a crash included), so a move always ends with one live copy: the
thread here (`cancelled`, `failed`) or the thread there (`moved`). `MoveGuard.guard_send` is the
rule for a message to a thread with a move (`machine.on_message`), asked by `Operations.thread_send`
(given to its constructor: `Operations(before_send=...)`), so it is built before `Operations`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiosqlite
import structlog

from peerd import contracts as c
from peerd.core.access import ModeCap, cap_for
from peerd.core.clock import Clock
from peerd.core.ownership import Owner
from peerd.core.runs import is_live
from peerd.core.text import path_segment
from peerd.errors import InvalidRequest, MoveRefused, PeerdError, ThreadBusy, ThreadMoved, ThreadMoving
from peerd.handoff import gitwork, machine
from peerd.handoff import store as moves
from peerd.handoff.preflight import candidates, preflight
from peerd.handoff.wire import BranchLanded, Candidate, MoveAnswer, MoveInfo, TakeAnswer, ThreadMove
from peerd.operations import Caller, Operations, started_by
from peerd.orchestrate.transport import GitTransport
from peerd.peer.links import LinkService
from peerd.runtime import git
from peerd.runtime.feed import ChangeFeed
from peerd.store import links as link_store
from peerd.store import ownership, projects, threads
from peerd.store.db import Database

log = structlog.get_logger(__name__)

# Tests set it to stop a move between two steps (the name of the next one) as a crash would.
FaultPoint = Callable[[str], Awaitable[None]]


class MoveGuard:
    """What a message to a thread with a move does (`machine.on_message`): it cancels the move
    before its commit point, and is refused after it (`ThreadMoved`, `ThreadMoving`)."""

    def __init__(self, db: Database, feed: ChangeFeed, *, clock: Clock) -> None:
        self.db = db
        self.feed = feed
        self.clock = clock

    async def guard_send(self, thread_id: str) -> None:
        """A message to a thread with a move: cancels it before the commit point, else refused."""
        row = await moves.current(self.db, thread_id)
        reaction = machine.on_message(None if row is None else row["state"])
        if reaction == "cancel":
            reason = "A message to the thread before the move committed kept it here."
            if await moves.cancel_waiting(self.db, thread_id, reason=reason, now=self.clock()) is not None:
                self.feed.changed(thread_id)
                return
            row = await moves.current(self.db, thread_id)  # it passed its commit point meanwhile
            reaction = machine.on_message(None if row is None else row["state"])
        if row is None or reaction == "allow":
            return
        where = f"{row['environment_id']}"
        if reaction == "refuse_moved":
            raise ThreadMoved(
                f"Thread {thread_id} was moved to {where} as thread {row['there_thread_id']}: send there "
                f"(`peerd thread send {row['there_thread_id']} --env {where} ...`)."
            )
        there = f" as thread {row['there_thread_id']}" if row["there_thread_id"] else ""
        raise ThreadMoving(
            f"Thread {thread_id} is being moved to {where}{there} (move {row['id']}) and takes no new runs "
            "here; send to the thread there once the move ends (`peerd thread show` names it)."
        )


class HandoffService:
    def __init__(self, ops: Operations, link_service: LinkService, *, env_id: str, label: str) -> None:
        self.ops = ops
        self.db = ops.db
        self.links = link_service
        self.env_id = env_id
        self.label = label
        self.transport = GitTransport(ops)
        self.fault: FaultPoint | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    # --- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        for row in await moves.unfinished(self.db):
            self._drive(str(row["id"]))

    def driving(self) -> frozenset[str]:
        """The moves this driver runs now (the sweep of open work's owners of moves)."""
        return frozenset(self._tasks)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drive(self, move_id: str) -> None:
        if self._closed or move_id in self._tasks:
            return
        task = asyncio.create_task(self._run(move_id), name=f"peerd.move.{move_id}")
        self._tasks[move_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(move_id, None))

    # --- the request -------------------------------------------------------------------------------

    async def move(self, caller: Caller, thread_id: str, req: ThreadMove) -> MoveAnswer:
        if caller.link is not None:
            raise MoveRefused(
                "Work that came in through a link cannot move threads: the machine that started it owns it."
            )
        if caller.thread_id is not None and caller.thread_id != thread_id:
            raise MoveRefused("An agent moves only its own thread (thread_move takes no thread id).")
        thread = await threads.get_thread(self.db, thread_id)
        if thread.link_origin is not None:
            raise MoveRefused(
                f"Thread {thread.id} was started here through the link {thread.link_label!r}: the machine "
                "that started it owns it, so it moves only from there."
            )
        if req.dry_run:
            return MoveAnswer(candidates=await self.candidates(thread))
        if req.to is None:
            raise InvalidRequest("Name the environment to move the thread to (--to ENV), or ask --dry-run.")
        env = await self.ops.remote_target(caller, req.to)
        if env is None:
            raise MoveRefused(
                f"{req.to!r} is this environment; name a linked one (`peerd environment list`)."
            )
        request_key = (
            None if req.client_request_id is None else f"{caller.namespace}\n{req.client_request_id}"
        )
        existing = await moves.current(self.db, thread_id)
        if existing is not None and existing["environment_id"] == env:
            self._drive(str(existing["id"])) if existing["state"] in machine.OPEN else None
            return MoveAnswer(move=moves.info(existing, replayed=True))
        self._check_movable(caller, thread, interrupt=req.interrupt)
        project = await self.ops.project_show(caller, thread.project_id)
        seen = await self._preflight(env, thread, project)
        row, replayed = await moves.record(
            self.db,
            thread_id=thread_id,
            environment_id=env,
            message=req.message,
            interrupt=req.interrupt,
            started_by=started_by(caller),
            request_key=request_key,
            now=self.ops.clock(),
        )
        move_id = str(row["id"])
        if not replayed:
            await moves.set_fields(self.db, move_id, remote_project=seen.project_id, now=self.ops.clock())
            self.ops.feed.changed(thread_id)
            live = thread.latest_run is not None and is_live(thread.latest_run.status)
            if req.interrupt and live and caller.run_id is None:
                reason = f"Interrupted to move the thread to {env}."
                await self.ops.thread_interrupt(Caller.local(), thread_id, c.ThreadInterrupt(reason=reason))
        self._drive(move_id)
        return MoveAnswer(move=moves.info(await moves.get(self.db, move_id), replayed=replayed))

    @staticmethod
    def _check_movable(caller: Caller, thread: c.Thread, *, interrupt: bool) -> None:
        if thread.status == "moved":
            raise ThreadMoved(
                f"Thread {thread.id} was moved already; `peerd thread show {thread.id}` says where."
            )
        if thread.status != "active":
            raise MoveRefused(f"Thread {thread.id} is {thread.status}; only an active thread moves.")
        if thread.in_place or not thread.branch:
            raise MoveRefused(
                f"Thread {thread.id} works in the project's checkout itself; only a worktree moves."
            )
        live = thread.latest_run is not None and is_live(thread.latest_run.status)
        own_run = (
            caller.run_id is not None
            and thread.latest_run is not None
            and caller.run_id == thread.latest_run.id
        )
        if live and not own_run and not interrupt:
            raise ThreadBusy(
                f"Thread {thread.id} has a live run ({thread.latest_run.id if thread.latest_run else ''}); "
                "wait for it to end, or move with --interrupt to stop it first."
            )

    async def _preflight(self, env: str, thread: c.Thread, project: c.Project) -> TakeAnswer:
        return await preflight(self.ops, env, thread, project)

    async def candidates(self, thread: c.Thread) -> list[Candidate]:
        return await candidates(self.ops, self.links, thread)

    async def show(self, move_id: str, *, wait_s: float = 0.0) -> MoveInfo:
        """The move; with `wait_s`, a long-poll until it ends (moved, cancelled or failed)."""
        deadline = self.ops.feed.deadline(wait_s)
        while True:
            row = await moves.get(self.db, move_id)
            changed = self.ops.feed.watch(str(row["thread_id"]))
            row = await moves.get(self.db, move_id)
            remaining = self.ops.feed.remaining(deadline)
            if row["state"] not in machine.OPEN or remaining <= 0 or self.ops.feed.closed:
                return moves.info(row)
            await self.ops.feed.wait(changed, remaining)

    # --- the driver ---------------------------------------------------------------------------------

    async def _run(self, move_id: str) -> None:
        attempt = 0  # steps failed in a row (`machine.RETRY`), waited out on the daemon's clock
        while not self._closed and not self.ops.feed.closed:  # a stopping daemon resumes it at start
            try:
                if await self._advance(move_id):
                    return
                attempt = 0
            except asyncio.CancelledError:
                raise
            except PeerdError as exc:
                row = await moves.get(self.db, move_id)
                progress = _progress(row)
                if not machine.is_transient(exc.code) and machine.may_fail(progress):
                    log.warning("move.failed", move_id=move_id, code=exc.code)
                    await self._fail(row, f"{exc.code}: {exc.message}")
                    return
                attempt += 1
                log.info("move.retry", move_id=move_id, code=exc.code, attempt=attempt)
                await self.ops.clock.sleep(machine.RETRY.delay(attempt))
            except Exception as exc:
                log.exception("move.error", move_id=move_id)
                row = await moves.get(self.db, move_id)
                if machine.may_fail(_progress(row)):
                    await self._fail(row, f"internal_error: {type(exc).__name__}")
                    return
                attempt += 1
                await self.ops.clock.sleep(machine.RETRY.delay(attempt))

    async def _fail(self, row: aiosqlite.Row, error: str) -> None:
        await moves.fail(self.db, row["id"], error=error, now=self.ops.clock())
        self.ops.feed.changed(row["thread_id"])
        await self.ops.runs.kick(row["thread_id"])  # its queue is as it was before the commit point

    async def _fault(self, step: str) -> None:
        if self.fault is not None:
            await self.fault(step)

    async def _advance(self, move_id: str) -> bool:
        """One step of the move; True when it has ended."""
        row = await moves.get(self.db, move_id)
        thread_id = str(row["thread_id"])
        if row["state"] not in machine.OPEN:
            return True
        if row["state"] == "waiting":
            changed = self.ops.feed.watch(thread_id)
            outcome = await moves.commit_point(self.db, move_id, now=self.ops.clock())
            if outcome == "busy":
                await self.ops.feed.wait(changed, 30.0)
                return False
            self.ops.feed.changed(thread_id)
            return outcome == "gone"
        step = machine.next_step(_progress(row))
        await self._fault(step)
        thread = await threads.get_thread(self.db, thread_id)
        project = await projects.get(self.db, thread.project_id)
        env = str(row["environment_id"])
        now = self.ops.clock
        if step == "snapshot":
            where = await git.locate_worktree(Path(project.path), Path(thread.worktree_path))
            text = f"peerd: the uncommitted work of thread {thread_id}, moved to {env}"
            await ownership.claim_one(
                self.db,
                project_id=project.id,
                holding="ref",
                name=gitwork.moving_ref(move_id),
                owner=Owner.move(move_id),
                purpose="move-snapshot",
                thread_id=thread_id,
                now=now(),
            )
            commit, _ = await gitwork.snapshot(where, move_id=move_id, message=text)
            await moves.set_fields(
                self.db, move_id, snapshot=commit, base_commit=thread.base_commit, now=now()
            )
        elif step == "send":
            if row["remote_project"] is None:
                seen = await self._preflight(
                    env, thread, await self.ops.project_show(Caller.local(), project.id)
                )
                await moves.set_fields(self.db, move_id, remote_project=seen.project_id, now=now())
                row = await moves.get(self.db, move_id)
            await self.transport.send_base(env, row["remote_project"], Path(project.path), row["snapshot"])
            landed = BranchLanded.model_validate(
                await self.ops.forward_raw(
                    env,
                    "POST",
                    f"/v1/projects/{path_segment(row['remote_project'])}/moved-branch",
                    body={"moveId": move_id, "branch": thread.branch, "tip": row["snapshot"]},
                )
            )
            await self._fault("record-landing")
            await moves.set_fields(
                self.db, move_id, there_branch=landed.branch or "", kept_ref=landed.kept_ref, now=now()
            )
        elif step == "launch":
            await self._launch(row, thread)
        else:  # lineage, then the end
            body = {"environmentId": self.env_id, "threadId": thread_id}
            try:
                path = f"/v1/threads/{path_segment(row['there_thread_id'])}/moved-from"
                await self.ops.forward_raw(env, "POST", path, body=body)
            except PeerdError as exc:
                if machine.is_transient(exc.code):
                    raise
                log.warning("move.lineage_refused", move_id=move_id, code=exc.code)
            await moves.finish(self.db, move_id, now=now())
            self.ops.feed.changed(thread_id)
            with contextlib.suppress(PeerdError):
                await gitwork.drop_moving_ref(Path(project.path), move_id)
                await ownership.forget_one(
                    self.db, project.id, "ref", gitwork.moving_ref(move_id), owner=Owner.move(move_id)
                )
            log.info("move.moved", move_id=move_id, thread_id=thread_id, there=row["there_thread_id"])
            return True
        return False

    async def _launch(self, move: aiosqlite.Row, thread: c.Thread) -> None:
        move_id: str = move["id"]
        env: str = move["environment_id"]
        prompt = move["prompt"]
        if prompt is None:  # recorded before the launch, so a retried launch is the same request
            prompt = await self._prompt(thread, move["snapshot"], move["message"])
            await moves.set_fields(self.db, move_id, prompt=prompt, now=self.ops.clock())
        link = await link_store.get(self.db, env)
        cap = cap_for(
            link.access if link else "read-only", ModeCap(thread.runtime_mode, thread.interaction_mode)
        )
        launch = c.ThreadLaunch(
            project_id=move["remote_project"],
            prompt=prompt,
            provider=thread.provider,
            model=thread.model,
            title=thread.title,
            runtime_mode=cap.runtime,
            interaction_mode=cap.interaction,
            branch=move["there_branch"] or None,
            base_commit=move["snapshot"],
            client_request_id=f"move:{move_id}",
            environment_id=env,
        )
        launched = await self.ops.thread_launch(Caller.local(), launch)
        await self._fault("record-launch")
        await moves.set_fields(
            self.db,
            move_id,
            there_thread_id=launched.thread_id,
            there_run_id=launched.run_id,
            now=self.ops.clock(),
        )

    async def _prompt(self, thread: c.Thread, snapshot: str, message: str | None) -> str:
        said = await moves.last_messages(self.db, thread.id, machine.TRANSCRIPT_MESSAGES)
        return machine.continuation(
            origin_label=self.label or self.env_id,
            origin_env=self.env_id,
            thread_id=thread.id,
            title=thread.title,
            branch=thread.branch,
            snapshot=snapshot,
            messages=said,
            message=message,
        )[: c.MAX_PROMPT_CHARS]


def _progress(move: aiosqlite.Row) -> machine.Progress:
    return machine.Progress(
        snapshot=move["snapshot"],
        landed=move["there_branch"] is not None,
        there_thread_id=move["there_thread_id"],
    )
