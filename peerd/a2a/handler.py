"""The a2a-sdk's `RequestHandler` over peerd's operations: every A2A method, for one caller.

The caller (`peerd.operations.Caller`) is decided by the listener before the SDK sees a byte (a
link's token on the network listener, the owner on the owner socket) and reaches here in the
`ServerCallContext`'s state (`CALLER_STATE`). Every effect goes through `Operations` as that
caller, so a link's access level, cap and fence apply exactly as on `/v1/threads`. Reads are fenced
here too: a link sees only the tasks of threads it started (another's answers `TaskNotFound`, so
it learns nothing of them); the owner sees every task.

A task is one run; its `contextId` is the run's thread (peerd/a2a/mapping.py). A task whose run is
on a linked box (an `auto` launch placed there, or a message to such a context) is followed there
(`peerd/a2a/remote.py`) and served from what was last seen of it. Failures are peerd's typed
errors, turned into A2A errors by class (`a2a_error`), never by their text.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import (
    AgentCard,
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
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
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
from peerd.a2a import listing, mapping, store
from peerd.a2a.push import PushService
from peerd.a2a.remote import RemoteTasks
from peerd.a2a.store import Remote
from peerd.a2a.view import ENDED, SETTLED, remote_task, task_of
from peerd.core.runs import is_terminal
from peerd.errors import InvalidRequest, NotFound, PeerdError
from peerd.operations import Caller, Operations
from peerd.store import projects, threads

log = structlog.get_logger(__name__)

CALLER_STATE = "peerd.caller"
BASE_STATE = "peerd.base"  # the scheme and host the caller reached (the card's interface URLs)
STREAM_CHUNK_S = 25.0  # one wait on the change feed; a stream is a loop of them
BLOCK_S = 45.0  # a blocking SendMessage answers within this (no request waits over 50 s on the wire)
GIVEN_UP_KEY = "peerdPushesGivenUp"  # GetTask's metadata: the task's push notifications given up


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


@dataclass(frozen=True)
class Here:
    """A task whose run is on this machine."""

    run: c.Run
    thread: c.Thread


Found = Here | Remote  # a task here, or one followed on a linked box


def _key(found: Found) -> str:
    """What the change feed is poked under when the task changes: its thread (here or there)."""
    return found.run.thread_id if isinstance(found, Here) else found.thread_id or ""


def _id(found: Found) -> str:
    return found.run.id if isinstance(found, Here) else found.task_id or ""


def _sees(caller: Caller, row: Remote) -> bool:
    """A task on a box is its caller's (the owner sees every one)."""
    return caller.link is None or row.namespace == caller.namespace


class PeerdRequestHandler(RequestHandler):
    def __init__(
        self,
        ops: Operations,
        push: PushService,
        extended_card: Callable[[Caller, str], Awaitable[AgentCard]],
        remote: RemoteTasks,
    ) -> None:
        self.ops = ops
        self.push = push
        self.remote = remote
        self._extended_card = extended_card

    # --- reading a task -------------------------------------------------------------------------

    async def _find(self, caller: Caller, task_id: str) -> Found:
        """The task an id names, here or followed on a box, if this caller may see it."""
        try:
            run = await threads.get_run(self.ops.db, task_id)
            thread = await threads.get_thread(self.ops.db, run.thread_id)
        except NotFound:
            row = await store.remote_by_task(self.ops.db, task_id)
            if row is not None and _sees(caller, row):
                return row
            raise TaskNotFoundError(f"No task {task_id} here.") from None
        if caller.link is not None and thread.link_origin != caller.link.client_id:
            raise TaskNotFoundError(f"No task {task_id} here.")  # another's: not even its existence
        return Here(run, thread)

    async def _thread_of(self, caller: Caller, thread_id: str) -> c.Thread | Remote:
        """The thread a contextId names (here, or one followed on a box), if this caller may see it."""
        try:
            thread = await threads.get_thread(self.ops.db, thread_id)
        except NotFound:
            row = await store.remote_in_thread(self.ops.db, thread_id)
            if row is not None and _sees(caller, row):
                return row
            raise TaskNotFoundError(f"No context {thread_id} here.") from None
        if caller.link is not None and thread.link_origin != caller.link.client_id:
            raise TaskNotFoundError(f"No context {thread_id} here.")
        return thread

    async def current(self, found: Found) -> Task:
        """The task as it is now: read here, or as last seen on its box."""
        if isinstance(found, Here):
            return await task_of(self.ops, await threads.get_run(self.ops.db, found.run.id))
        row = await store.remote_get(self.ops.db, found.key)
        return remote_task(row or found)

    # --- the methods ----------------------------------------------------------------------------

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        found = await self._find(caller_of(context), params.id)
        task = await self.current(found)
        given_up = await self.push.given_up_for(_id(found))
        if given_up:  # the client learns here what its webhook missed, and why
            task.metadata.update({GIVEN_UP_KEY: given_up})
        return task

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        try:
            return await listing.list_tasks(self.ops, caller_of(context), params)
        except PeerdError as err:
            raise a2a_error(err) from None

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        caller = caller_of(context)
        found = await self._find(caller, params.id)
        if isinstance(found, Remote):
            if found.ended_at is not None:
                raise TaskNotCancelableError(f"Task {params.id} has ended ({found.state}).")
            task: Task = await self._call(self.remote.cancel(found))
            return task
        run, thread = found.run, found.thread
        if is_terminal(run.status):
            raise TaskNotCancelableError(f"Task {run.id} has ended ({run.status}).")
        # Not a Stop: only this task ends (live: interrupted; queued behind another run: cancelled,
        # it never starts); the thread takes follow-up messages as before.
        await self._call(
            self.ops.thread_interrupt(
                caller, thread.id, c.ThreadInterrupt(stop=False, reason="A2A CancelTask", run_id=run.id)
            )
        )
        return await self.current(found)

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        caller = caller_of(context)
        config = params.configuration.task_push_notification_config
        wants_push = params.configuration.HasField("task_push_notification_config")
        if wants_push:  # a refused webhook refuses the message before anything starts
            await self._call(self.push.check(config.url))
        found = await self._send(caller, params)
        if wants_push:
            await self._call(self.push.create(caller, _id(found), _key(found), config))
        if params.configuration.return_immediately:
            return await self.current(found)
        return await self._settled(found)

    async def _settled(self, found: Found) -> Task:
        """Blocking SendMessage: the task once it ended or waits for input, or as it is after
        `BLOCK_S` (a bounded wait; the client follows it with GetTask or a subscription)."""
        feed = self.ops.feed
        deadline = feed.deadline(BLOCK_S)
        while True:
            changed = feed.watch(_key(found))
            task = await self.current(found)
            if task.status.state in SETTLED or feed.closed or feed.remaining(deadline) <= 0:
                return task
            await feed.wait(changed, feed.remaining(deadline))

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        found = await self._send(caller_of(context), params)
        async for event in self._follow(found):
            yield event

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        found = await self._find(caller_of(context), params.id)
        async for event in self._follow(found):
            yield event

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        caller = caller_of(context)
        found = await self._find(caller, params.task_id)
        created: TaskPushNotificationConfig = await self._call(
            self.push.create(caller, _id(found), _key(found), params)
        )
        return created

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        await self._find(caller_of(context), params.task_id)
        found = await self.push.get(params.task_id, params.id)
        if found is None:
            raise TaskNotFoundError(f"No push notification config {params.id} on task {params.task_id}.")
        return found

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        await self._find(caller_of(context), params.task_id)
        return ListTaskPushNotificationConfigsResponse(configs=await self.push.list_configs(params.task_id))

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self._find(caller_of(context), params.task_id)
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

    async def _send(self, caller: Caller, params: SendMessageRequest) -> Found:
        """Launch a thread (no contextId) or send to one (contextId = the thread, here or on a
        box); the message id is the idempotency key, so a retry reaches the same run."""
        message = params.message
        try:
            key = mapping.client_request_id(message.message_id)
            prompt = mapping.prompt_of([part.text for part in message.parts if part.HasField("text")])
        except PeerdError as err:
            raise a2a_error(err) from None
        meta = dict(params.metadata.items()) | dict(message.metadata.items())
        if message.context_id:
            context = await self._thread_of(caller, message.context_id)  # another's thread: not found
            send = c.ThreadSend(text=prompt, client_request_id=key)
            if isinstance(context, Remote):
                row: Remote = await self._call(self.remote.send(caller, context, send))
                return row
            sent = await self._call(self.ops.thread_send(caller, context.id, send))
            return await self._here(sent.run_id)
        project_id = meta.get("projectId") or await self._only_project()
        launch: dict[str, Any] = {"project_id": project_id, "prompt": prompt, "client_request_id": key}
        if meta.get("environmentId") not in (None, "auto"):
            raise InvalidParamsError('environmentId may only be "auto" here (a placed launch).')
        for wire, field in (
            ("provider", "provider"),
            ("model", "model"),
            ("environmentId", "environment_id"),
            ("runtimeMode", "runtime_mode"),
            ("interactionMode", "interaction_mode"),
        ):
            if isinstance(meta.get(wire), str):
                launch[field] = meta[wire]
        try:
            req = c.ThreadLaunch.model_validate(launch)
        except ValueError:
            raise InvalidParamsError("The message's metadata does not make a launch.") from None
        placement = self.ops.placement
        if req.environment_id != "auto" or placement is None:
            launched = await self._call(self.ops.thread_launch(caller, req))
            return await self._here(launched.run_id)
        # Placed first (the choice kept under the message's key: a retry goes the same way); on a
        # linked box, the task follows its run there.
        placed = await self._call(self.ops.place(caller, req, placement))
        if placed.req.environment_id is None:
            launched = await self._call(self.ops.launch_placed(caller, placed))
            return await self._here(launched.run_id)
        there: Remote = await self._call(self.remote.launch(caller, placed))
        return there

    async def _here(self, run_id: str) -> Here:
        run = await threads.get_run(self.ops.db, run_id)
        return Here(run, await threads.get_thread(self.ops.db, run.thread_id))

    async def _only_project(self) -> str:
        listed = (await projects.page(self.ops.db, cursor=None, limit=2)).items
        if len(listed) != 1:
            raise InvalidParamsError(
                "Name the project in the message's metadata (projectId; the extended agent card lists them)."
            )
        return listed[0].id

    async def _follow(self, found: Found) -> AsyncGenerator[Event]:
        """The task, then a status update at each change of its state, until it ends."""
        feed = self.ops.feed
        sent = None
        while True:
            changed = feed.watch(_key(found))
            task = await self.current(found)
            if sent is None:
                yield task
            elif task.status.state != sent:
                yield TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)
            sent = task.status.state
            if task.status.state in ENDED or feed.closed:
                return
            await feed.wait(changed, STREAM_CHUNK_S)
