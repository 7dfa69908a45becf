"""Agent tools over HTTP: `POST /v1/tools/{name}` with the run token of the calling run.

The token binds the call to one thread and one live run: the caller's identity is that run, never
a claim in the body. A token of an ended run is refused with `parent_not_active`. The MCP server
(`peerd mcp`) is a thin proxy onto these same endpoints.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from peerd import contracts as c
from peerd.api.app import OPERATIONS, json_object, ok
from peerd.core.runs import is_live
from peerd.errors import CapabilityDenied, InvalidRequest, NotFound, ParentNotActive
from peerd.operations import Caller, Operations

if TYPE_CHECKING:
    from peerd.delegation import Delegation
from peerd.runtime.runner import token_hash
from peerd.store import threads


class ToolThreadRef(c.Input):
    thread_id: str


def _split(args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ref = ToolThreadRef.model_validate({k: v for k, v in args.items() if k in ("threadId", "thread_id")})
    return ref.thread_id, {k: v for k, v in args.items() if k not in ("threadId", "thread_id")}


async def _project_list(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    return await ops.project_list(caller, c.ProjectList.model_validate(args))


async def _thread_launch(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    return await ops.thread_launch(caller, c.ThreadLaunch.model_validate(args))


async def _thread_read(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    thread_id, rest = _split(args)
    return await ops.thread_read(caller, thread_id, c.ThreadRead.model_validate(rest))


async def _thread_wait(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    thread_id, rest = _split(args)
    return await ops.thread_wait(caller, thread_id, c.ThreadWait.model_validate(rest))


async def _thread_send(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    thread_id, rest = _split(args)
    return await ops.thread_send(caller, thread_id, c.ThreadSend.model_validate(rest))


async def _thread_interrupt(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    thread_id, rest = _split(args)
    if thread_id == caller.thread_id:
        raise InvalidRequest("A run cannot interrupt its own thread through a tool; end the turn instead.")
    return await ops.thread_interrupt(caller, thread_id, c.ThreadInterrupt.model_validate(rest))


async def _delegate_task(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    return await _delegation(ops).delegate(caller, c.DelegateTask.model_validate(args))


async def _task_status(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    return await _delegation(ops).status(caller, c.TaskStatusRead.model_validate(args))


async def _task_cancel(ops: Operations, caller: Caller, args: dict[str, Any]) -> c.Wire:
    return await _delegation(ops).cancel(caller, c.TaskCancel.model_validate(args))


def _delegation(ops: Operations) -> Delegation:
    if ops.delegation is None:
        raise NotFound("Delegation is not available in this daemon.")
    return ops.delegation


TOOLS: dict[str, Callable[[Operations, Caller, dict[str, Any]], Awaitable[c.Wire]]] = {
    "delegate_task": _delegate_task,
    "task_status": _task_status,
    "task_cancel": _task_cancel,
    "project_list": _project_list,
    "thread_launch": _thread_launch,
    "thread_read": _thread_read,
    "thread_wait": _thread_wait,
    "thread_send": _thread_send,
    "thread_interrupt": _thread_interrupt,
}


async def caller_from_token(ops: Operations, header: str | None) -> Caller:
    if not header or not header.startswith("Bearer "):
        raise CapabilityDenied("Agent tools need the run token peerd gave this run (Authorization: Bearer).")
    run = await threads.run_by_token_hash(ops.db, token_hash(header.removeprefix("Bearer ").strip()))
    if run is None or not is_live(run.status):
        raise ParentNotActive("This run has ended; its agent tools no longer act. Start a new run.")
    return Caller(namespace=f"thread:{run.thread_id}", thread_id=run.thread_id, run_id=run.id)


async def call_tool(request: web.Request) -> web.Response:
    ops = request.app[OPERATIONS]
    name = request.match_info["name"]
    tool = TOOLS.get(name)
    if tool is None:
        raise NotFound(f"No agent tool {name!r}; tools: {', '.join(sorted(TOOLS))}.")
    caller = await caller_from_token(ops, request.headers.get("Authorization"))
    result = await tool(ops, caller, await json_object(request))
    return ok({"result": result.wire()})
