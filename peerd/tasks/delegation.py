"""Delegated tasks: `delegate_task`, `task_status`, `task_cancel`, and how a task ends and wakes.

A task is a piece of work a thread's live run hands to a child thread: here (any provider and
model: one coder asks another to implement or review) or in a linked environment. The task is
committed (pending, with the idempotency key its launch carries) before the launch leaves; the
child's ids are attached when the launch is answered. A task ends once, first result wins, and
the parent is woken once, in the same transaction (see `peerd.tasks.store.finish`).

Remote tasks are driven by the link's follower (`peerd.tasks.follower`): it re-sends launches the
box has not answered, delivers owed stops and watches the runs until they settle. The box's side
of that watch is `peerd.tasks.watch`. How a task ends, and how that survives a failing
store, is `peerd.tasks.ending`.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import structlog

from peerd import contracts as c
from peerd.approvals import store as approvals_store
from peerd.core import shortid
from peerd.core.access import ModeCap, resolve_modes
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.idempotency import request_hash
from peerd.core.runs import is_live
from peerd.core.text import path_segment
from peerd.errors import InvalidRequest, NotFound, ParentNotActive, PeerdError, TargetRequired, TaskNotFound
from peerd.events import Events, RemoteTaskChanged
from peerd.operations import Caller, Operations
from peerd.peer.forwarding import Forwarder
from peerd.runtime import git
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.runner import RunManager
from peerd.store import ids, links, projects, threads
from peerd.store.db import Database
from peerd.store.threads.usage import remote_task_usage, task_usage, wire_usage
from peerd.tasks import store as tasks
from peerd.tasks.ending import TaskEnder
from peerd.tasks.feed import FeedHub
from peerd.tasks.rules import WAIT_CAP_S, cancel_result, classify, role_prompt, stopped_with_parent
from peerd.tasks.store import NewTask, TaskRow

log = structlog.get_logger(__name__)

STOP_REFUSED = "The stop was refused there: "


def _launch_of(task: TaskRow, lineage: c.DelegatedFrom | None = None) -> c.ThreadLaunch:
    """The child's launch, the same on every (re-)send: its key was fixed when the task was recorded."""
    return c.ThreadLaunch(
        project_id=task.project_id or "",
        prompt=task.prompt,
        provider=task.provider,
        title=task.title,
        model=task.model,
        runtime_mode=task.runtime_mode,
        interaction_mode=task.interaction_mode,
        client_request_id=task.launch_key,
        delegated_from=lineage,
        budget=None if task.budget is None else c.Budget.model_validate_json(task.budget),
    )


def _seconds(timeout_ms: int | None) -> float:
    """A wait's length: as asked (0 = just look), else as long as tool calls safely last."""
    return WAIT_CAP_S if timeout_ms is None else timeout_ms / 1000


class Delegation:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        ops: Operations,
        runs: RunManager,
        forwarder: Forwarder,
        *,
        env_id: str,
        clock: Clock = SYSTEM_CLOCK,
        events: Events | None = None,
        hub: FeedHub | None = None,
    ) -> None:
        self.db = db
        self.feed = feed
        self.ops = ops
        self.runs = runs
        self.forwarder = forwarder
        self.env_id = env_id
        self.clock = clock
        # `RemoteTaskChanged` goes out when a remote task is recorded or stopped (its follower).
        self._events = events or Events()
        self.ender = TaskEnder(db, feed, runs, clock=clock, hub=hub)

    @property
    def hub(self) -> FeedHub:
        """The box's side of the change feed (`POST /v1/feed/...`)."""
        return self.ender.watcher.hub

    # --- delegate_task -----------------------------------------------------------------------

    async def _parent(self, caller: Caller) -> tuple[c.Thread, c.Run]:
        if caller.thread_id is None or caller.run_id is None:
            raise ParentNotActive(
                "Delegated tasks require a live run of the calling thread (an agent's run)."
            )
        run = await threads.get_run(self.db, caller.run_id)
        if not is_live(run.status):
            raise ParentNotActive("The calling run has ended; delegated tasks need a live run.")
        return await threads.get_thread(self.db, caller.thread_id), run

    async def delegate(self, caller: Caller, req: c.DelegateTask, *, polled: bool = False) -> c.TaskInfo:
        """`polled`: the caller follows the task itself (an MCP Tasks client polls its handle), so
        the parent is woken only if its run ends before the task does (`settled_only`), and the
        call never waits."""
        parent, run = await self._parent(caller)
        # Explicit modes are checked against the parent; they can only narrow.
        resolve_modes(
            ModeCap(parent.runtime_mode, parent.interaction_mode), req.runtime_mode, req.interaction_mode
        )
        target = req.target or c.DelegateTarget()
        key = req.client_request_id or uuid.uuid4().hex
        placed, placed_key = None, f"task:{caller.namespace}:{key}"
        if target.environment_id == "auto" and self.ops.placement is not None:
            # Placed first (peerd/placement/), the choice kept under the task's key: a retry of
            # this call reaches the same task, wherever the first try chose.
            project = await projects.get(self.db, parent.project_id)
            provider_asked = target.provider or parent.provider
            placed = await self.ops.placement.for_project(
                project, provider_asked, req.runtime_mode, via_link=caller.link is not None, key=placed_key
            )
            there = placed.environment_id
            target = target.model_copy(
                update={"environment_id": there, "project_id": None if there is None else placed.project_id}
            )
        env = await self.ops.remote_target(caller, target.environment_id)
        digest = request_hash(
            # How long to wait is not part of what is asked: a retry may wait differently.
            "delegate_task",
            req.model_dump(mode="json", exclude={"client_request_id", "mode", "timeout_ms"}),
        )
        provider = target.provider or parent.provider
        wake: Any = "settled_only" if req.mode == "wait" or polled else "always"
        common = {
            "parent_thread_id": parent.id,
            "parent_run_id": run.id,
            "namespace": caller.namespace,
            "request_key": key,
            "request_hash": digest,
            "title": req.title or parent.title,
            "prompt": role_prompt(req.role, req.task),
            "provider": provider,
            "wake": wake,
            "budget": None if req.budget is None else req.budget.model_dump_json(),
        }
        if env is None:
            if target.project_id and target.project_id != parent.project_id:
                raise InvalidRequest(
                    "A local task runs in this thread's project. Omit target.projectId, or pass "
                    "target.environmentId to run it in that environment's project."
                )
            new = NewTask(
                **common,
                target_env=None,
                target_label=None,
                project_id=parent.project_id,
                model=target.model or (parent.model if provider == parent.provider else None),
                runtime_mode=req.runtime_mode or parent.runtime_mode,
                interaction_mode=req.interaction_mode or parent.interaction_mode,
            )
            task, _ = await tasks.record(self.db, new, now=self.clock())
            if task.child_thread_id is None and not task.terminal:
                task = await self._launch_local(task)
        else:
            if provider != parent.provider and target.model is None:
                raise TargetRequired(
                    f"Pass target.model: provider {provider} there does not share this thread's model."
                )
            link = await links.get(self.db, env)
            new = NewTask(
                **common,
                target_env=env,
                target_label=link.label if link else env,
                project_id=target.project_id or await self._match_project(caller, env, parent),
                model=target.model or parent.model,
                # Omitted modes are not sent: the box applies the link's cap (narrowed by ours).
                runtime_mode=req.runtime_mode,
                interaction_mode=req.interaction_mode,
            )
            task, _ = await tasks.record(self.db, new, now=self.clock())
            if task.child_thread_id is None and not task.terminal:
                task = await self.launch_remote(task, raise_terminal=True)
            await self._events.publish(RemoteTaskChanged(env, task.id))
        if placed is not None and self.ops.placement is not None:
            await self.ops.placement.kept(placed_key, placed, task_id=task.id)
        if req.mode == "wait" and not polled:
            info = await self._wait(task.id, _seconds(req.timeout_ms))
        else:
            info = task.info()
        return info if placed is None else info.model_copy(update={"placement": placed.reason})

    async def _launch_local(self, task: TaskRow) -> TaskRow:
        launch = _launch_of(task)
        try:
            # The child is launched as its parent's starter: a link's run delegates as that link
            # (its cap, fence, providers, no in-place), so the child is the link's thread too.
            parent = await threads.get_thread(self.db, task.parent_thread_id)
            caller = Caller(namespace="delegate", started_by=f"task:{parent.id}")
            if parent.link_origin is not None:
                of_parent = await self.ops.caller_for_thread(parent, run_id=None, namespace="delegate")
                caller = Caller(namespace="delegate", link=of_parent.link, started_by=f"task:{parent.id}")
            launched = await self.ops.thread_launch(caller, launch)
        except PeerdError as exc:
            # The caller hears this failure from its own call (or a retry): no wake run on top.
            message = f"The child thread could not start: {exc.message}"
            return await self.end(task.id, "failed", message, wake=False) or task
        return await tasks.attach(
            self.db,
            task.id,
            child_thread_id=launched.thread_id,
            child_run_id=launched.run_id,
            now=self.clock(),
        )

    async def launch_remote(
        self, task: TaskRow, *, raise_terminal: bool = False, for_follower: bool = False
    ) -> TaskRow:
        """Send (or re-send: the key makes it the same launch) the task's launch to the box.

        A transient failure keeps the task pending for the follower, or, when the follower sends
        it (`for_follower`), is raised to it, which backs off; so is a failure of the whole link,
        and the follower ends all of the link's tasks at once."""
        parent = await threads.get_thread(self.db, task.parent_thread_id)
        lineage = c.DelegatedFrom(environment_id=self.env_id, thread_id=parent.id, title=parent.title)
        body = Forwarder.launch_body(_launch_of(task, lineage), namespace=task.namespace)
        env = task.target_env or ""
        try:
            data = await self.forwarder.call(
                env,
                "POST",
                "/v1/threads",
                body=body,
                caller_modes=(parent.runtime_mode, parent.interaction_mode),
            )
        except PeerdError as exc:
            kind = classify(exc.code)
            if for_follower and kind in ("transient", "link"):
                raise
            if kind == "transient":
                await tasks.set_error(self.db, task.id, exc.message, now=self.clock())
                return await tasks.get(self.db, task.id)  # pending: the follower re-sends it
            # Refused for good: nothing runs there, so an owed stop has nothing left to stop.
            if task.stop_owed:
                await tasks.set_stop(self.db, task.id, owed=False, reason=None, now=self.clock())
            ended = await self.end(task.id, "failed", exc.message, wake=not raise_terminal)
            if raise_terminal:
                raise
            return ended or task
        launched = c.ThreadLaunchResult.model_validate(data)
        attached = await tasks.attach(
            self.db,
            task.id,
            child_thread_id=launched.thread_id,
            child_run_id=launched.run_id,
            now=self.clock(),
        )
        self.feed.changed(task.parent_thread_id)  # the attach is an event of the parent thread
        return attached

    async def _match_project(self, caller: Caller, env: str, parent: c.Thread) -> str:
        """The one project there with this thread's repository identity (paging through them all)."""
        project = await projects.get(self.db, parent.project_id)
        key = await git.repository_key(Path(project.path))
        if key is None:
            raise TargetRequired(
                "Pass target.projectId: this thread's project has no repository to match there."
            )
        matches: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.ops.project_list(caller, c.ProjectList(environment_id=env, cursor=cursor))
            matches.extend(p.id for p in page.items if p.repository_key == key)
            cursor = page.next_cursor
            if cursor is None:
                break
        if not matches:
            raise InvalidRequest(
                f"No project there has this repository ({key}). Pass target.projectId; "
                "project_list with this environmentId lists them."
            )
        if len(matches) > 1:
            raise InvalidRequest(
                f"Several projects there have this repository: {', '.join(matches)}. Pass target.projectId."
            )
        return matches[0]

    # --- task_status, task_cancel --------------------------------------------------------------

    async def _owned(self, caller: Caller, task_id: str) -> TaskRow:
        if caller.link is None and caller.thread_id is None and shortid.is_short(task_id, "tsk"):
            found = await ids.starting(self.db, "tasks", task_id, limit=shortid.AMBIGUOUS_SHOWN + 1)
            task_id = shortid.chosen(task_id, found, "task")  # the owner's: a unique start is enough
        try:
            task = await tasks.get(self.db, task_id)
        except NotFound:
            raise TaskNotFound(f"Delegated task {task_id} was not found.") from None
        if caller.thread_id is not None and task.parent_thread_id != caller.thread_id:
            raise TaskNotFound(f"Delegated task {task_id} does not belong to thread {caller.thread_id}.")
        if caller.thread_id is None and caller.link is not None:
            # A signed-in agent (no run of its own): only tasks of threads it started.
            parent = await threads.get_thread(self.db, task.parent_thread_id)
            if parent.link_origin != caller.link.client_id:
                raise TaskNotFound(f"Delegated task {task_id} was not found.")
        return task

    async def status(self, caller: Caller, req: c.TaskStatusRead) -> c.TaskInfo:
        task = await self._owned(caller, req.task_id)
        if req.wait and not task.terminal:
            info = await self._wait(task.id, _seconds(req.timeout_ms))
        else:
            info = task.info()
        if task.target_env is None:
            usage = wire_usage(await task_usage(self.db, info.child_thread_id))
        else:  # as its box sent it with the result
            usage = wire_usage(await remote_task_usage(self.db, task.id))
        placed = None if self.ops.placement is None else await self.ops.placement.reason_for_task(task.id)
        return info.model_copy(
            update={"usage": usage, "awaiting_approval": await self._awaiting(task), "placement": placed}
        )

    async def _awaiting(self, task: TaskRow) -> c.TaskApproval | None:
        """What the child waits for a person to approve, here or on its box (as the feed brought it)."""
        if task.terminal or task.child_thread_id is None:
            return None
        if task.target_env is None:
            found = await approvals_store.waiting_on_thread(self.db, task.child_thread_id)
            return None if found is None else c.TaskApproval(approval_id=found.id, summary=found.summary)
        body = await approvals_store.mirrored_on_thread(self.db, task.target_env, task.child_thread_id)
        if body is None:
            return None
        return c.TaskApproval(
            approval_id=str(body["id"]), summary=str(body["summary"]), environment_id=task.target_env
        )

    async def _wait(self, task_id: str, seconds: float) -> c.TaskInfo:
        """Until the task ends, or return `waitTimedOut` before the caller's own tool-call limit and
        switch the task to wake the parent later, so a waiting agent never re-dispatches it."""
        deadline = self.feed.deadline(min(seconds, WAIT_CAP_S))
        parent_thread_id = (await tasks.get(self.db, task_id)).parent_thread_id
        while True:
            changed = self.feed.watch(parent_thread_id)  # task changes are events of the parent thread
            task = await tasks.get(self.db, task_id)
            if task.terminal:
                return task.info(wait_timed_out=False)
            remaining = self.feed.remaining(deadline)
            if remaining <= 0 or self.feed.closed:
                await tasks.set_wake(self.db, task_id, "always", now=self.clock())
                task = await tasks.get(self.db, task_id)
                # It may have ended just now, unwoken (the wait was there to take it): hand it over.
                return task.info(wait_timed_out=not task.terminal)
            try:
                await self.feed.wait(changed, remaining)
            except asyncio.CancelledError:
                # The waiting call went away (client timeout): the result must still reach the parent.
                await asyncio.shield(tasks.set_wake(self.db, task_id, "always", now=self.clock()))
                raise

    async def cancel(self, caller: Caller, req: c.TaskCancel) -> c.TaskInfo:
        task = await self._owned(caller, req.task_id)
        return await self.stop_task(task, "cancelled", cancel_result(req.reason), req.reason)

    async def stop_task(
        self,
        task: TaskRow,
        status: c.TaskStatus,
        result: str,
        reason: str | None,
        *,
        deliver_now: bool = True,
    ) -> c.TaskInfo:
        """Stop the child (there: the stop is recorded as owed first) and end the task with `result`.

        `deliver_now=False` leaves delivery to the follower, so a Stop never waits on a far box."""
        if task.target_env is None:
            if task.child_thread_id is not None:
                # Through the operation, so the child's own delegations are stopped too (on_stop).
                stop = c.ThreadInterrupt(stop=True, reason=reason or result)
                await self.ops.thread_interrupt(Caller.local(), task.child_thread_id, stop)
            await self.end(task.id, status, result)
            return (await tasks.get(self.db, task.id)).info()
        # Recorded as owed before the stop leaves: a crash or an unreachable box cannot lose it.
        await tasks.set_stop(self.db, task.id, owed=True, reason=reason or result, now=self.clock())
        delivered = deliver_now and await self.deliver_stop(await tasks.get(self.db, task.id))
        label = task.target_label or task.target_env
        if not delivered and deliver_now:
            result = (
                f"{result.rstrip('.')}. It could not be stopped in {label} yet and may still run there; "
                "the stop is retried."
            )
        refused = (await tasks.get(self.db, task.id)).last_error
        if delivered and refused and refused.startswith(STOP_REFUSED):
            why = refused[len(STOP_REFUSED) :]
            result = (
                f"{result.rstrip('.')}. It could not be stopped in {label} and may still run there: {why}"
            )
        await self.end(task.id, status, result)
        # Delivered or not, the follower re-reads this task.
        await self._events.publish(RemoteTaskChanged(task.target_env, task.id))
        return (await tasks.get(self.db, task.id)).info()

    async def deliver_stop(self, task: TaskRow, *, for_follower: bool = False) -> bool:
        """Send an owed stop. True once it landed or was refused for good (nothing left to stop).
        Sent by the follower, transient and link-wide failures are raised to it."""
        if task.child_thread_id is None:
            return False  # the follower re-sends the launch first to learn the thread there
        try:
            await self.forwarder.call(
                task.target_env or "",
                "POST",
                f"/v1/threads/{path_segment(task.child_thread_id)}/interrupt",
                body={"stop": True, "reason": task.stop_reason or "Stopped."},
            )
        except PeerdError as exc:
            kind = classify(exc.code)
            if for_follower and kind in ("transient", "link"):
                raise
            if kind == "transient":
                await tasks.set_error(
                    self.db, task.id, f"The stop could not be delivered yet: {exc.message}", now=self.clock()
                )
                return False
            log.warning("task.stop_refused", task_id=task.id, code=exc.code)
            await tasks.set_error(self.db, task.id, STOP_REFUSED + exc.message, now=self.clock())
        await tasks.set_stop(self.db, task.id, owed=False, reason=None, now=self.clock())
        return True

    async def stop_children(self, parent_thread_id: str, reason: str | None) -> None:
        """The parent's Stop stops every task it delegated, here and there."""
        for task in await tasks.for_parent(self.db, parent_thread_id):
            if not task.terminal:
                why = stopped_with_parent(reason)
                await self.stop_task(task, "interrupted", why, why, deliver_now=False)

    # --- how tasks end (`peerd.tasks.ending`), the box's watch (`peerd.tasks.watch`) ---------------

    async def end(
        self, task_id: str, status: c.TaskStatus, result: str, *, wake: bool = True
    ) -> TaskRow | None:
        """End the task (first result wins) and start the parent's wake run, if one was made."""
        return await self.ender.end(task_id, status, result, wake=wake)

    async def on_run_end(self, thread_id: str) -> None:
        """A run here ended: local tasks whose child thread this is may now be settled."""
        await self.ender.on_run_end(thread_id)

    async def watch(self, caller: Caller, req: c.RunWatch) -> c.RunWatchResult:
        return await self.ender.watcher.watch(caller, req)

    async def recover(self) -> None:
        """At start-up: local tasks whose child ended while the daemon was down end now."""
        for task in await tasks.open_local(self.db):
            if task.child_thread_id is None:
                await self._launch_local(task)
            else:
                await self.on_run_end(task.child_thread_id)


__all__ = ["Delegation", "TargetRequired", "TaskNotFound"]
