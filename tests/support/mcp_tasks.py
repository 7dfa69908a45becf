"""An MCP Tasks client on the official SDK: the extension declared on every request (`Client(...,
extensions=[TasksExtension()])`), `delegate_task`'s task handle taken as a claimed result, and the
`tasks/*` requests as typed SDK requests (they carry `Mcp-Name`, as the extension asks)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import ConfigDict, Field

from tests.support.eventually import eventually

TASKS = "io.modelcontextprotocol/tasks"


class CreateTaskResult(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TaskResult(types.Result):
    """`tasks/get`'s DetailedTask (and `tasks/update|cancel`'s empty ack)."""

    model_config = ConfigDict(extra="allow")
    task_id: str | None = None
    status: str | None = None
    status_message: str | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")
    result: dict[str, Any] | None = None
    tasks: list[dict[str, Any]] | None = None


class TaskParams(types.RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class ListTasks(types.Request[types.RequestParams, Literal["tasks/list"]]):
    method: Literal["tasks/list"] = "tasks/list"


async def _unused(result: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    raise AssertionError("the tests take the handle themselves (allow_claimed=True)")


class TasksExtension(ClientExtension):
    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_unused)]


@asynccontextmanager
async def tasks_client(
    url: str,
    *,
    token: str | None = None,
    uds: Path | None = None,
    declare: bool = True,
    elicitation_callback: Any = None,
) -> AsyncIterator[Client]:
    """A 2026-07-28 client of `url` (over `uds` when given), declaring the Tasks extension."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    http = create_mcp_http_client(headers=headers)
    if uds is not None:
        await http.aclose()
        http = httpx2.AsyncClient(
            transport=httpx2.AsyncHTTPTransport(uds=str(uds)), headers=headers, timeout=60
        )
    extensions = [TasksExtension()] if declare else []
    async with (
        http,
        Client(
            streamable_http_client(url, http_client=http),
            mode="2026-07-28",
            extensions=extensions,
            elicitation_callback=elicitation_callback,
        ) as client,
    ):
        yield client


async def create(client: Client, arguments: dict[str, Any]) -> CreateTaskResult:
    handle = await client.session.call_tool("delegate_task", arguments, allow_claimed=True)
    assert isinstance(handle, CreateTaskResult), handle
    return handle


async def get(client: Client, task_id: str) -> TaskResult:
    return await client.session.send_request(GetTask(params=TaskParams(task_id=task_id)), TaskResult)


async def update(client: Client, task_id: str, responses: dict[str, Any]) -> TaskResult:
    request = UpdateTask(params=UpdateParams(task_id=task_id, input_responses=responses))
    return await client.session.send_request(request, TaskResult)


async def cancel(client: Client, task_id: str) -> TaskResult:
    return await client.session.send_request(CancelTask(params=TaskParams(task_id=task_id)), TaskResult)


async def listed(client: Client) -> list[str]:
    page = await client.session.send_request(ListTasks(params=types.RequestParams()), TaskResult)
    return [task["taskId"] for task in page.tasks or []]


async def until_status(
    fetch: Callable[[], Awaitable[TaskResult]], status: str, *, within: float = 20
) -> TaskResult:
    return await eventually(
        fetch, what=f"the MCP task {status}", until=lambda t: t.status == status, within=within
    )
