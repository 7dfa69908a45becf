"""Claude Code's stdio permission protocol: a run whose guarded actions a person approves
(see `peerd.providers.asking`).

Verified against claude-code 2.1.332 (the pinned binary, driven against tests/fakemodel.py):

    claude -p --input-format stream-json --output-format stream-json --verbose \
      --permission-mode default --permission-prompt-tool stdio [--model M] \
      --mcp-config <0600 file> --strict-mcp-config --allowedTools 'mcp__peerd__*' \
      (--session-id <uuid> | --resume <session id>)

- The prompt goes as one stream-json user message on stdin:
  `{"type":"user","session_id":"","message":{"role":"user","content":[{"type":"text","text":...}]},
  "parent_tool_use_id":null}`. No `initialize` control request is needed first (the Agent SDK
  sends one to register its hooks and in-process MCP servers; peerd has neither).
- stdout is the same stream as `-p --output-format stream-json --verbose` (`claude_events` parses
  it), plus control lines. Before a guarded action Claude writes
  `{"type":"control_request","request_id":"<uuid>","request":{"subtype":"can_use_tool",
  "tool_name":"Bash","display_name":"Bash","input":{...},"description":"...",
  "permission_suggestions":[...],"blocked_path":"...","tool_use_id":"toolu_..."}}` and waits for
  `{"type":"control_response","response":{"subtype":"success","request_id":"<uuid>","response":
  {"behavior":"allow","updatedInput":{...}}}}` or `{... {"behavior":"deny","message":"..."}}`; the
  deny message is the tool result the model reads (`is_error: true`), and the call is listed in
  the `result`'s `permission_denials`. Read-only tools inside the working directory (Read, Grep,
  Glob) are not asked about; peerd's MCP tools are allowed by `--allowedTools`.
- The `result` line ends the turn; Claude then waits for another user message, so peerd closes
  stdin there (`EndInput`) and Claude exits 0. stdin closed while a request waits denies it.
- Interrupt: `{"type":"control_request","request_id":...,"request":{"subtype":"interrupt"}}`.
  Claude cancels a waiting request (`{"type":"control_cancel_request","request_id":...}`), answers
  `control_response` success (`{"still_queued":[]}`) and ends the turn with an
  `error_during_execution` result; the signals of `DuplexRun` follow.

`stdio` rather than `--permission-prompt-tool mcp__peerd__<tool>`: an MCP prompt tool is a tool
like any other, which the model can call itself, so a hostile model could raise approval prompts of
its own making (with a summary it wrote). On stdio only Claude Code itself can ask.

The request's own `request_id` is the question's `key`: Claude makes it, unlike `tool_use_id`,
which a model server can repeat. An allow answers with the exact input the person was shown.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peerd.config import ProviderConfig
from peerd.providers.claude_asks import FileReader, ask_for, worktree_reader
from peerd.providers.claude_events import ClaudeEvents
from peerd.providers.cli import MCP_SERVER_NAME, MCP_TOOL_TIMEOUT_S, Launch, ToolBinding, write_private
from peerd.providers.duplex import AskPerson, DuplexDriver, DuplexOutput, EndInput, Send
from peerd.providers.stream_common import as_mapping, as_str, clip_head
from peerd.runtime.gate import ApprovalAnswer
from peerd.runtime.provider import RunFinished, RunSpec

DEFAULT_DENY = "The person approving this run's actions did not allow it."
ASKING_NOTICE = (
    "Claude Code asks before each shell command, file change and other guarded tool call; a person "
    "decides (`peerd approval list`). peerd's own tools and read-only tools in the worktree are not asked."
)


def user_message(text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "session_id": "",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        "parent_tool_use_id": None,
    }


def control_response(request_id: str, response: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": dict(response)},
    }


def control_error(request_id: str, error: str) -> dict[str, Any]:
    return {
        "type": "control_response",
        "response": {"subtype": "error", "request_id": request_id, "error": error},
    }


class ClaudeStdioDriver:
    """One Claude Code run over stdio: its stream parsed by `ClaudeEvents`, its questions asked."""

    def __init__(self, prompt: str, cwd: str, read: FileReader, cost_before: float | None = None) -> None:
        self._prompt = prompt
        self._cwd = cwd
        self._read = read
        self._events = ClaudeEvents(cost_before=cost_before)
        # request id -> (the input as asked, its tool_use_id), until answered or cancelled
        self._pending: dict[str, tuple[Mapping[str, Any], str]] = {}
        self._denied: dict[str, str] = {}  # tool_use_id -> the deny message the model read
        self._interrupts = 0
        self._ended = False

    def opening(self) -> Sequence[DuplexOutput]:
        return [Send(user_message(self._prompt))]

    def feed(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        kind = line.get("type")
        if kind == "control_request":
            return self._control(line)
        if kind == "control_cancel_request":
            self._pending.pop(as_str(line.get("request_id")), None)
            return []
        if kind == "control_response":
            return []  # to our interrupt
        outputs: list[DuplexOutput] = list(self._events.feed(line))
        if kind == "result" and not self._ended:
            self._ended = True
            outputs.append(EndInput())  # one prompt, one turn: Claude exits once its input ends
        return outputs

    def _control(self, line: Mapping[str, Any]) -> Sequence[DuplexOutput]:
        request_id = as_str(line.get("request_id"))
        request = as_mapping(line.get("request"))
        if not request_id:
            return []
        subtype = as_str(request.get("subtype"))
        if subtype != "can_use_tool":
            # Hooks, elicitations, ...: peerd registered none; an error keeps Claude from waiting.
            return [
                Send(control_error(request_id, f"peerd does not answer {clip_head(subtype, 80)!r} requests"))
            ]
        if request_id in self._pending:
            return []
        ask = ask_for(request_id, request, cwd=self._cwd, read=self._read)
        self._pending[request_id] = (as_mapping(request.get("input")), as_str(request.get("tool_use_id")))
        return [AskPerson(ask)]

    def answered(self, key: str, answer: ApprovalAnswer) -> Sequence[DuplexOutput]:
        pending = self._pending.pop(key, None)
        if pending is None:
            return []  # cancelled by Claude (an interrupt), or not ours
        tool_input, tool_use_id = pending
        if answer.allow:
            return [Send(control_response(key, {"behavior": "allow", "updatedInput": dict(tool_input)}))]
        message = answer.message.strip() or DEFAULT_DENY
        self._denied[tool_use_id] = message
        return [Send(control_response(key, {"behavior": "deny", "message": message}))]

    def interrupting(self) -> Sequence[DuplexOutput]:
        if self._ended:
            return []
        self._interrupts += 1
        request = {"subtype": "interrupt"}
        return [
            Send(
                {
                    "type": "control_request",
                    "request_id": f"peerd-interrupt-{self._interrupts}",
                    "request": request,
                }
            )
        ]

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        outcome = self._events.finish(exit_code=exit_code, stderr_tail=stderr_tail, interrupted=interrupted)
        denials = self._events.permission_denials
        if outcome.status == "failed" and self._events.succeeded and denials:
            return RunFinished("failed", error=self._denials_text(denials), exit_code=exit_code)
        return outcome

    def _denials_text(self, denials: list[Mapping[str, Any]]) -> str:
        """Which calls were denied: by whom (a person, with the reason the model read) or by Claude."""
        parts: list[str] = []
        for denial in denials:
            name = as_str(denial.get("tool_name")) or "unknown tool"
            reason = self._denied.get(as_str(denial.get("tool_use_id")))
            parts.append(
                f"{name} ({clip_head(reason, 120)})" if reason else f"{name} (by Claude Code's settings)"
            )
        return (
            f"{len(denials)} of Claude Code's tool call(s) were denied: {', '.join(parts)}. "
            "The reply may be incomplete."
        )


def claude_binding_flags(spec: RunSpec, binding: ToolBinding | None, scratch: Path) -> list[str]:
    """peerd's MCP tools for this run (allowed without asking: peerd checks them itself) and the
    session to start or resume; the same on the headless and the asking path (`claude_stdio`)."""
    argv: list[str] = []
    if binding is not None:
        server: dict[str, object]
        if binding.url:  # the daemon's MCP endpoint; the token only in this 0600 file
            server = {"type": "http", "url": binding.url, "headers": binding.bearer()}
        else:
            server = {"type": "stdio", "command": binding.command, "args": binding.args, "env": binding.env}
        server["timeout"] = MCP_TOOL_TIMEOUT_S * 1000
        server["alwaysLoad"] = True  # keeps peerd's tools out of tool search
        path = write_private(scratch / "mcp.json", json.dumps({"mcpServers": {MCP_SERVER_NAME: server}}))
        argv += ["--mcp-config", str(path), "--strict-mcp-config"]
        argv += ["--allowedTools", f"mcp__{MCP_SERVER_NAME}__*"]
    if spec.resume_session:
        argv += ["--resume", spec.resume_session]
    else:
        argv += ["--session-id", str(uuid.uuid4())]
    return argv


def duplex_launch(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[Launch, DuplexDriver]:
    """Claude Code in its asking mode, peerd's MCP tools attached exactly as on the headless path."""
    argv = [binary, "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    if model := spec.model or config.model:
        argv += ["--model", model]
    argv += ["--permission-mode", "default", "--permission-prompt-tool", "stdio"]
    # Each command starts in the run's directory (else a `cd` Claude lets through unasked would
    # move the next ones), so the directory a person is shown is where the command runs.
    env = {"CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR": "1"}
    if "CLAUDE_CODE_MAX_RETRIES" not in config.env:  # the owner's own setting wins
        env["CLAUDE_CODE_MAX_RETRIES"] = str(config.model_retries)
    argv += claude_binding_flags(spec, binding, scratch)
    argv += config.args
    launch = Launch(argv, env, spec.cwd, None, scratch, [ASKING_NOTICE])
    cost_before = None if spec.usage_before is None else spec.usage_before.cost_usd
    return launch, ClaudeStdioDriver(spec.prompt, str(spec.cwd), worktree_reader(spec.cwd), cost_before)
