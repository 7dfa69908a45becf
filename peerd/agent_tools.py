"""The agent tools: names, descriptions written for a model, and the input schemas they publish.

One catalogue, used twice: the daemon validates every call's arguments with these input models
(`POST /v1/tools/{name}` and the daemon's MCP endpoint, `peerd/api/mcp_http.py`), and the MCP
endpoint publishes the same names with a compact form of the same schemas (`published_schema`).

The published schema is what every agent session loads into its model's context, so it carries
only what a model needs: each parameter's type, enum, bounds that matter (a wait's cap), non-trivial
defaults and a short description where the name and the tool's description do not say it. No
titles, no `null` alternatives for optional fields (leave them out instead), no string lengths
(the daemon checks them and says which one failed), no output schemas (results are JSON whose
fields the descriptions name; Gemini CLI validates structured results against an output schema,
so without one an error can never be mistaken for a malformed result). Fields only peerd itself
sets (`delegatedFrom`) are not published; the input models still accept exactly what they did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from peerd import contracts as c
from peerd.handoff.wire import MAX_MOVE_MESSAGE_CHARS, MoveAnswer
from peerd.tasks.rules import WAIT_CAP_S
from peerd.waits.wire import WaitCancel, WaitFor, WaitInfo, WaitList, WaitPage

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


class ThreadMoveTool(c.Input):
    """`thread_move`: the calling agent's own thread (no thread id: an agent moves only its own)."""

    to: str | None = Field(default=None, min_length=1, max_length=200)
    message: str | None = Field(default=None, min_length=1, max_length=MAX_MOVE_MESSAGE_CHARS)
    dry_run: bool = False
    client_request_id: str | None = c.ClientRequestId


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
        """The input model's full JSON schema (what the daemon validates against)."""
        return self.input_model.model_json_schema(by_alias=True)

    def published_schema(self) -> dict[str, Any]:
        """The compact schema agents are shown (see the module docstring)."""
        return published_schema(self.input_schema(), PARAMS.get(self.name, {}), HIDDEN.get(self.name, ()))


# Per-field noise dropped from every published schema; `maximum` is kept where it is a real cap.
_DROPPED_KEYS = frozenset({"title", "minLength", "maxLength", "additionalProperties"})
_NO_CAP = 2**63 - 1  # the contract's SQLite integer bound: no cap a model needs to know


def _trivial(default: Any) -> bool:
    """A default a model would assume anyway: nothing, off, zero, empty."""
    return default is None or default is False or default == "" or (type(default) is int and default == 0)


def published_schema(
    schema: dict[str, Any], notes: dict[str, str], hidden: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`schema` (pydantic's, by alias) without the noise, `$defs` inlined, each optional field as
    its own type, `notes` as descriptions (`target.environmentId` names a nested field)."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def clean(node: Any, path: str) -> Any:
        if isinstance(node, list):
            return [clean(item, path) for item in node]
        if not isinstance(node, dict):
            return node
        options = node.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            kept = [option for option in options if option != {"type": "null"}]
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**(kept[0] if len(kept) == 1 else {"anyOf": kept}), **rest}
        if "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED_KEYS or key == "$defs":
                continue
            if key == "default" and _trivial(value):
                continue
            if key == "maximum" and value == _NO_CAP:
                continue
            if key == "description" and path.count(".") > 0 and path not in notes:
                continue  # a nested model's own docstring is not written for the model
            if key == "properties" and isinstance(value, dict):
                prefix = f"{path}." if path else ""
                out[key] = {
                    name: clean(field, f"{prefix}{name}")
                    for name, field in value.items()
                    if f"{prefix}{name}" not in hidden
                }
                continue
            out[key] = clean(value, path)
        if path in notes:
            out = {"description": notes[path], **{k: v for k, v in out.items() if k != "description"}}
        if "required" in out and "properties" in out:
            out["required"] = [name for name in out["required"] if name in out["properties"]]
        return out

    result: dict[str, Any] = clean(schema, "")
    result.pop("description", None)  # the tool's own description says it, once
    return result


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

_WAIT_FOR_GITHUB = """\
Wait for a pull request on GitHub without spending a turn: record the wait, then end your turn.
peerd watches the pull request through gh and wakes you once, in a new turn, when it gets there:
until "checks" (every check finished: passed or failed, with the checks' states and the failing
log's tail), "review" (approved or changes requested), "merged", or "closed". A pull request
merged or closed ends any wait, and so does timeoutHours. pr: its number, URL or head branch (of
this thread's repository). The wait survives restarts; the same clientRequestId returns the same
wait."""

_LIST_WAITS = """\
Your thread's waits on pull requests (watching, delivered, cancelled), newest first, with what
GitHub said at the last poll (state, review decision, checks)."""

_CANCEL_WAIT = """\
Cancel one of your waits on a pull request: it ends cancelled and you are not woken for it. A wait
that already ended is returned as it is."""

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

_THREAD_MOVE = """\
Move your own thread to a linked machine (`to`: its environmentId or label; see environment_list):
your branch's commits, uncommitted edits and new files and the last messages of this conversation
go there, and the thread continues there with the same provider and model. The move starts once
this turn ends, so end your turn after calling it; `message` is what the thread there does next.
dryRun=true lists the machines that can take it, each with its reason when not."""

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
    ToolSpec("wait_for_github", _WAIT_FOR_GITHUB, WaitFor, WaitInfo, read_only=False),
    ToolSpec("list_waits", _LIST_WAITS, WaitList, WaitPage, read_only=True),
    ToolSpec("cancel_wait", _CANCEL_WAIT, WaitCancel, WaitInfo, read_only=False),
    ToolSpec("thread_launch", _THREAD_LAUNCH, c.ThreadLaunch, c.ThreadLaunchResult, read_only=False),
    ToolSpec("thread_read", _THREAD_READ, ThreadReadTool, c.ThreadReadResult, read_only=True),
    ToolSpec("thread_wait", _THREAD_WAIT, ThreadWaitTool, c.ThreadWaitResult, read_only=True, waits=True),
    ToolSpec("thread_send", _THREAD_SEND, ThreadSendTool, c.ThreadSendResult, read_only=False),
    ToolSpec(
        "thread_interrupt", _THREAD_INTERRUPT, ThreadInterruptTool, c.ThreadInterruptResult, read_only=False
    ),
    ToolSpec("thread_move", _THREAD_MOVE, ThreadMoveTool, MoveAnswer, read_only=False),
    ToolSpec("project_list", _PROJECT_LIST, c.ProjectList, c.Page[c.Project], read_only=True),
    ToolSpec(
        "environment_list", _ENVIRONMENT_LIST, EnvironmentListTool, EnvironmentListResult, read_only=True
    ),
)
TOOL_SPECS: dict[str, ToolSpec] = {spec.name: spec for spec in CATALOGUE}

# What a parameter means, where neither its name nor its tool's description says it. Parameters
# many tools share (environmentId, clientRequestId, threadId) are described once, in the server's
# instructions (`peerd.mcp_proxy.INSTRUCTIONS`), and in the descriptions of the tools that lead.
PARAMS: dict[str, dict[str, str]] = {
    "delegate_task": {
        "title": "A short name for the task, shown in task lists.",
        "target": "Where it runs; leave it out for this project with this thread's provider and model.",
        "target.environmentId": (
            'A linked environment (id or label), or "auto": peerd picks the least loaded machine that '
            "has this repository and the provider; the task says where and why (placement)."
        ),
        "target.projectId": "The project there; default: the one with this thread's repository.",
        "target.provider": "codex, claude, gemini or another provider configured there; default: this thread's.",
        "target.model": "Default: this thread's model when the provider is the same.",
        "runtimeMode": "The task's access level; never more than this thread's own.",
        "timeoutMs": "mode wait only: how long to wait for the result.",
        "budget": "Stop the task past any limit (tokens, usd, seconds); it fails saying which.",
    },
    "task_status": {"timeoutMs": "With wait: how long to wait for the task to end."},
    "task_cancel": {"reason": "Why; kept with the task."},
    "wait_for_github": {
        "timeoutHours": "You are woken with outcome timed_out past it.",
    },
    "cancel_wait": {"reason": "Why; kept with the wait."},
    "thread_launch": {
        "provider": "codex, claude, gemini, script (a scripted stand-in) or a configured custom provider.",
        "inPlace": "Work in the project's own checkout instead of a new worktree.",
        "branch": "The new worktree's branch (under peerd/ or orchestrate/).",
        "baseCommit": "The commit the new worktree starts from.",
    },
    "thread_read": {
        "afterPosition": "Items after this position: the nextPosition of the page before.",
        "itemId": "With textOffset: read on in this item's long text.",
        "runId": "Only this run's items.",
    },
    "thread_wait": {"timeout": "Seconds."},
    "thread_interrupt": {"reason": "Why; shown in the thread."},
    "project_list": {"cursor": "The nextCursor of the page before."},
}
# Fields only peerd itself sets: not shown to agents (a box keeps lineage from the link, not this).
HIDDEN: dict[str, tuple[str, ...]] = {"thread_launch": ("delegatedFrom",), "list_waits": ("threadId",)}


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
