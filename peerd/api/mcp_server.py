"""peerd's agent tools as an MCP server: the official SDK's low-level `Server`, stateless streamable HTTP.

Imported off the event loop (`peerd.api.mcp_http` warms it in a thread: the SDK alone costs about
a second to import), never at daemon start. The daemon's aiohttp handler authenticates each
request first and hands the caller in the ASGI scope (`CALLER_SCOPE_KEY`); a tool call reads it
from the request the SDK attaches to the call's context, and runs the same function as
`POST /v1/tools/{name}` (`peerd.api.tools.invoke`). No caller in the scope: refused.

Stateless, JSON answers: each POST is one JSON-RPC message and gets one JSON answer, so nothing of
a session lives in the daemon (an agent may reconnect, or run `peerd mcp` and the HTTP transport
side by side), and every request is authenticated on its own.

Clients that declare the Tasks extension get `delegate_task` as an MCP task (`add_task_methods`;
the mapping is `peerd.api.mcp_tasks`, what it acts through `peerd.api.mcp_taskport`), and a
person's `thread_wait` at 2026-07-28 may ask them the approval their thread waits for
(`ask_person`: multi round-trip `input_required`).

Errors come back as MCP tool errors (`isError`) whose text is a sentence starting with the stable
code (`target_required: Pass target.model ...`) and no structured content: Gemini CLI validates
structured content against a tool's output schema, and read a JSON error as a malformed result. A
wait that ended first carries a `hint` (what to do next) both in the structured result, which
Claude Code and Codex give the model, and in the text, which Gemini gives it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import pydantic
import structlog
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from peerd import __version__
from peerd import contracts as c
from peerd.agent_tools import CATALOGUE, continue_hint
from peerd.api import mcp_tasks as mt
from peerd.api.app import MAX_BODY_BYTES, validation_message
from peerd.api.mcp_taskport import TaskPort
from peerd.errors import ApprovalDecided, ApprovalWithdrawn, PeerdError, TaskNotFound
from peerd.mcp_proxy import INSTRUCTIONS, SERVER_NAME
from peerd.operations import Caller

log = structlog.get_logger(__name__)

CALLER_SCOPE_KEY = "peerd.caller"  # set by peerd.api.mcp_http on every request it lets through

# (caller, tool name, arguments) -> the tool's JSON result; raises PeerdError / ValidationError.
Invoke = Callable[[Caller, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def tool_list() -> list[types.Tool]:
    return [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.published_schema(),
            annotations=types.ToolAnnotations(
                read_only_hint=spec.read_only, destructive_hint=False, open_world_hint=not spec.read_only
            ),
        )
        for spec in CATALOGUE
    ]


def error_result(code: str, message: str) -> types.CallToolResult:
    """A tool error every CLI passes to its model: plain text, the code first, no structure."""
    return types.CallToolResult(content=[types.TextContent(text=f"{code}: {message}")], is_error=True)


def success_result(name: str, result: dict[str, Any]) -> types.CallToolResult:
    hint = result.get("hint") or continue_hint(name, result)
    if hint is not None:
        result = {**result, "hint": hint}
    text = json.dumps(result, indent=1)
    if hint is not None:
        text += "\n\n" + str(hint)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)


def caller_of(ctx: ServerRequestContext[Any]) -> Caller | None:
    scope = getattr(ctx.request, "scope", None)
    caller = scope.get(CALLER_SCOPE_KEY) if isinstance(scope, dict) else None
    return caller if isinstance(caller, Caller) else None


def client_extensions(ctx: ServerRequestContext[Any]) -> dict[str, Any] | None:
    """The extensions this request's client declared (2026-07-28: in its `_meta` envelope)."""
    capabilities = ctx.session.client_capabilities
    return None if capabilities is None else capabilities.extensions


def elicits(ctx: ServerRequestContext[Any]) -> bool:
    """Did this request's client declare that it answers elicitation (shows a person a form)?"""
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


async def ask_person(
    ctx: ServerRequestContext[Any], tasks: TaskPort, caller: Caller, params: types.CallToolRequestParams
) -> types.InputRequiredResult | None:
    """A person's `thread_wait` on a thread whose run waits for their approval: the approval as
    2026-07-28's `input_required` (None: nothing to ask, or it was just answered by this retry, so
    the wait goes on). `peerd.api.mcp_tasks`: A person's wait."""
    arguments = dict(params.arguments or {})
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    thread_id = mt.asks_on_wait(params.name, arguments, elicits=elicits(ctx), modern=modern)
    pending = None if thread_id is None else await tasks.waiting(caller, thread_id)
    if pending is None:
        return None
    responses = {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        for key, value in (params.input_responses or {}).items()
    }
    answered = mt.answers(pending, responses)
    if answered is None:
        return types.InputRequiredResult.model_validate(
            {"resultType": "input_required", "inputRequests": mt.input_requests(pending)}
        )
    with contextlib.suppress(ApprovalDecided, ApprovalWithdrawn):  # answered meanwhile: wait on
        await tasks.decide(caller, *answered, decision_id=f"mcp-wait-{answered[0]}"[:64])
    return None


def build_server(invoke: Invoke, tools: list[types.Tool], tasks: TaskPort | None = None) -> Server[Any]:
    """The server; `tools` is `tool_list()`, built once (in a thread: pydantic makes the schemas)."""

    async def list_tools(
        _: ServerRequestContext[Any], __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        caller = caller_of(ctx)
        if caller is None:  # never reached through peerd's handler; refuse rather than guess
            return error_result("capability_denied", "This request carried no caller; it was refused.")
        try:
            if tasks is not None and mt.wants_task(params.name, client_extensions(ctx)):
                return mt.created(await tasks.create(caller, dict(params.arguments or {})))
            if tasks is not None and (asked := await ask_person(ctx, tasks, caller, params)) is not None:
                return asked
            return success_result(
                params.name, await invoke(caller, params.name, dict(params.arguments or {}))
            )
        except PeerdError as err:
            return error_result(err.code, err.message)
        except pydantic.ValidationError as exc:
            return error_result("invalid_request", validation_message(exc))
        except Exception:
            log.exception("mcp.tool_failed", tool=params.name)
            return error_result("internal_error", "peerd hit an internal error; its log has the details.")

    server: Server[Any] = Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,  # type: ignore[arg-type]  # a task handle is a dict (the extension's shape)
    )
    if tasks is not None:
        add_task_methods(server, tasks)
    return server


class TaskParams(types.RequestParams):
    task_id: str = pydantic.Field(alias="taskId", min_length=1, max_length=200)


class TaskUpdateParams(TaskParams):
    input_responses: dict[str, Any] = pydantic.Field(alias="inputResponses", default_factory=dict)


class TaskListParams(types.RequestParams):
    cursor: str | None = pydantic.Field(default=None, max_length=40)


def protocol_error(err: PeerdError) -> MCPError:
    """A peerd error as the JSON-RPC error of a `tasks/*` request: a task the caller cannot see is
    the extension's `-32602`; anything else is refused with its code first, as tool errors are."""
    code = mt.INVALID_PARAMS if isinstance(err, TaskNotFound) else mt.INVALID_REQUEST
    return MCPError(code=code, message=f"{err.code}: {err.message}", data={"code": err.code})


def completed_result(info: c.TaskInfo) -> dict[str, Any]:
    """What `delegate_task` with `mode: wait` returns for the finished task, as JSON."""
    return success_result(mt.TASK_TOOL, info.wire()).model_dump(by_alias=True, mode="json", exclude_none=True)


def add_task_methods(server: Server[Any], tasks: TaskPort) -> None:
    """`tasks/get|update|cancel` (the extension), `tasks/result|list` (the 2025-11-25 draft's), each
    as the request's caller; the extension advertised in `server/discover`'s capabilities."""
    server.extensions[mt.TASKS_EXTENSION] = {}

    def caller(ctx: ServerRequestContext[Any]) -> Caller:
        found = caller_of(ctx)
        if found is None:
            raise MCPError(
                code=mt.INVALID_REQUEST, message="capability_denied: This request carried no caller."
            )
        return found

    async def get(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        try:
            info = await tasks.info(caller(ctx), params.task_id)
        except PeerdError as err:
            raise protocol_error(err) from None
        result = completed_result(info) if mt.mcp_status(info) == "completed" else None
        return mt.task_body(info, result=result)

    async def result(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        try:
            info = await tasks.info(caller(ctx), params.task_id)
        except PeerdError as err:
            raise protocol_error(err) from None
        if mt.mcp_status(info) != "completed":
            raise MCPError(
                code=mt.INVALID_PARAMS,
                message=f"Task {params.task_id} has no result yet ({mt.mcp_status(info)}); poll tasks/get.",
            )
        return completed_result(info)

    async def update(ctx: ServerRequestContext[Any], params: TaskUpdateParams) -> dict[str, Any]:
        try:
            await tasks.update(caller(ctx), params.task_id, params.input_responses)
        except PeerdError as err:
            raise protocol_error(err) from None
        return {}

    async def cancel(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        try:
            await tasks.cancel(caller(ctx), params.task_id)
        except PeerdError as err:
            raise protocol_error(err) from None
        return {}

    async def listed(ctx: ServerRequestContext[Any], params: TaskListParams) -> dict[str, Any]:
        try:
            page = await tasks.page(caller(ctx), params.cursor)
        except PeerdError as err:
            raise protocol_error(err) from None
        answer: dict[str, Any] = {"tasks": [mt.task_body(info) for info in page.items]}
        if page.next_cursor is not None:
            answer["nextCursor"] = page.next_cursor
        return answer

    server.add_request_handler("tasks/get", TaskParams, get)
    server.add_request_handler("tasks/result", TaskParams, result)
    server.add_request_handler("tasks/update", TaskUpdateParams, update)
    server.add_request_handler("tasks/cancel", TaskParams, cancel)
    server.add_request_handler("tasks/list", TaskListParams, listed)


def session_manager(
    invoke: Invoke, tools: list[types.Tool], tasks: TaskPort | None = None
) -> StreamableHTTPSessionManager:
    """The SDK's streamable-HTTP handler for peerd's server: stateless, JSON answers."""
    return StreamableHTTPSessionManager(
        build_server(invoke, tools, tasks),
        stateless=True,
        json_response=True,
        max_request_body_size=MAX_BODY_BYTES,
    )
