"""Agent tools over HTTP: `POST /v1/tools/{name}`, and the same tools over MCP at `/mcp`.

Two sockets serve them. The **agent socket** (`Paths.agent_socket`, `agent_app`) is the only one a
run is given: it serves nothing but the tools, and only to the run token of a live run
(`Authorization: Bearer`). The **owner socket** serves them too, with one more case: a call without
a token comes from an agent the owner started by hand (peerd did not start it) and acts as the
owner, like the CLI; it has no run to be woken in (`delegate_task` says to use thread_launch and
thread_wait). Runs never see the owner socket (`peerd.runtime.sandbox`).

With a token the call acts as that run and nothing more (`Operations.caller_for_thread`): its
thread's namespace, its modes as the ceiling, and - when a link started the thread - the link
itself, so the link's fence, cap, in-place ban and no-chaining rule apply to the agent's calls
exactly as to the link's own network calls. The caller is that run, never a claim in the body. A
token of an ended run is refused with `parent_not_active`; a run whose link was revoked, with
`link_revoked`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from peerd import agent_tools as t
from peerd import contracts as c
from peerd.api import examples as ex
from peerd.api.app import base_app, json_object, ok
from peerd.api.routes import FORWARDING, Example, Route, Variant, add_routes, wrapped
from peerd.core.runs import is_live
from peerd.errors import CapabilityDenied, InvalidRequest, NotFound, ParentNotActive
from peerd.handoff.wire import ThreadMove
from peerd.operations import Caller, Operations
from peerd.peer.links import LinkService
from peerd.runtime.runner import token_hash
from peerd.store import threads
from peerd.waits.wire import WaitCancel, WaitFor, WaitList

if TYPE_CHECKING:
    from peerd.approvals.desk import ApprovalDesk
    from peerd.handoff.service import HandoffService
    from peerd.tasks.delegation import Delegation
    from peerd.waits.service import Waits


@dataclass(frozen=True)
class ToolServices:
    """What the agent tools act through, given where the apps are built (`peerd/daemon.py`)."""

    ops: Operations
    links: LinkService
    delegation: Delegation
    moves: HandoffService
    desk: ApprovalDesk | None = None  # MCP Tasks' tasks/update decides through it (`mcp_taskport`)
    waits: Waits | None = None  # waits on a pull request (peerd/waits/)


TOOL_SERVICES = web.AppKey("tool_services", ToolServices)

Tool = Callable[[ToolServices, Caller, Any], Awaitable[c.Wire]]


def _fields(req: c.Input, model: type[c.Input]) -> Any:
    """The part of a tool's input that the operation's own request model takes."""
    return model.model_validate(req.model_dump(by_alias=True, exclude={"thread_id"}, exclude_unset=True))


async def _delegate_task(s: ToolServices, caller: Caller, req: c.DelegateTask) -> c.Wire:
    if caller.run_id is None:
        raise ParentNotActive(
            "delegate_task wakes the run that asked, and this agent was not started by peerd. "
            "Use thread_launch to start the work and thread_wait to collect its result."
        )
    return await s.delegation.delegate(caller, req)


async def _task_status(s: ToolServices, caller: Caller, req: c.TaskStatusRead) -> c.Wire:
    return await s.delegation.status(caller, req)


async def _task_cancel(s: ToolServices, caller: Caller, req: c.TaskCancel) -> c.Wire:
    return await s.delegation.cancel(caller, req)


def _waits(s: ToolServices) -> Waits:
    if s.waits is None:
        raise NotFound("Waits on a pull request are not served here.")
    return s.waits


async def _wait_for_github(s: ToolServices, caller: Caller, req: WaitFor) -> c.Wire:
    return await _waits(s).wait_for(caller, req)


async def _list_waits(s: ToolServices, caller: Caller, req: WaitList) -> c.Wire:
    return await _waits(s).listing(caller, req)


async def _cancel_wait(s: ToolServices, caller: Caller, req: WaitCancel) -> c.Wire:
    return await _waits(s).cancel(caller, req.wait_id, req.reason)


async def _thread_launch(s: ToolServices, caller: Caller, req: c.ThreadLaunch) -> c.Wire:
    return await s.ops.thread_launch(caller, req)


async def _thread_read(s: ToolServices, caller: Caller, req: t.ThreadReadTool) -> c.Wire:
    return await s.ops.thread_read(caller, req.thread_id, _fields(req, c.ThreadRead))


async def _thread_wait(s: ToolServices, caller: Caller, req: t.ThreadWaitTool) -> c.Wire:
    return await s.ops.thread_wait(caller, req.thread_id, _fields(req, c.ThreadWait))


async def _thread_send(s: ToolServices, caller: Caller, req: t.ThreadSendTool) -> c.Wire:
    return await s.ops.thread_send(caller, req.thread_id, _fields(req, c.ThreadSend))


async def _thread_interrupt(s: ToolServices, caller: Caller, req: t.ThreadInterruptTool) -> c.Wire:
    if req.thread_id == caller.thread_id:
        raise InvalidRequest("A run cannot interrupt its own thread through a tool; end the turn instead.")
    return await s.ops.thread_interrupt(caller, req.thread_id, _fields(req, c.ThreadInterrupt))


async def _thread_move(s: ToolServices, caller: Caller, req: t.ThreadMoveTool) -> c.Wire:
    if caller.thread_id is None:
        raise InvalidRequest("thread_move moves the calling agent's own thread; use `peerd thread move`.")
    move = ThreadMove.model_validate(req.model_dump(by_alias=True, exclude_unset=True))
    return await s.moves.move(caller, caller.thread_id, move)


async def _project_list(s: ToolServices, caller: Caller, req: c.ProjectList) -> c.Wire:
    return await s.ops.project_list(caller, req)


async def _environment_list(s: ToolServices, caller: Caller, _: t.EnvironmentListTool) -> c.Wire:
    if caller.link is not None:
        # A box never lends its own links to a link's work: they are not the link's to see or use.
        raise CapabilityDenied(
            f"This run was started through the link {caller.link.label!r}, which cannot use this "
            "machine's own links; it has none to list."
        )
    return t.EnvironmentListResult(items=await s.links.environment_list(probe=False))


TOOLS: dict[str, Tool] = {
    "delegate_task": _delegate_task,
    "task_status": _task_status,
    "task_cancel": _task_cancel,
    "wait_for_github": _wait_for_github,
    "list_waits": _list_waits,
    "cancel_wait": _cancel_wait,
    "thread_launch": _thread_launch,
    "thread_read": _thread_read,
    "thread_wait": _thread_wait,
    "thread_send": _thread_send,
    "thread_interrupt": _thread_interrupt,
    "thread_move": _thread_move,
    "project_list": _project_list,
    "environment_list": _environment_list,
}


OWNER_WITHOUT_TOKEN = web.AppKey("owner_without_token", bool)


async def caller_from_token(
    ops: Operations, header: str | None, *, owner_without_token: bool = True
) -> Caller:
    """The run a token belongs to, as the caller it acts as; no token is the owner only where the
    socket allows it (the owner socket, never the agent socket)."""
    if header is None:
        if owner_without_token:
            return Caller.local()
        raise CapabilityDenied(
            "This socket serves agent tools to peerd's runs only: pass the run token peerd gave this run "
            "(Authorization: Bearer; `peerd mcp` reads it from PEERD_RUN_TOKEN_FILE)."
        )
    if not header.startswith("Bearer "):
        raise CapabilityDenied("Agent tools take the run token peerd gave this run (Authorization: Bearer).")
    run = await threads.run_by_token_hash(ops.db, token_hash(header.removeprefix("Bearer ").strip()))
    if run is None or not is_live(run.status):
        raise ParentNotActive("This run has ended; its agent tools no longer act. Start a new run.")
    thread = await threads.get_thread(ops.db, run.thread_id)
    return await ops.caller_for_thread(thread, run_id=run.id, namespace=f"thread:{run.thread_id}")


def _tool(name: str) -> tuple[Tool, t.ToolSpec]:
    tool, spec = TOOLS.get(name), t.TOOL_SPECS.get(name)
    if tool is None or spec is None:
        raise NotFound(f"No agent tool {name!r}; tools: {', '.join(sorted(TOOLS))}.")
    return tool, spec


async def invoke(
    services: ToolServices, caller: Caller, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """One tool call as `caller`: the one implementation behind `/v1/tools/{name}` and MCP's
    `tools/call` (`peerd.api.mcp_http`). Raises `PeerdError`, or pydantic's error for bad input."""
    tool, spec = _tool(name)
    req = spec.input_model.model_validate(arguments)
    body = (await tool(services, caller, req)).wire()
    if (hint := t.continue_hint(name, body)) is not None:
        body["hint"] = hint
    return body


async def call_tool(request: web.Request) -> web.Response:
    services = request.app[TOOL_SERVICES]
    name = request.match_info["name"]
    _tool(name)  # an unknown tool is not_found before the token is looked at
    caller = await caller_from_token(
        services.ops,
        request.headers.get("Authorization"),
        owner_without_token=request.app.get(OWNER_WITHOUT_TOKEN, True),
    )
    arguments = await json_object(request)
    result = await invoke(services, caller, name, arguments)  # bad input: 400 (middleware)
    return ok({"result": result})


def _example(name: str) -> Example:
    body, result = ex.TOOLS[name]
    return Example({"result": result}, body=body)


_TOOL_ERRORS = (
    "not_found",  # no such tool
    "parent_not_active",
    "link_revoked",
    "capability_denied",
    "runtime_mode_escalation_denied",
    "interaction_mode_escalation_denied",
    "target_required",
    "project_not_found",
    "thread_not_found",
    "run_not_found",
    "item_not_found",
    "task_not_found",
    "wait_not_found",
    "provider_unavailable",
    "idempotency_key_reused",
    "branch_taken",
    "conflict",
    "git_error",
    "thread_busy",
    "thread_moved",
    "thread_moving",
    "move_refused",
    *FORWARDING,
)
TOOLS_ROUTE = Route(
    "POST",
    "/v1/tools/{name}",
    call_tool,
    "tool",
    "Call an agent tool.",
    "tools",
    run_token=True,
    errors=_TOOL_ERRORS,
    params={"name": "the tool"},
    description="The agent socket takes a run token only; the owner socket also takes none (the owner).",
    variants=tuple(
        Variant(s.name, s.description, s.input_model, wrapped(s.name, s.output_model), _example(s.name))
        for s in t.CATALOGUE
    ),
)


def agent_app(services: ToolServices) -> web.Application:
    """The agent socket's app: the tools, for live run tokens only; nothing of the owner's API
    (the daemon adds MCP at `/mcp`: `peerd.api.mcp_http.add_mcp_route`)."""
    app = base_app()
    app[TOOL_SERVICES] = services
    app[OWNER_WITHOUT_TOKEN] = False
    add_routes(app, (TOOLS_ROUTE,))
    return app
