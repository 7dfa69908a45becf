"""The a2a-sdk's `RequestHandler` over peerd's operations: every A2A method, for one caller.

The caller (`peerd.operations.Caller`) is decided by the listener before the SDK sees a byte (a
link's token on the network listener, the owner on the owner socket) and reaches here in the
`ServerCallContext`'s state (`CALLER_STATE`). Every effect goes through `Operations` as that
caller, so a link's access level, cap and fence apply exactly as on `/v1/threads`. Reads are fenced
here too: a link sees only the tasks of threads it started (another's answers `TaskNotFound`, so
it learns nothing of them); the owner sees every task.

A task is one run; its `contextId` is the run's thread (peerd/a2a/mapping.py). Failures are peerd's
typed errors, turned into A2A errors by class (`a2a_error`), never by their text.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
)

from peerd import contracts as c
from peerd.a2a import mapping
from peerd.a2a.push import PushService
from peerd.approvals import store as approvals_store
from peerd.core.runs import is_terminal
from peerd.errors import InvalidRequest, NotFound, PeerdError
from peerd.operations import Caller, Operations
from peerd.store import projects, threads

log = structlog.get_logger(__name__)

CALLER_STATE = "peerd.caller"
BASE_STATE = "peerd.base"  # the scheme and host the caller reached (the card's interface URLs)
STREAM_CHUNK_S = 25.0  # one wait on the change feed; a stream is a loop of them
BLOCK_S = 45.0  # a blocking SendMessage answers within this (no request waits over 50 s on the wire)

STATES: dict[mapping.A2AState, TaskState] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}


SETTLED = frozenset({STATES["completed"], STATES["failed"], STATES["canceled"], STATES["input-required"]})


def a2a_error(err: PeerdError) -> A2AError:
    """peerd's typed error as the A2A error a client understands; peerd's code rides in `data`."""
    data = {"peerdCode": err.code}
    if isinstance(err, NotFound):
        return TaskNotFoundError(err.message, data=data)
    if isinstance(err, InvalidRequest):
        return InvalidParamsError(err.message, data=data)
    return InvalidRequestError(err.message, data=data)  # denied, conflicting, unavailable


def caller_of(context: ServerCallContext) -> Caller:
    caller = context.state.get(CALLER_STATE)
    if not isinstance(caller, Caller):  # the shell always sets it; without it nothing is served
        raise InvalidRequestError("This request has no authenticated caller.")
    return caller


def _timestamp(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


class PeerdRequestHandler(RequestHandler):
    def __init__(
        self, ops: Operations, push: PushService, extended_card: Callable[[Caller, str], Awaitable[AgentCard]]
    ) -> None:
        self.ops = ops
        self.push = push
        self._extended_card = extended_card

    # --- reading a task -------------------------------------------------------------------------

    async def _run_of(self, caller: Caller, task_id: str) -> tuple[c.Run, c.Thread]:
        """The run a task id names and its thread, if this caller may see it."""
        try:
            run = await threads.get_run(self.ops.db, task_id)
            thread = await threads.get_thread(self.ops.db, run.thread_id)
        except NotFound:
            raise TaskNotFoundError(f"No task {task_id} here.") from None
        if caller.link is not None and thread.link_origin != caller.link.client_id:
            raise TaskNotFoundError(f"No task {task_id} here.")  # another's: not even its existence
        return run, thread

    async def _thread_of(self, caller: Caller, thread_id: str) -> c.Thread:
        """The thread a contextId names, if this caller may see it."""
        try:
            thread = await threads.get_thread(self.ops.db, thread_id)
        except NotFound:
            raise TaskNotFoundError(f"No context {thread_id} here.") from None
        if caller.link is not None and thread.link_origin != caller.link.client_id:
            raise TaskNotFoundError(f"No context {thread_id} here.")
        return thread

    async def task(self, run: c.Run) -> Task:
        """The A2A task a run is, with its final answer as an artifact once it ended."""
        return await task_of(self.ops, run)

    # --- the methods ----------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        run, _ = await self._run_of(caller_of(context), params.id)
        return await self.task(run)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        caller = caller_of(context)
        listed = await self._call(
            self.ops.thread_list(
                caller, c.ThreadList(project_id=None, limit=min(params.page_size or 50, 100))
            )
        )
        tasks = []
        for thread in listed.items:
            if caller.link is not None and thread.link_origin != caller.link.client_id:
                continue
            if params.context_id and thread.id != params.context_id:
                continue
            run = await threads.latest_run(self.ops.db, thread.id)
            if run is not None:
                tasks.append(await self.task(run))
        return ListTasksResponse(tasks=tasks, page_size=len(tasks), total_size=len(tasks))

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        caller = caller_of(context)
        run, thread = await self._run_of(caller, params.id)
        if is_terminal(run.status):
            raise TaskNotCancelableError(f"Task {run.id} has ended ({run.status}).")
        # Not a Stop: only this task ends (live: interrupted; queued behind another run: cancelled,
        # it never starts); the thread takes follow-up messages as before.
        await self._call(
            self.ops.thread_interrupt(
                caller, thread.id, c.ThreadInterrupt(stop=False, reason="A2A CancelTask", run_id=run.id)
            )
        )
        return await self.task(await threads.get_run(self.ops.db, run.id))

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        caller = caller_of(context)
        config = params.configuration.task_push_notification_config
        wants_push = params.configuration.HasField("task_push_notification_config")
        if wants_push:  # a refused webhook refuses the message before anything starts
            await self._call(self.push.check(config.url))
        run = await self._send(caller, params)
        if wants_push:
            await self._call(self.push.create(caller, run, config))
        if params.configuration.return_immediately:
            return await self.task(run)
        return await self._settled(run)

    async def _settled(self, run: c.Run) -> Task:
        """Blocking SendMessage: the task once it ended or waits for input, or as it is after
        `BLOCK_S` (a bounded wait; the client follows it with GetTask or a subscription)."""
        feed = self.ops.feed
        deadline = feed.deadline(BLOCK_S)
        while True:
            changed = feed.watch(run.thread_id)
            task = await self.task(await threads.get_run(self.ops.db, run.id))
            if task.status.state in SETTLED or feed.closed or feed.remaining(deadline) <= 0:
                return task
            await feed.wait(changed, feed.remaining(deadline))

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = caller_of(context)
        run = await self._send(caller, params)
        async for event in self._follow(run, first=True):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        run, _ = await self._run_of(caller_of(context), params.id)
        async for event in self._follow(run, first=True):
            yield event

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        caller = caller_of(context)
        run, _ = await self._run_of(caller, params.task_id)
        created: TaskPushNotificationConfig = await self._call(self.push.create(caller, run, params))
        return created

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        await self._run_of(caller_of(context), params.task_id)
        found = await self.push.get(params.task_id, params.id)
        if found is None:
            raise TaskNotFoundError(f"No push notification config {params.id} on task {params.task_id}.")
        return found

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        await self._run_of(caller_of(context), params.task_id)
        return ListTaskPushNotificationConfigsResponse(configs=await self.push.list_configs(params.task_id))

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self._run_of(caller_of(context), params.task_id)
        await self.push.delete(params.task_id, params.id)

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        card: AgentCard = await self._extended_card(
            caller_of(context), str(context.state.get(BASE_STATE, "https://localhost"))
        )
        return card

    # --- helpers --------------------------------------------------------------------------------

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except PeerdError as err:
            raise a2a_error(err) from None

    async def _send(self, caller: Caller, params: SendMessageRequest) -> c.Run:
        """Launch a thread (no contextId) or send to one (contextId = the thread); the message id
        is the idempotency key, so a retry reaches the same run."""
        message = params.message
        try:
            key = mapping.client_request_id(message.message_id)
            prompt = mapping.prompt_of([part.text for part in message.parts if part.HasField("text")])
        except PeerdError as err:
            raise a2a_error(err) from None
        meta = dict(params.metadata.items()) | dict(message.metadata.items())
        if message.context_id:
            await self._thread_of(caller, message.context_id)  # another's thread: not found
            sent = await self._call(
                self.ops.thread_send(
                    caller, message.context_id, c.ThreadSend(text=prompt, client_request_id=key)
                )
            )
            return await threads.get_run(self.ops.db, sent.run_id)
        project_id = meta.get("projectId") or await self._only_project()
        launch: dict[str, Any] = {"project_id": project_id, "prompt": prompt, "client_request_id": key}
        if meta.get("environmentId") not in (None, "auto"):
            raise InvalidParamsError('environmentId may only be "auto" here (a placed launch).')
        for wire, field in (
            ("provider", "provider"),
            ("model", "model"),
            ("environmentId", "environment_id"),
        ):
            if isinstance(meta.get(wire), str):
                launch[field] = meta[wire]
        for wire, field in (("runtimeMode", "runtime_mode"), ("interactionMode", "interaction_mode")):
            if isinstance(meta.get(wire), str):
                launch[field] = meta[wire]
        try:
            req = c.ThreadLaunch.model_validate(launch)
        except ValueError:
            raise InvalidParamsError("The message's metadata does not make a launch.") from None
        launched = await self._call(self.ops.thread_launch(caller, req))
        if launched.placement is not None and launched.placement.environment_id is not None:
            raise InvalidParamsError(
                "peerd placed this launch on another environment; its A2A task is followed there "
                f"(thread {launched.thread_id}, run {launched.run_id})."
            )
        return await threads.get_run(self.ops.db, launched.run_id)

    async def _only_project(self) -> str:
        listed = (await projects.page(self.ops.db, cursor=None, limit=2)).items
        if len(listed) != 1:
            raise InvalidParamsError(
                "Name the project in the message's metadata (projectId; the extended agent card lists them)."
            )
        return listed[0].id

    async def _follow(self, run: c.Run, *, first: bool) -> AsyncGenerator[Event]:
        """The task, then a status update at each change of its state, until it ends."""
        feed = self.ops.feed
        sent: TaskState | None = None
        while True:
            changed = feed.watch(run.thread_id)
            current = await threads.get_run(self.ops.db, run.id)
            task = await self.task(current)
            if first:
                first = False
                sent = task.status.state
                yield task
            elif task.status.state != sent:
                sent = task.status.state
                yield TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)
            if is_terminal(current.status) or feed.closed:
                return
            await feed.wait(changed, STREAM_CHUNK_S)


async def task_of(ops: Operations, run: c.Run) -> Task:
    """The A2A task a run is (also what a push carries)."""
    approval = None
    if not is_terminal(run.status):
        approval = await approvals_store.waiting_on_thread(ops.db, run.thread_id)
    state = mapping.task_state(run.status, approval_waiting=approval is not None)
    status = TaskStatus(state=STATES[state])
    if approval is not None and state == "input-required":
        text = f"Waiting for a person to approve {approval.id}: {approval.summary}"
        status.message.CopyFrom(
            Message(message_id=f"{run.id}-{approval.id}", role=Role.ROLE_AGENT, parts=[Part(text=text)])
        )
    stamp = _timestamp(run.ended_at or run.started_at or run.created_at)
    if stamp is not None:
        status.timestamp.FromDatetime(stamp)
    task = Task(id=run.id, context_id=run.thread_id, status=status)
    if is_terminal(run.status):
        answer = await _answer(ops, run)
        if answer:
            task.artifacts.append(
                Artifact(artifact_id=f"{run.id}-answer", name="answer", parts=[Part(text=answer)])
            )
        if run.reason and state != "completed":
            status.message.CopyFrom(
                Message(message_id=f"{run.id}-status", role=Role.ROLE_AGENT, parts=[Part(text=run.reason)])
            )
    return task


async def _answer(ops: Operations, run: c.Run) -> str:
    """The run's last assistant message (its first 20,000 characters)."""
    rows = await threads.read_items(ops.db, run.thread_id, after_position=None, limit=200, run_id=run.id)
    text = ""
    for row in rows:
        item = threads.item_from_row(row, max_chars=20_000)
        if item.kind == "assistant_message":
            text = item.text
    return text
