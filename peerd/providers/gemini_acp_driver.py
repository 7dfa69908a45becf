"""The pure driver for Gemini CLI's ACP mode (JSON-RPC 2.0 on stdio): lines in, events and lines out.

The protocol as verified with gemini-cli 0.61.0 is pinned in `peerd.providers.gemini_acp`. The
driver translates each ACP message into the `-o stream-json` line that carries the same fact and
feeds it to `GeminiEvents`, so items, the reply, the session id, usage and the run's end are built
by the headless parser, exactly as on the headless path:

- `session/new` (or `session/load`) result -> `init` (the session id);
- `agent_message_chunk` -> an assistant `message` chunk;
- a `tool_call` the CLI runs without asking (`in_progress`), or a `session/request_permission`'s
  `toolCall` -> `tool_use`; `tool_call_update` (`completed`/`failed`) -> `tool_result`; a denial
  (the CLI sends no update for it) -> a failed `tool_result` carrying the person's reason;
- the `session/prompt` response (`stopReason`, `_meta.quota.token_count`) -> `result`.

A tool call's name is the `toolCallId`'s prefix (`run_shell_command__<id>`, `write_file__<id>`,
`mcp_<server>_<tool>__<id>`); its input comes from the request: the command line is the title and
its directory the content text (`[current working directory D]` or `[in D]`), a file change is the
`diff` content (path, oldText, newText), an MCP call's arguments are the content text (JSON).
"""

from __future__ import annotations

import difflib
import json
import posixpath
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peerd.providers.duplex import AskPerson, DuplexOutput, EndInput, Send
from peerd.providers.gemini_events import FILE_TOOLS, GeminiEvents, _mcp_name
from peerd.providers.stream_common import as_list, as_mapping, as_str, clip_head, joined_text
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk, command_summary, file_change_summary
from peerd.runtime.provider import ItemProduced, RunFinished, SessionStarted, UsageReported

PROTOCOL_VERSION = 1
# Request ids peerd uses (the CLI numbers its own requests to peerd from 0: another id space).
INIT, NEW, LOAD, HISTORY_DONE = "init", "new", "load", "history"
# After the last turn stdin is closed; 0.61.0 stays up while an MCP server is connected, so the
# shell ends it (SIGTERM: the CLI's graceful shutdown, exit 0) if it has not gone by then.
LINGER_S = 1.0
_ENDED_BY_US = (-signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGKILL)
# Denials with a reason are told to the model in a follow-up turn (0.61.0 tells the model only
# `Tool "X" was canceled by the user.`); at most this many follow-ups per run.
MAX_FOLLOW_UPS = 3
DENIED_PREFIX = "denied by a person"
FOLLOW_UP_NOTICE = (
    "Gemini CLI passes no reason with a denial: peerd gave the model the reasons in a follow-up turn."
)
_CWD_RE = re.compile(r"^\[(?:current working directory|in) ([^\]]*)\]")
_STOP_REASONS: Mapping[str, str] = {
    "max_turn_requests": "Gemini CLI stopped the turn: its turn limit was reached or it detected a loop.",
    "max_tokens": "Gemini CLI stopped the turn: the conversation no longer fits the model's context window.",
    "refusal": "The model refused to continue.",
    "cancelled": "Operation cancelled.",
}


@dataclass
class _Pending:
    """A permission request waiting for its decision."""

    rpc_id: Any
    tool_id: str
    options: list[Mapping[str, Any]]
    summary: str


@dataclass
class _Turn:
    """The state of the prompt in flight (one `session/prompt` request)."""

    number: int = 0
    denials: list[str] = field(default_factory=list)


def _request(rpc_id: Any, method: str, params: Mapping[str, Any]) -> Send:
    return Send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": dict(params)})


def _response(rpc_id: Any, result: Mapping[str, Any]) -> Send:
    return Send({"jsonrpc": "2.0", "id": rpc_id, "result": dict(result)})


def _error_text(message: Mapping[str, Any]) -> str:
    """A JSON-RPC error's message, with its details (the SDK's "Internal error" keeps the cause there)."""
    error = as_mapping(message.get("error"))
    text = as_str(error.get("message")).strip() or "the request failed"
    data = error.get("data")
    details = as_str(as_mapping(data).get("details")) or as_str(data)
    return clip_head(f"{text}: {details.strip()}" if details.strip() else text)


def tool_name(tool_id: str, kind: str) -> str:
    """The CLI's own tool name from its `toolCallId` (`<name>__<call id>`)."""
    name, sep, _ = tool_id.partition("__")
    if sep and name:
        return name
    return {"execute": "run_shell_command", "edit": "write_file"}.get(kind, kind or "tool")


def unified_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class GeminiAcpDriver:
    """One run of `gemini --acp`: initialize, a new or loaded session, the prompt, follow-ups."""

    def __init__(self, *, prompt: str, cwd: str, resume_session: str | None, client_version: str) -> None:
        self._prompt = prompt
        self._cwd = cwd
        self._resume = resume_session
        self._client_version = client_version
        self._events = GeminiEvents()
        self._session: str | None = None
        self._replaying = False  # a loaded session's history is streamed back first: not this run's
        self._turn: _Turn | None = None
        self._follow_ups = 0
        self._prompts = 0  # prompts sent: each has its own request id
        self._pending: dict[str, _Pending] = {}
        self._tools: dict[str, str] = {}  # toolCallId -> name, for calls started and not ended
        self._usage = (0, 0)  # tokens in and out of the turns ended so far
        self._ended = False
        self._cancelling = False

    # -- DuplexDriver ---------------------------------------------------------------------------

    def opening(self) -> Sequence[DuplexOutput]:
        capabilities = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": capabilities,  # the CLI reads and writes files with its own tools
            "clientInfo": {"name": "peerd", "version": self._client_version},
        }
        return [_request(INIT, "initialize", params)]

    def feed(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        method = line.get("method")
        if isinstance(method, str):
            if "id" in line:
                return self._server_request(line["id"], method, as_mapping(line.get("params")))
            if method == "session/update":
                return self._update(as_mapping(as_mapping(line.get("params")).get("update")))
            return []
        if "id" in line:
            return self._response(line["id"], line)
        return []

    def answered(self, key: str, answer: ApprovalAnswer) -> Sequence[DuplexOutput]:
        pending = self._pending.pop(key, None)
        if pending is None:
            return []
        kind = "allow_once" if answer.allow else "reject_once"
        option = next((o for o in pending.options if o.get("kind") == kind), None)
        if option is None or not isinstance(option.get("optionId"), str):
            # No such option offered: "cancelled" (the CLI's own "no") - never an allow by guess.
            outcome: dict[str, Any] = {"outcome": "cancelled"}
            allowed = False
        else:
            outcome = {"outcome": "selected", "optionId": option["optionId"]}
            allowed = answer.allow
        outputs: list[DuplexOutput] = [_response(pending.rpc_id, {"outcome": outcome})]
        if not allowed:
            reason = answer.message.strip()
            error = f"{DENIED_PREFIX}: {reason}" if reason else DENIED_PREFIX
            self._tools.pop(pending.tool_id, None)
            outputs += self._parse(
                {
                    "type": "tool_result",
                    "tool_id": pending.tool_id,
                    "status": "error",
                    "error": {"message": error},
                }
            )
            if reason and self._turn is not None:
                self._turn.denials.append(f"{pending.summary}: {reason}")
        return outputs

    def interrupting(self) -> Sequence[DuplexOutput]:
        """`session/cancel`, and every open permission request answered `cancelled` (ACP's rule)."""
        self._cancelling = True
        outputs: list[DuplexOutput] = []
        if self._session is not None and self._turn is not None:
            outputs.append(
                Send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": self._session}})
            )
        for pending in self._pending.values():
            outputs.append(_response(pending.rpc_id, {"outcome": {"outcome": "cancelled"}}))
        self._pending.clear()
        return outputs

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        if self._ended and not interrupted and exit_code in _ENDED_BY_US:
            # Its last turn had ended and its input was closed: the shell's SIGTERM to a CLI that
            # lingered (its own handler then exits 0; under load the signal can come first).
            exit_code = 0
        return self._events.finish(exit_code=exit_code, stderr_tail=stderr_tail, interrupted=interrupted)

    # -- responses to peerd's requests ----------------------------------------------------------

    def _response(self, rpc_id: Any, message: Mapping[str, Any]) -> list[DuplexOutput]:
        failed = "error" in message
        result = as_mapping(message.get("result"))
        if rpc_id == INIT:
            if failed:
                return self._fail(f"Gemini CLI refused ACP's initialize: {_error_text(message)}")
            if self._resume:
                self._replaying = True
                params = {"sessionId": self._resume, "cwd": self._cwd, "mcpServers": []}
                return [_request(LOAD, "session/load", params)]
            return [self._new_session()]
        if rpc_id == LOAD:
            if failed:
                self._replaying = False
                notice = ItemProduced(
                    "notice",
                    f"Gemini CLI could not resume its session {self._resume} ({_error_text(message)}): "
                    "this run starts a new session, without the earlier conversation.",
                )
                return [notice, self._new_session()]
            # The history is streamed back around this response: a request sent now is answered
            # after all of it (any answer will do: 0.61.0 knows no such method).
            return [
                *self._started(self._resume or ""),
                _request(HISTORY_DONE, "_peerd/history_done", {}),
            ]
        if rpc_id == HISTORY_DONE:
            self._replaying = False
            return self._prompt_turn([{"type": "text", "text": self._prompt}])
        if rpc_id == NEW:
            if failed:
                return self._fail(f"Gemini CLI could not start a session: {_error_text(message)}")
            return [
                *self._started(as_str(result.get("sessionId"))),
                *self._prompt_turn([{"type": "text", "text": self._prompt}]),
            ]
        if isinstance(rpc_id, str) and rpc_id.startswith("prompt-"):
            return self._turn_ended(message)
        return []

    def _new_session(self) -> Send:
        return _request(NEW, "session/new", {"cwd": self._cwd, "mcpServers": []})

    def _started(self, session_id: str) -> list[DuplexOutput]:
        if not session_id:
            return self._fail("Gemini CLI started a session without an id.")
        self._session = session_id
        return list(self._parse({"type": "init", "session_id": session_id}))

    def _prompt_turn(self, prompt: Sequence[Mapping[str, Any]]) -> list[DuplexOutput]:
        if self._session is None or self._ended:
            return []
        self._prompts += 1
        number = self._prompts
        self._turn = _Turn(number)
        params = {"sessionId": self._session, "prompt": [dict(part) for part in prompt]}
        return [_request(f"prompt-{number}", "session/prompt", params)]

    def _turn_ended(self, message: Mapping[str, Any]) -> list[DuplexOutput]:
        turn, self._turn = self._turn, None
        outputs: list[DuplexOutput] = []
        if "error" in message:
            return [*outputs, *self._fail(_error_text(message))]
        result = as_mapping(message.get("result"))
        counts = as_mapping(as_mapping(as_mapping(result.get("_meta")).get("quota")).get("token_count"))
        tokens_in, tokens_out = counts.get("input_tokens"), counts.get("output_tokens")
        if isinstance(tokens_in, int) and isinstance(tokens_out, int):
            self._usage = (self._usage[0] + max(tokens_in, 0), self._usage[1] + max(tokens_out, 0))
        stop = as_str(result.get("stopReason")) or "end_turn"
        line: dict[str, Any] = {"type": "result", "status": "success" if stop == "end_turn" else "error"}
        if stop != "end_turn":
            line["error"] = {"type": stop, "message": _STOP_REASONS.get(stop, f"the turn ended: {stop}")}
        if self._usage != (0, 0):
            tokens_in, tokens_out = self._usage
            line["stats"] = {"input_tokens": tokens_in, "output_tokens": tokens_out,
                             "total_tokens": tokens_in + tokens_out}  # fmt: skip
        outputs += self._parse(line)
        told = stop == "end_turn" and turn is not None and turn.denials and not self._cancelling
        if told and turn is not None and self._follow_ups < MAX_FOLLOW_UPS:
            self._follow_ups += 1
            notice = ItemProduced("notice", FOLLOW_UP_NOTICE, {"denials": list(turn.denials)})
            prompt = [{"type": "text", "text": follow_up_text(turn.denials)}]
            return [*outputs, notice, *self._prompt_turn(prompt)]
        self._ended = True
        return [*outputs, EndInput(linger_s=LINGER_S)]

    def _fail(self, error: str) -> list[DuplexOutput]:
        self._ended = True
        line = {"type": "result", "status": "error", "error": {"message": error}}
        return [*self._parse(line), EndInput(linger_s=LINGER_S)]

    # -- what the CLI sends on its own ----------------------------------------------------------

    def _server_request(self, rpc_id: Any, method: str, params: Mapping[str, Any]) -> list[DuplexOutput]:
        if method != "session/request_permission":
            # fs/* and terminal/* were declared unsupported in initialize: say so, never hang.
            error = {"code": -32601, "message": f"peerd does not provide {method}"}
            return [Send({"jsonrpc": "2.0", "id": rpc_id, "error": error})]
        call = as_mapping(params.get("toolCall"))
        tool_id = as_str(call.get("toolCallId")) or f"permission-{rpc_id}"
        key = f"{rpc_id}"
        if self._cancelling or self._ended:
            return [_response(rpc_id, {"outcome": {"outcome": "cancelled"}})]
        ask, parameters = self._ask(key, tool_id, call)
        options = [as_mapping(o) for o in as_list(params.get("options"))]
        self._pending[key] = _Pending(rpc_id, tool_id, options, ask.summary)
        outputs = self._tool_started(tool_id, ask.tool, parameters)
        return [*outputs, AskPerson(ask)]

    def _update(self, update: Mapping[str, Any]) -> list[DuplexOutput]:
        if self._replaying:
            return []  # a loaded session's history, streamed back: the earlier runs' items
        kind = as_str(update.get("sessionUpdate"))
        if kind == "agent_message_chunk":
            text = as_str(as_mapping(update.get("content")).get("text"))
            return self._parse({"type": "message", "role": "assistant", "content": text, "delta": True})
        tool_id = as_str(update.get("toolCallId"))
        status = as_str(update.get("status"))
        if kind == "tool_call" and status in ("pending", "in_progress") and tool_id:
            name = tool_name(tool_id, as_str(update.get("kind")))
            return self._tool_started(tool_id, name, self._parameters(name, update))
        if kind == "tool_call_update" and status in ("completed", "failed") and tool_id in self._tools:
            self._tools.pop(tool_id)
            text = self._content_text(update)
            result: dict[str, Any] = {"type": "tool_result", "tool_id": tool_id}
            if status == "completed":
                result.update(status="success", output=text)
            else:
                result.update(status="error", error={"message": text or "the tool failed"})
            return self._parse(result)
        # agent_thought_chunk (the headless stream has no thoughts either), user_message_chunk
        # (only in a history), plan, available_commands_update, current_mode_update: nothing to keep.
        return []

    def _tool_started(self, tool_id: str, name: str, parameters: Mapping[str, Any]) -> list[DuplexOutput]:
        if tool_id in self._tools:
            return []
        self._tools[tool_id] = name
        return self._parse(
            {"type": "tool_use", "tool_name": name, "tool_id": tool_id, "parameters": dict(parameters)}
        )

    def _parse(self, line: Mapping[str, Any]) -> list[DuplexOutput]:
        events: list[SessionStarted | ItemProduced | UsageReported] = self._events.feed(line)
        return list(events)

    # -- a permission request as a question for a person --------------------------------------

    def _ask(self, key: str, tool_id: str, call: Mapping[str, Any]) -> tuple[ApprovalAsk, Mapping[str, Any]]:
        kind = as_str(call.get("kind"))
        name = tool_name(tool_id, kind)
        title = as_str(call.get("title")).strip()
        text = self._content_text(call)
        diffs = [as_mapping(c) for c in as_list(call.get("content")) if as_mapping(c).get("type") == "diff"]
        if name == "run_shell_command" or (kind == "execute" and not diffs):
            cwd = self._command_cwd(text)
            detail = {"command": title, "cwd": cwd}
            return ApprovalAsk(key, "command", name, command_summary(title, cwd), detail), {"command": title}
        if diffs:
            changes = [self._change(d) for d in diffs]
            paths = [c["path"] for c in changes]
            summary = file_change_summary([self._shown(p) for p in paths])
            ask = ApprovalAsk(key, "file_change", name, summary, {"changes": changes})
            return ask, {"file_path": paths[0]}
        parameters = self._parameters(name, call)
        server, tool = _mcp_name(name)
        if server is not None:
            mcp: dict[str, Any] = {"server": server, "tool": tool, "arguments": dict(parameters)}
            return ApprovalAsk(key, "mcp_tool", name, clip_head(f"call {server}.{tool}"), mcp), parameters
        locations = [as_str(as_mapping(loc).get("path")) for loc in as_list(call.get("locations"))]
        tool_input = {"title": title, "description": text, "locations": [p for p in locations if p]}
        other: dict[str, Any] = {"input": tool_input}
        summary = clip_head(f"{name}: {title or text or 'use this tool'}")
        return ApprovalAsk(key, "tool", name, summary, other), parameters

    def _change(self, diff: Mapping[str, Any]) -> dict[str, str]:
        path = as_str(diff.get("path"))
        old, new = as_str(diff.get("oldText")), as_str(diff.get("newText"))
        meta = as_str(as_mapping(diff.get("_meta")).get("kind"))
        kind = {"add": "add", "delete": "delete"}.get(meta) or ("add" if not old else "update")
        return {"path": path, "kind": kind, "diff": unified_diff(self._shown(path), old, new)}

    def _shown(self, path: str) -> str:
        """A path as a person reads it: relative to the worktree when inside it."""
        root = self._cwd.rstrip("/") + "/"
        return path[len(root) :] if path.startswith(root) else path

    def _command_cwd(self, text: str) -> str:
        match = _CWD_RE.match(text)
        if not match:
            return self._cwd
        where = match.group(1).strip()
        return posixpath.normpath(posixpath.join(self._cwd, where)) if where else self._cwd

    @staticmethod
    def _content_text(call: Mapping[str, Any]) -> str:
        blocks = [as_mapping(as_mapping(c).get("content")) for c in as_list(call.get("content"))]
        return joined_text(blocks)

    def _parameters(self, name: str, call: Mapping[str, Any]) -> Mapping[str, Any]:
        """The tool's input as far as ACP tells it (the headless stream's `parameters`)."""
        if name == "run_shell_command":
            return {"command": as_str(call.get("title"))}
        if name in FILE_TOOLS:
            locations = as_list(call.get("locations"))
            return {"file_path": as_str(as_mapping(locations[0]).get("path"))} if locations else {}
        try:
            arguments = json.loads(self._content_text(call))
        except ValueError:
            return {}
        return arguments if isinstance(arguments, Mapping) else {}


def follow_up_text(denials: list[str]) -> str:
    """The turn after one whose guarded actions a person denied with a reason."""
    lines = "\n".join(f"- {d}" for d in denials)
    return (
        "[peerd] A person denied these actions of your last turn, saying why (Gemini CLI told you "
        f"only that they were canceled):\n{lines}\nTake this into account and carry on with the task."
    )
