"""`peerd mcp`: a stdio MCP server an agent CLI launches, proxying each tool to the local daemon.

It owns no state: every tool call is `POST /v1/tools/{name}` on the daemon's Unix socket, so
agents may start and kill it freely while the daemon stays the single writer. stdout is the
JSON-RPC channel; logs go to stderr only.

Identity: when peerd started the agent, this process's environment carries the run's token
(`PEERD_RUN_TOKEN`, or `PEERD_RUN_TOKEN_FILE` naming a 0600 file, which keeps the token out of the
agent CLI's own argv), and every call acts as that run. Without one it acts as the socket's owner,
for agents peerd did not start.

Errors come back as MCP tool errors (`isError`) whose text is a sentence starting with the stable
code (`target_required: Pass target.model ...`) and no structured content: Gemini CLI validates
structured content against the tool's output schema, so a JSON error text was read as a result and
rejected before the model saw it. A wait that ended first carries a `hint` (what to do next) both
in the structured result, which Claude Code and Codex give the model, and in the text.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from peerd import __version__
from peerd.agent_tools import CATALOGUE, TOOL_SPECS, ToolSpec, continue_hint
from peerd.paths import Paths, resolve_home

INSTRUCTIONS = """\
peerd links the machines coding agents run on. Use delegate_task to hand work to another agent
(another provider or model here, or a linked machine from environment_list); you are woken with
the result in a new turn. Use task_status to check on a task, task_cancel to stop it."""

# A tool call never waits longer than the daemon's own caps (45 s) plus slack for the socket.
CALL_TIMEOUT_S = 75.0


@dataclass(frozen=True)
class ProxyConfig:
    socket: Path
    token: str | None
    # Set when this process was bound to a run whose token is gone (the run ended): it must not
    # fall back to acting as the owner.
    token_error: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ProxyConfig:
        env = dict(os.environ) if env is None else env
        socket = env.get("PEERD_SOCKET") or str(Paths(resolve_home(env.get("PEERD_HOME"))).socket)
        token = env.get("PEERD_RUN_TOKEN") or None
        token_file = env.get("PEERD_RUN_TOKEN_FILE")
        if token is None and token_file:
            try:
                from_file = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError:
                from_file = ""
            if not from_file:
                ended = "The run these tools were bound to has ended; they no longer act. Start a new run."
                return cls(socket=Path(socket), token=None, token_error=ended)
            token = from_file
        return cls(socket=Path(socket), token=token)


def tool_list() -> list[types.Tool]:
    return [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema(),
            output_schema=spec.output_schema(),
            annotations=types.ToolAnnotations(
                read_only_hint=spec.read_only, destructive_hint=False, open_world_hint=not spec.read_only
            ),
        )
        for spec in CATALOGUE
    ]


def error_result(code: str, message: str) -> types.CallToolResult:
    """A tool error every CLI passes to its model: plain text, the code first, no structure."""
    return types.CallToolResult(content=[types.TextContent(text=f"{code}: {message}")], is_error=True)


def success_result(spec: ToolSpec, result: dict[str, Any]) -> types.CallToolResult:
    hint = result.get("hint") or continue_hint(spec.name, result)
    if hint is not None:
        result = {**result, "hint": hint}
    text = json.dumps(result, indent=1)
    if hint is not None:
        text += "\n\n" + str(hint)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)


class DaemonTools:
    """Calls the daemon's agent-tool endpoint over its Unix socket."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DaemonTools:
        connector = aiohttp.UnixConnector(path=str(self.config.socket))
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S, sock_connect=5)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        spec = TOOL_SPECS.get(name)
        if spec is None:
            return error_result("not_found", f"No tool {name!r}; tools: {', '.join(sorted(TOOL_SPECS))}.")
        if self._session is None:
            raise RuntimeError("DaemonTools used outside `async with`")
        if self.config.token_error is not None:
            return error_result("parent_not_active", self.config.token_error)
        headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}
        try:
            async with self._session.post(
                f"http://peerd/v1/tools/{name}", json=arguments, headers=headers
            ) as resp:
                data = await resp.json(content_type=None)
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError):
            return error_result(
                "daemon_unavailable",
                f"peerd is not running (nothing answers at {self.config.socket}); start it with `peerd serve`.",
            )
        except TimeoutError:
            return error_result("timeout", f"peerd did not answer {name} within {CALL_TIMEOUT_S:.0f} s.")
        except (aiohttp.ClientError, ValueError) as exc:
            return error_result("daemon_unavailable", f"Talking to peerd failed: {exc}.")
        if resp.status >= 400 or not isinstance(data, dict) or "result" not in data:
            if isinstance(data, dict) and "code" in data and "message" in data:
                return error_result(str(data["code"]), str(data["message"]))
            return error_result("internal_error", f"peerd answered HTTP {resp.status}.")
        result = data["result"]
        return success_result(spec, result if isinstance(result, dict) else {"result": result})


def build_server(config: ProxyConfig) -> Server[DaemonTools]:
    @asynccontextmanager
    async def lifespan(_: Server[DaemonTools]) -> AsyncIterator[DaemonTools]:
        async with DaemonTools(config) as tools:
            yield tools

    async def list_tools(
        _: ServerRequestContext[DaemonTools], __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def call_tool(
        ctx: ServerRequestContext[DaemonTools], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await ctx.lifespan_context.call(params.name, params.arguments or {})

    return Server(
        "peerd",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(config: ProxyConfig) -> None:
    server = build_server(config)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
