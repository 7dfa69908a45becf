"""The agent tools: names, descriptions written for a model, and input/output schemas.

One catalogue, used twice: the daemon's `POST /v1/tools/{name}` validates arguments with these
input models, and `peerd mcp` publishes the same names and schemas to an agent CLI. Schemas come
from the shared contract (camelCase on the wire, unknown fields refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from peerd import contracts as c
from peerd.tasks.rules import WAIT_CAP_S

# Wait-style tools return before MCP clients give up on a call, and say how to keep waiting.
TOOL_WAIT_MAX_S = WAIT_CAP_S


class ThreadRef(c.Input):
    thread_id: str = Field(min_length=1, description="The thread to act on (from thread_launch).")


class ThreadReadTool(c.ThreadRead):
    thread_id: str = Field(min_length=1)


class ThreadWaitTool(c.ThreadWait):
    thread_id: str = Field(min_length=1)
    timeout: float = Field(default=30.0, ge=0, le=TOOL_WAIT_MAX_S)


class ThreadSendTool(c.ThreadSend):
    thread_id: str = Field(min_length=1)


class ThreadInterruptTool(c.ThreadInterrupt):
    thread_id: str = Field(min_length=1)


class EnvironmentListTool(c.Input):
    pass


class EnvironmentListResult(c.Wire):
    items: list[c.LinkInfo]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_model: type[c.Input]
    output_model: type[c.Wire] | None
    read_only: bool
    # Waits that may outlast a client's tool-call limit are capped at TOOL_WAIT_MAX_S.
    waits: bool = False

    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema(by_alias=True)

    def output_schema(self) -> dict[str, Any] | None:
        if self.output_model is None:
            return None
        return self.output_model.model_json_schema(by_alias=True, mode="serialization")


_DELEGATE = """\
Hand a task to another coding agent and get woken with its result, like a subagent.

The task runs as a new thread: here (same project, its own git worktree), with another provider or
model (target.provider / target.model), or on a linked machine (target.environmentId; see
environment_list). Write `task` as a complete brief: the other agent sees nothing else.
mode "async" (default) returns at once with a taskId; when the task ends you are woken with its
result in a new turn, so end your turn after delegating unless you have other work.
mode "wait" waits up to timeoutMs (at most 45 s here) and returns the result if it is done;
otherwise call task_status with wait=true. Pass the same clientRequestId to retry safely: a retry
returns the same task, never a second one."""

_TASK_STATUS = """\
The status of a task you delegated (pending, running, completed, failed, cancelled, interrupted)
and its result when done. With wait=true it waits up to timeoutMs (at most 45 s) for the task to
end; if waitTimedOut is true the task is still running: call again to keep waiting."""

_TASK_CANCEL = """\
Cancel a task you delegated: its run is stopped, here or on the linked machine. A task that
already ended is returned as it is."""

_THREAD_LAUNCH = """\
Start a new agent thread in a project (its own git worktree and branch) with a first prompt.
Prefer delegate_task, which also wakes you with the result. Pass environmentId to launch on a
linked machine; the same clientRequestId returns the same thread on a retry."""

_THREAD_READ = """\
Read a thread's items (messages, commands, file changes, tool calls, errors) in order, a page at a
time (afterPosition, limit). Long texts are cut at maxCharsPerItem; read the rest with itemId and
textOffset."""

_THREAD_WAIT = """\
Wait for a thread's run to end (the latest run unless runId is given), up to `timeout` seconds (at
most 45). If timedOut is true it is still running: call thread_wait again."""

_THREAD_SEND = """\
Send a follow-up message to a thread: it becomes the thread's next run (queued if one is live)."""

_THREAD_INTERRUPT = """\
Interrupt a thread's live run; with stop=true also hold its queue so nothing else starts. Not for
your own thread: end your turn instead."""

_PROJECT_LIST = (
    "List the projects (git repositories) peerd knows here, or on a linked machine with environmentId."
)

_ENVIRONMENT_LIST = """\
List the linked machines (environments) you can delegate to: environmentId, label, access level
(the most a task there may do) and status (reachable, unreachable, revoked, expired)."""


CATALOGUE: tuple[ToolSpec, ...] = (
    ToolSpec("delegate_task", _DELEGATE, c.DelegateTask, c.TaskInfo, read_only=False, waits=True),
    ToolSpec("task_status", _TASK_STATUS, c.TaskStatusRead, c.TaskInfo, read_only=True, waits=True),
    ToolSpec("task_cancel", _TASK_CANCEL, c.TaskCancel, c.TaskInfo, read_only=False),
    ToolSpec("thread_launch", _THREAD_LAUNCH, c.ThreadLaunch, c.ThreadLaunchResult, read_only=False),
    ToolSpec("thread_read", _THREAD_READ, ThreadReadTool, c.ThreadReadResult, read_only=True),
    ToolSpec("thread_wait", _THREAD_WAIT, ThreadWaitTool, c.ThreadWaitResult, read_only=True, waits=True),
    ToolSpec("thread_send", _THREAD_SEND, ThreadSendTool, c.ThreadSendResult, read_only=False),
    ToolSpec(
        "thread_interrupt", _THREAD_INTERRUPT, ThreadInterruptTool, c.ThreadInterruptResult, read_only=False
    ),
    ToolSpec("project_list", _PROJECT_LIST, c.ProjectList, c.Page[c.Project], read_only=True),
    ToolSpec(
        "environment_list", _ENVIRONMENT_LIST, EnvironmentListTool, EnvironmentListResult, read_only=True
    ),
)
TOOL_SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in CATALOGUE}


def continue_hint(name: str, result: dict[str, Any]) -> str | None:
    """What a model should do when a wait returned before the thing it waited for ended (given in
    the tool's result, `hint`, and in its text: every CLI shows the model one or the other)."""
    if name in ("delegate_task", "task_status") and result.get("waitTimedOut"):
        return (
            f"Task {result.get('taskId')} is still {result.get('status')}. Call task_status with "
            f'{{"taskId": "{result.get("taskId")}", "wait": true}} to keep waiting, or end your turn: '
            "you are woken when it ends."
        )
    if name == "thread_wait" and result.get("timedOut"):
        return f"The run is still {result.get('status')}. Call thread_wait again to keep waiting."
    return None
