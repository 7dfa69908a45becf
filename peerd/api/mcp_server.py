"""peerd's agent tools as an MCP server: the official SDK's low-level `Server`, stateless streamable HTTP.

Imported off the event loop (`peerd.api.mcp_http` warms it in a thread: the SDK alone costs about
a second to import), never at daemon start. The daemon's aiohttp handler authenticates each
request first and hands the caller in the ASGI scope (`CALLER_SCOPE_KEY`); a tool call reads it
from the request the SDK attaches to the call's context, and runs the same function as
`POST /v1/tools/{name}` (`peerd.api.tools.invoke`). No caller in the scope: refused.

Stateless, JSON answers: each POST is one JSON-RPC message and gets one JSON answer, so nothing of
a session lives in the daemon (an agent may reconnect, or run `peerd mcp` and the HTTP transport
side by side), and every request is authenticated on its own.

Errors come back as MCP tool errors (`isError`) whose text is a sentence starting with the stable
code (`target_required: Pass target.model ...`) and no structured content: Gemini CLI validates
structured content against a tool's output schema, and read a JSON error as a malformed result. A
wait that ended first carries a `hint` (what to do next) both in the structured result, which
Claude Code and Codex give the model, and in the text, which Gemini gives it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import pydantic
import structlog
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from peerd import __version__
from peerd.agent_tools import CATALOGUE, continue_hint
from peerd.api.app import MAX_BODY_BYTES, validation_message
from peerd.errors import PeerdError
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


def build_server(invoke: Invoke, tools: list[types.Tool]) -> Server[Any]:
    """The server; `tools` is `tool_list()`, built once (in a thread: pydantic makes the schemas)."""

    async def list_tools(
        _: ServerRequestContext[Any], __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = caller_of(ctx)
        if caller is None:  # never reached through peerd's handler; refuse rather than guess
            return error_result("capability_denied", "This request carried no caller; it was refused.")
        try:
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

    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def session_manager(invoke: Invoke, tools: list[types.Tool]) -> StreamableHTTPSessionManager:
    """The SDK's streamable-HTTP handler for peerd's server: stateless, JSON answers."""
    return StreamableHTTPSessionManager(
        build_server(invoke, tools), stateless=True, json_response=True, max_request_body_size=MAX_BODY_BYTES
    )
