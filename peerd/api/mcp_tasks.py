"""`delegate_task` as an MCP task: the Tasks extension (`io.modelcontextprotocol/tasks`, the
2026-07-28 "stable" schema) mapped onto peerd's own delegated tasks. Pure: wire shapes in and out,
no I/O; the thin handlers are in `peerd.api.mcp_server` (`add_task_methods`).

- **When.** A `tools/call` of `delegate_task` whose request declares the extension in its
  per-request capabilities (`_meta` `io.modelcontextprotocol/clientCapabilities.extensions`, a
  2026-07-28 envelope) is answered with a task handle (`resultType: "task"`) instead of the tool's
  result (`wants_task`). Every other call, and every client without the extension, is answered
  exactly as before (the wake, `mode: wait`). The handle is peerd's recorded task: its `taskId` is
  peerd's task id, so the task, its result and its fence are the ones `task_status` and
  `peerd task` show, and they survive a restart of either side.
- **States** (`mcp_status`): pending and running are `working`, or `input_required` while the
  child waits for a person's approval (`TaskInfo.awaitingApproval`); cancelled is `cancelled`;
  completed, failed and interrupted are `completed`, with the result `delegate_task` with
  `mode: wait` would have returned (its `status` says which; `statusMessage` too). The
  extension keeps `failed` for a JSON-RPC error of the underlying request, which a peerd tool
  never gives (its errors are tool results with `isError`), so peerd never reports `failed`.
- **Input.** An approval the child waits for is one `inputRequests` entry keyed by its approval
  id (unique for the task's life, as the extension asks): an `elicitation/create` form asking for
  `decision` (`approve` or `deny`). `tasks/update` answers it (`decision_of`): `accept` with a
  decision decides it; `decline` or `cancel` denies it. Whoever answers must be allowed to decide
  it by peerd's approvals rules (`peerd.approvals.rules.may_decide`): the owner or the link whose
  work it is, never an agent's run (an agent does not approve the work it delegated: a person
  does, here or through `peerd approval`).
- **A person's wait** (multi round-trip `input_required`, 2026-07-28 core): a `thread_wait` on a
  thread of this machine whose run waits for a person's approval, called by a client that acts as
  the person (the owner: `peerd mcp` started by hand) and declared `elicitation`, is answered
  `input_required` with the same form (`asks_on_wait`); the client's retry with `inputResponses`
  decides it and the wait goes on. Never for an agent's run: the question is not the agent's.
- **Methods.** `tasks/get`, `tasks/update` and `tasks/cancel` as the extension defines them;
  also `tasks/result` (the finished result, or a `-32602` error while it runs) and `tasks/list`
  (the caller's own tasks, newest first), the 2025-11-25 draft's names that some clients still
  send. A task the caller cannot see is not found (`-32602`), whether it exists or not.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Literal

from peerd import contracts as c

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_TOOL = "delegate_task"
POLL_INTERVAL_MS = 5_000
INVALID_PARAMS = -32602  # the extension's answer for an unknown task
INVALID_REQUEST = -32600
Verdict = Literal["approve", "deny"]
McpTaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
DECISION_FIELD = "decision"


def declares_tasks(extensions: Mapping[str, Any] | None) -> bool:
    """Did the request's client capabilities declare the Tasks extension?"""
    return extensions is not None and isinstance(extensions.get(TASKS_EXTENSION), Mapping)


def wants_task(tool: str, extensions: Mapping[str, Any] | None) -> bool:
    """Is this tool call answered with a task handle (module docstring: When)?"""
    return tool == TASK_TOOL and declares_tasks(extensions)


WAIT_TOOL = "thread_wait"


def asks_on_wait(tool: str, arguments: Mapping[str, Any], *, elicits: bool, modern: bool) -> str | None:
    """The thread whose pending approval this call may put to its client (module docstring: A
    person's wait), or None: a 2026-07-28 `thread_wait` of a thread here, from a client that
    declared elicitation. (Whether the caller is a person is `mcp_taskport.may_answer`.)"""
    if tool != WAIT_TOOL or not (elicits and modern) or arguments.get("environmentId") is not None:
        return None
    thread_id = arguments.get("threadId")
    return thread_id if isinstance(thread_id, str) and thread_id else None


def iso(timestamp: float) -> str:
    """An epoch time as the ISO 8601 UTC string the extension's timestamps are."""
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def mcp_status(info: c.TaskInfo) -> McpTaskStatus:
    if info.status in ("pending", "running"):
        return "input_required" if info.awaiting_approval is not None else "working"
    if info.status == "cancelled":
        return "cancelled"
    return "completed"  # completed, failed, interrupted: the tool's result says which


def status_message(info: c.TaskInfo) -> str:
    if info.awaiting_approval is not None and info.status in ("pending", "running"):
        where = "" if info.awaiting_approval.environment_id is None else " on the linked machine"
        return f"The delegated work waits for a person's approval{where}: {info.awaiting_approval.summary}"
    return {
        "pending": "The delegated task is being started.",
        "running": "The delegated task is running.",
        "completed": "The delegated task completed.",
        "failed": "The delegated task failed; its result says why.",
        "interrupted": "The delegated task was interrupted; its result says why.",
        "cancelled": "The delegated task was cancelled.",
    }[info.status]


def input_requests(approval: c.TaskApproval) -> dict[str, Any]:
    """The approval as the one outstanding input request, keyed by its id."""
    schema = {
        "type": "object",
        "properties": {
            DECISION_FIELD: {
                "type": "string",
                "title": "Decision",
                "enum": ["approve", "deny"],
                "description": "Approve lets the delegated work do this; deny refuses it.",
            }
        },
        "required": [DECISION_FIELD],
    }
    message = f"peerd: the work asks for your approval: {approval.summary}"
    return {
        approval.approval_id: {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema},
        }
    }


def task_body(info: c.TaskInfo, *, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The extension's `DetailedTask` for a peerd task; `result` is the tool result (CallToolResult
    as JSON) to inline once the task completed."""
    status = mcp_status(info)
    body: dict[str, Any] = {
        "taskId": info.task_id,
        "status": status,
        "statusMessage": status_message(info),
        "createdAt": iso(info.created_at),
        "lastUpdatedAt": iso(info.ended_at or info.created_at),  # peerd shows no other change time
        "ttlMs": None,  # peerd keeps its tasks: no expiry
    }
    if status in ("working", "input_required"):
        body["pollIntervalMs"] = POLL_INTERVAL_MS
    if status == "input_required" and info.awaiting_approval is not None:
        body["inputRequests"] = input_requests(info.awaiting_approval)
    if status == "completed" and result is not None:
        body["result"] = result
    return body


def created(info: c.TaskInfo) -> dict[str, Any]:
    """`CreateTaskResult`: the task's seed state, `resultType: "task"`."""
    return {**task_body(info), "resultType": "task"}


def decision_of(approval_id: str, response: Any) -> Verdict | None:
    """The verdict one `inputResponses` entry gives the approval (None: not an answer to it)."""
    if not isinstance(response, Mapping):
        return None
    action = response.get("action")
    if action in ("decline", "cancel"):
        return "deny"
    if action != "accept":
        return None
    content = response.get("content")
    decision = content.get(DECISION_FIELD) if isinstance(content, Mapping) else None
    return decision if decision in ("approve", "deny") else None


def answers(outstanding: c.TaskApproval | None, responses: Mapping[str, Any]) -> tuple[str, Verdict] | None:
    """The one decision `tasks/update` makes: the outstanding approval's, when answered. Keys that are
    not outstanding (never issued, already answered, superseded) are ignored, as the extension asks."""
    if outstanding is None or outstanding.approval_id not in responses:
        return None
    verdict = decision_of(outstanding.approval_id, responses[outstanding.approval_id])
    return None if verdict is None else (outstanding.approval_id, verdict)
