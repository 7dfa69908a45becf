"""The `codex app-server` protocol as a pure `DuplexDriver` (codex-cli 0.171.0, as verified).

JSON-RPC 2.0 on stdio, one JSON object per line, **without** the `"jsonrpc"` member either way
(0.171 neither sends nor needs it). The client's requests and the server's are told apart by
`method` + `id` (a server request), `id` alone (a response) and `method` alone (a notification).

Client -> server, in order:
1. `initialize` {clientInfo: {name, title, version}, capabilities: {experimentalApi: false,
   optOutNotificationMethods: [...streamed deltas peerd does not show]}} -> {userAgent, codexHome, ...};
   then the `initialized` notification;
2. `thread/start` {cwd, approvalPolicy, sandbox, model} or `thread/resume` {threadId, the same,
   excludeTurns: true} -> {thread: {id, ...}, ...}: the thread id is the session id;
3. `turn/start` {threadId, input: [{type: "text", text, text_elements: []}]} -> {turn: {id, ...}};
4. `turn/interrupt` {threadId, turnId} to stop; `turn/steer` {threadId, expectedTurnId, input} adds
   a user message to the running turn (how a denial's reason reaches the model, below);
5. stdin closed once `turn/completed` arrives: app-server then exits 0.

Server -> client notifications used: `item/started`, `item/completed` ({item: ThreadItem,
threadId, turnId}; items are camelCase: `agentMessage{text}`, `commandExecution{command, cwd,
aggregatedOutput, exitCode, status: inProgress|completed|failed|declined}`, `fileChange{changes:
[{path, kind: {type: add|delete|update}, diff}], status}`, `mcpToolCall{server, tool, arguments,
result{content, structuredContent}, error{message}, status}`, `webSearch{query}`), mapped onto
`codex exec --json`'s item shapes and read by the same parser (`CodexEvents`);
`thread/tokenUsage/updated` {turnId, tokenUsage: {total, last}} where `total` is the *thread's*
running total (a resumed thread first replays its old total, under an older turnId): a run's
usage is `total` minus the total before its turn; `error` {error: {message}, willRetry} (one per
failed model attempt: "Reconnecting... 1/3"), counted against `model_retries` as under exec;
`turn/completed` {turn: {id, status: completed|failed|interrupted, error: {message}}};
`serverRequest/resolved` {requestId} (a question Codex no longer waits for).

Server requests (questions) peerd asks a person about, each keyed by its JSON-RPC id:
- `item/commandExecution/requestApproval` {itemId, turnId, command (the whole line, e.g.
  `/bin/bash -lc "make test"`), cwd, commandActions, reason?, networkApprovalContext?} ->
  {decision: "accept" | "decline"} (also offered: acceptForSession, acceptWithExecpolicyAmendment,
  cancel, which ends the turn; peerd uses neither);
- `item/fileChange/requestApproval` {itemId, reason?, grantRoot?}: the changes themselves are in
  the `fileChange` item's `item/started` that comes first -> {decision: "accept" | "decline"};
- `mcpServer/elicitation/request` with `_meta.codex_approval_kind == "mcp_tool_call"` {serverName,
  _meta: {tool_name, tool_params}} -> {action: "accept" | "decline", content, _meta};
- `item/permissions/requestApproval` {permissions, reason, cwd} -> {permissions: granted (the
  requested profile, or none), scope: "turn"}.
Other elicitations (forms, URLs) are declined with a notice (peerd has no way to fill them); any
other server request gets a JSON-RPC error, so Codex never waits on peerd for nothing.

A decision carries no text in this protocol: Codex tells the model only "rejected by user". So a
denial with a reason first sends `turn/steer` with that reason, then "decline"; the model's next
request has the reason as a user message right after the declined call's output (verified).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerd import __version__
from peerd.core.usage import Usage
from peerd.providers.codex_events import CodexEvents
from peerd.providers.duplex import AskPerson, DuplexOutput, EndInput, Send
from peerd.providers.stream_common import as_count, as_list, as_mapping, as_str, clip_head
from peerd.runtime.gate import (
    ApprovalAnswer,
    ApprovalAsk,
    AskKind,
    command_summary,
    file_change_summary,
)
from peerd.runtime.provider import ItemProduced, RunFinished, UsageReported

_INIT, _THREAD, _TURN = 1, 2, 3
# Streamed pieces of items that `item/completed` repeats whole, and status chatter.
QUIET = (
    "item/agentMessage/delta",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/reasoning/summaryTextDelta",
    "item/reasoning/summaryPartAdded",
    "item/reasoning/textDelta",
    "item/plan/delta",
    "account/rateLimits/updated",
    "thread/status/changed",
)
COMMAND_APPROVAL = "item/commandExecution/requestApproval"
FILE_APPROVAL = "item/fileChange/requestApproval"
PERMISSIONS_APPROVAL = "item/permissions/requestApproval"
ELICITATION = "mcpServer/elicitation/request"
_STATUS = {"inProgress": "in_progress"}


@dataclass(frozen=True)
class _Question:
    rpc_id: object  # the server's own id, answered as it came (a number in 0.171)
    method: str
    summary: str
    requested: Mapping[str, Any]  # what a permissions request asked for (granted as asked)


class CodexAppServerDriver:
    """One `codex app-server` run: one thread (started or resumed), one turn."""

    def __init__(
        self,
        *,
        prompt: str,
        thread: Mapping[str, object],
        resume: str | None,
        model_retries: int | None = None,
    ) -> None:
        self._prompt = prompt
        self._thread_params = dict(thread)
        self._resume = resume
        self._parser = CodexEvents(model_retries=model_retries)
        self._next_id = _TURN + 1
        self._thread_id: str | None = None
        self._turn_id: str | None = None
        self._turn_over = False
        self._ended = False
        self._failure: str | None = None
        self._items: dict[str, Mapping[str, Any]] = {}  # started items, by id (a patch's changes)
        self._questions: dict[str, _Question] = {}
        self._baseline = Usage()

    @property
    def give_up_reason(self) -> str | None:
        return self._parser.give_up_reason

    # -- DuplexDriver -------------------------------------------------------------------------

    def opening(self) -> Sequence[DuplexOutput]:
        info = {"name": "peerd", "title": "peerd", "version": __version__}
        capabilities = {"experimentalApi": False, "optOutNotificationMethods": list(QUIET)}
        return [Send(_request(_INIT, "initialize", {"clientInfo": info, "capabilities": capabilities}))]

    def feed(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        method = line.get("method")
        if isinstance(method, str) and "id" in line:
            return self._question(line["id"], method, as_mapping(line.get("params")))
        if isinstance(method, str):
            return self._notification(method, as_mapping(line.get("params")))
        if "id" in line:
            return self._response(line)
        return []

    def answered(self, key: str, answer: ApprovalAnswer) -> Sequence[DuplexOutput]:
        question = self._questions.pop(key, None)
        if question is None or self._ended:
            return []  # Codex stopped waiting (the turn ended) or the run is over
        out: list[DuplexOutput] = []
        if not answer.allow and answer.message and self._turn_active():
            # Before the decline: the reason is then in the model's very next request.
            text = f"[peerd] The request to {question.summary} was denied: {answer.message}"
            out.append(Send(self._steer(text)))
        out.append(Send(_result(question.rpc_id, _decision(question, answer.allow))))
        return out

    def interrupting(self) -> Sequence[DuplexOutput]:
        if not self._turn_active() or self._ended:
            return []
        params = {"threadId": self._thread_id, "turnId": self._turn_id}
        return [Send(_request(self._new_id(), "turn/interrupt", params))]

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        if self._failure is not None:
            return RunFinished("failed", error=self._failure, exit_code=exit_code)
        return self._parser.finish(exit_code=exit_code, stderr_tail=stderr_tail, interrupted=interrupted)

    # -- lines from Codex -------------------------------------------------------------------

    def _response(self, line: Mapping[str, Any]) -> list[DuplexOutput]:
        rpc_id, result = line.get("id"), as_mapping(line.get("result"))
        error = as_mapping(line.get("error"))
        if rpc_id not in (_INIT, _THREAD, _TURN):
            return []  # steer / interrupt: a late one may find the turn over, which is fine
        if "error" in line or "result" not in line:
            message = as_str(error.get("message")).strip() or "no reason given"
            if rpc_id == _THREAD and self._resume:
                return self._fail(
                    f"Codex could not resume its session {self._resume}: {message}. Its sessions live "
                    "in CODEX_HOME, which must stay the same for every run of a thread."
                )
            return self._fail(f"{_FAILED_STEP[rpc_id]}: {message}")
        if rpc_id == _INIT:
            method = "thread/resume" if self._resume else "thread/start"
            params = dict(self._thread_params)
            if self._resume:
                params.update(threadId=self._resume, excludeTurns=True)
            return [Send({"method": "initialized"}), Send(_request(_THREAD, method, params))]
        if rpc_id == _THREAD:
            thread_id = as_str(as_mapping(result.get("thread")).get("id"))
            if not thread_id:
                return self._fail("codex app-server started no thread (its answer had no thread id).")
            self._thread_id = thread_id
            out: list[DuplexOutput] = list(
                self._parser.feed({"type": "thread.started", "thread_id": thread_id})
            )
            params = {"threadId": thread_id, "input": [_text(self._prompt)]}
            return [*out, Send(_request(_TURN, "turn/start", params))]
        self._turn_id = self._turn_id or as_str(as_mapping(result.get("turn")).get("id")) or None
        return []

    def _notification(self, method: str, params: Mapping[str, Any]) -> list[DuplexOutput]:
        if method == "item/started":
            item = as_mapping(params.get("item"))
            if item_id := as_str(item.get("id")):
                self._items[item_id] = item
        elif method == "item/completed":
            item = as_mapping(params.get("item"))
            self._items.pop(as_str(item.get("id")), None)
            exec_item = exec_shape(item)
            if exec_item is not None:
                return list(self._parser.feed({"type": "item.completed", "item": exec_item}))
        elif method == "turn/started":
            self._turn_id = self._turn_id or as_str(as_mapping(params.get("turn")).get("id")) or None
        elif method == "thread/tokenUsage/updated":
            return self._usage(params)
        elif method == "error":
            message = as_str(as_mapping(params.get("error")).get("message"))
            self._parser.feed({"type": "error", "message": message})
        elif method == "serverRequest/resolved":
            request_id = params.get("requestId")
            for key in [k for k, q in self._questions.items() if q.rpc_id == request_id]:
                del self._questions[key]
        elif method == "turn/completed":
            return self._turn_completed(as_mapping(params.get("turn")))
        return []

    def _turn_completed(self, turn: Mapping[str, Any]) -> list[DuplexOutput]:
        turn_id = as_str(turn.get("id"))
        if self._turn_id is not None and turn_id and turn_id != self._turn_id:
            return []
        self._turn_over = True
        self._questions.clear()
        status = as_str(turn.get("status"))
        message = as_str(as_mapping(turn.get("error")).get("message")).strip()
        if status == "completed":
            self._parser.feed({"type": "turn.completed"})
        elif status == "failed":
            self._parser.feed({"type": "turn.failed", "error": {"message": message}})
        # `interrupted`: peerd asked for it (finish() sees `interrupted`), or the run fails as a
        # turn that ended without completing.
        return self._end()

    def _usage(self, params: Mapping[str, Any]) -> list[DuplexOutput]:
        total = _breakdown(as_mapping(as_mapping(params.get("tokenUsage")).get("total")))
        if self._turn_id is None or as_str(params.get("turnId")) != self._turn_id:
            self._baseline = total  # an earlier turn's total (a resumed thread replays it)
            return []
        return [UsageReported(total.since(self._baseline))]

    def _question(self, rpc_id: object, method: str, params: Mapping[str, Any]) -> list[DuplexOutput]:
        key = str(rpc_id)
        if method == COMMAND_APPROVAL:
            ask = self._command_ask(key, params)
        elif method == FILE_APPROVAL:
            ask = self._file_ask(key, params)
        elif method == PERMISSIONS_APPROVAL:
            ask = _permissions_ask(key, params)
        elif (
            method == ELICITATION
            and as_mapping(params.get("_meta")).get("codex_approval_kind") == "mcp_tool_call"
        ):
            ask = _mcp_ask(key, params)
        elif method == ELICITATION:
            server, message = as_str(params.get("serverName")), as_str(params.get("message"))
            notice = ItemProduced(
                "notice",
                clip_head(f"The MCP server {server} asked for input peerd cannot give (declined): {message}"),
            )
            return [notice, Send(_result(rpc_id, {"action": "decline", "content": None, "_meta": None}))]
        else:
            error = {"code": -32601, "message": f"peerd does not answer {method}"}
            return [Send({"id": rpc_id, "error": error})]
        requested = as_mapping(params.get("permissions")) if method == PERMISSIONS_APPROVAL else {}
        self._questions[key] = _Question(rpc_id, method, ask.summary, requested)
        return [AskPerson(ask)]

    def _command_ask(self, key: str, params: Mapping[str, Any]) -> ApprovalAsk:
        command = as_str(params.get("command"))
        cwd = as_str(params.get("cwd")) or None
        actions = [as_str(as_mapping(a).get("command")) for a in as_list(params.get("commandActions"))]
        # The model's own command line (Codex wraps it in `/bin/bash -lc "..."`).
        shown = actions[0] if len(actions) == 1 and actions[0] else command
        detail: dict[str, Any] = {"command": command, "cwd": cwd}
        for name in ("reason", "networkApprovalContext"):
            if params.get(name):
                detail[name] = params[name]
        if as_str(params.get("kind")) not in ("", "command"):
            detail["kind"] = params["kind"]  # humanCommand, writeStdin
        return ApprovalAsk(key, "command", "exec_command", command_summary(shown, cwd), detail)

    def _file_ask(self, key: str, params: Mapping[str, Any]) -> ApprovalAsk:
        item = self._items.get(as_str(params.get("itemId")), {})
        changes = [
            {
                "path": as_str(change.get("path")),
                "kind": as_str(as_mapping(change.get("kind")).get("type")) or "update",
                "diff": as_str(change.get("diff")),
            }
            for change in map(as_mapping, as_list(item.get("changes")))
        ]
        detail: dict[str, Any] = {"changes": changes}
        for name in ("reason", "grantRoot"):
            if params.get(name):
                detail[name] = params[name]
        summary = file_change_summary([c["path"] for c in changes])
        return ApprovalAsk(key, "file_change", "apply_patch", summary, detail)

    # -- helpers ------------------------------------------------------------------------------

    def _turn_active(self) -> bool:
        return self._thread_id is not None and self._turn_id is not None and not self._turn_over

    def _steer(self, text: str) -> dict[str, Any]:
        params = {"threadId": self._thread_id, "expectedTurnId": self._turn_id, "input": [_text(text)]}
        return _request(self._new_id(), "turn/steer", params)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _fail(self, message: str) -> list[DuplexOutput]:
        self._failure = self._failure or message
        return self._end()

    def _end(self) -> list[DuplexOutput]:
        if self._ended:
            return []
        self._ended = True
        return [EndInput()]


_FAILED_STEP = {
    _INIT: "codex app-server refused to start a session",
    _THREAD: "Codex could not start its thread",
    _TURN: "Codex could not start its turn",
}


def _request(rpc_id: int, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": rpc_id, "method": method, "params": dict(params)}


def _result(rpc_id: object, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": rpc_id, "result": dict(result)}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "text_elements": []}


def _decision(question: _Question, allow: bool) -> dict[str, Any]:
    if question.method == ELICITATION:
        return {"action": "accept" if allow else "decline", "content": {} if allow else None, "_meta": None}
    if question.method == PERMISSIONS_APPROVAL:
        granted = {k: v for k, v in question.requested.items() if v is not None} if allow else {}
        return {"permissions": granted, "scope": "turn"}
    return {"decision": "accept" if allow else "decline"}


def _mcp_ask(key: str, params: Mapping[str, Any]) -> ApprovalAsk:
    meta = as_mapping(params.get("_meta"))
    server, tool = as_str(params.get("serverName")), as_str(meta.get("tool_name"))
    arguments = meta.get("tool_params")
    shown = json.dumps(arguments, ensure_ascii=False, default=str) if arguments is not None else ""
    summary = clip_head(f"call {server}.{tool} {shown}".strip(), 200)
    detail = {"server": server, "tool": tool, "arguments": arguments}
    return ApprovalAsk(key, "mcp_tool", f"{server}.{tool}", summary, detail)


def _permissions_ask(key: str, params: Mapping[str, Any]) -> ApprovalAsk:
    reason = as_str(params.get("reason")).strip()
    summary = clip_head("give Codex more permissions" + (f": {reason}" if reason else ""), 200)
    detail = {"input": {"permissions": params.get("permissions"), "reason": reason, "cwd": params.get("cwd")}}
    kind: AskKind = "tool"
    return ApprovalAsk(key, kind, "request_permissions", summary, detail)


def _breakdown(total: Mapping[str, Any]) -> Usage:
    """A TokenUsageBreakdown (cached input is part of input, reasoning part of output, as exec)."""
    return Usage(
        input_tokens=as_count(total.get("inputTokens")) or 0,
        output_tokens=as_count(total.get("outputTokens")) or 0,
        cached_tokens=as_count(total.get("cachedInputTokens")) or 0,
        reasoning_tokens=as_count(total.get("reasoningOutputTokens")) or 0,
    )


def exec_shape(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """An app-server ThreadItem in `codex exec --json`'s item shape (None: exec has no such item)."""
    kind = item.get("type")
    status = _STATUS.get(as_str(item.get("status")), as_str(item.get("status")) or "completed")
    if kind == "agentMessage":
        return {"type": "agent_message", "text": as_str(item.get("text"))}
    if kind == "commandExecution":
        return {
            "type": "command_execution",
            "command": as_str(item.get("command")),
            "aggregated_output": as_str(item.get("aggregatedOutput")),
            "exit_code": item.get("exitCode"),
            "status": status,
        }
    if kind == "fileChange":
        changes = [
            {"path": as_str(c.get("path")), "kind": as_str(as_mapping(c.get("kind")).get("type"))}
            for c in map(as_mapping, as_list(item.get("changes")))
        ]
        return {"type": "file_change", "changes": changes, "status": status}
    if kind == "mcpToolCall":
        result = item.get("result")
        shaped = None
        if isinstance(result, Mapping):
            shaped = {"content": result.get("content"), "structured_content": result.get("structuredContent")}
        return {
            "type": "mcp_tool_call",
            "server": as_str(item.get("server")),
            "tool": as_str(item.get("tool")),
            "arguments": item.get("arguments"),
            "result": shaped,
            "error": item.get("error"),
            "status": status,
        }
    if kind == "webSearch":
        return {"type": "web_search", "query": as_str(item.get("query"))}
    return None  # userMessage (the prompt, peerd's steer), reasoning, plan, ...
