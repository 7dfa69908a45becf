"""Gemini CLI `-p -o stream-json` stdout -> peerd provider events (pure; format of gemini-cli 0.61.0).

Gemini streams assistant text as `message` chunks (`delta:true`) and never repeats it in `result`,
so the chunks are joined here: the text gathered so far becomes one assistant_message when a tool
starts or the turn's `result` arrives, and the reply is the text after the last `tool_result`.
`error` events (loop detected, turn limit, ...) are warnings, not the end of the run; a tool refused
by the headless policy ("requires user confirmation") is a failed tool, and the run goes on.
`result.stats` is the run's usage: `input_tokens` with the `cached` ones in it, `output_tokens`
without the model's thoughts, which are in `total_tokens` only (so reasoning = total - input -
output, added to the output here), and the CLI's `duration_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peerd.core.usage import Usage
from peerd.providers.stream_common import (
    as_count,
    as_mapping,
    as_str,
    clip_head,
    clip_tail,
    file_change_item,
    finish_run,
    shell_item,
    tool_call_item,
    with_failure,
)
from peerd.runtime.provider import ItemProduced, RunFinished, SessionStarted, UsageReported

CLI_NAME = "Gemini CLI"
# Exit codes from the CLI's own table (`FatalError` subclasses).
EXIT_NAMES: Mapping[int, str] = {
    1: "general or API error",
    41: "authentication failed",
    42: "invalid input, e.g. bad arguments or an unknown session id",
    44: "sandbox error",
    52: "configuration error",
    53: "turn limit reached",
    54: "fatal tool error",
    55: "untrusted workspace",
    130: "cancelled",
}
FILE_TOOLS: Mapping[str, str] = {"write_file": "write", "replace": "edit"}


class GeminiEvents:
    """Parser state for one `gemini -p -o stream-json` run."""

    def __init__(self) -> None:
        self._sessions: set[str] = set()
        self._pending: list[str] = []  # assistant chunks not yet emitted as an item
        self._since_tool: list[str] = []  # assistant chunks after the last tool_result
        self._tools: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._status: str | None = None
        self._failure: str | None = None

    @property
    def reply(self) -> str | None:
        """The assistant text after the last `tool_result` (up to `result`), None when there is none."""
        text = "".join(self._since_tool)
        return text if text.strip() else None

    def feed(self, line: Mapping[str, Any]) -> list[SessionStarted | ItemProduced | UsageReported]:
        kind = line.get("type")
        if kind == "init":
            session_id = as_str(line.get("session_id"))
            if session_id and session_id not in self._sessions:
                self._sessions.add(session_id)
                return [SessionStarted(session_id)]
        elif kind == "message":
            content = as_str(line.get("content"))
            if line.get("role") == "assistant" and content:
                self._pending.append(content)
                self._since_tool.append(content)
        elif kind == "tool_use":
            events = self._flush()
            tool_id = as_str(line.get("tool_id"))
            if tool_id:
                self._tools[tool_id] = (as_str(line.get("tool_name")), as_mapping(line.get("parameters")))
            return events
        elif kind == "tool_result":
            events = self._flush()
            self._since_tool = []
            tool = self._tools.pop(as_str(line.get("tool_id")), None)
            if tool is not None:
                events.append(_tool_item(*tool, line))
            return events
        elif kind == "error":
            message = as_str(line.get("message")).strip()
            severity = as_str(line.get("severity")) or "error"
            return [ItemProduced("notice", message, {"severity": severity})] if message else []
        elif kind == "result":
            status = as_str(line.get("status"))
            self._status = status or "error"
            error = as_mapping(line.get("error"))
            self._failure = as_str(error.get("message")).strip() or as_str(error.get("type")).strip() or None
            flushed = self._flush()
            if isinstance(stats := line.get("stats"), Mapping):
                flushed.append(UsageReported(_usage(stats)))
            return flushed
        return []

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        return finish_run(
            CLI_NAME,
            succeeded=self._status == "success",
            failed=self._status is not None and self._status != "success",
            message=self._failure,
            fallback=None,
            exit_code=exit_code,
            stderr_tail=stderr_tail,
            interrupted=interrupted,
            exit_names=EXIT_NAMES,
        )

    def _flush(self) -> list[SessionStarted | ItemProduced | UsageReported]:
        """The gathered chunks as one assistant_message (none when they are only whitespace)."""
        text = "".join(self._pending)
        self._pending = []
        return [ItemProduced("assistant_message", text)] if text.strip() else []


def _usage(stats: Mapping[str, Any]) -> Usage:
    """The run's usage from `result.stats` (thoughts: the part of the total neither input nor output)."""
    input_tokens = as_count(stats.get("input_tokens")) or 0
    output_tokens = as_count(stats.get("output_tokens")) or 0
    total = as_count(stats.get("total_tokens")) or 0
    reasoning = max(0, total - input_tokens - output_tokens)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens + reasoning,
        cached_tokens=as_count(stats.get("cached")) or 0,
        reasoning_tokens=reasoning,
        provider_ms=as_count(stats.get("duration_ms")),
    )


def _tool_item(name: str, parameters: Mapping[str, Any], result: Mapping[str, Any]) -> ItemProduced:
    """The item for a finished tool call, from its `tool_use` and this `tool_result`."""
    failed = result.get("status") != "success"
    error = as_str(as_mapping(result.get("error")).get("message")).strip() or None
    if failed and error is None:
        error = as_str(as_mapping(result.get("error")).get("type")).strip() or "the tool reported an error"
    output, truncated = clip_tail(as_str(result.get("output")))
    status = "failed" if failed else "completed"

    def text(base: str) -> str:
        return with_failure(base, error or "") if failed else base

    if name == "run_shell_command":
        command = as_str(parameters.get("command"))
        return shell_item(command, output, truncated, status, error, text(clip_head(command) or "(command)"))
    if name in FILE_TOOLS:
        path = as_str(parameters.get("file_path"))
        return file_change_item(name, path, FILE_TOOLS[name], status, error, text(clip_head(path) or name))
    server, tool = _mcp_name(name)
    return tool_call_item(server, tool, parameters, None if failed else output, error, status, text)


def _mcp_name(name: str) -> tuple[str | None, str]:
    """`mcp_<server>_<tool>` -> (server, tool); server aliases contain no `_` (Gemini's own rule)."""
    if name.startswith("mcp_"):
        server, sep, tool = name.removeprefix("mcp_").partition("_")
        if sep and server and tool:
            return server, tool
    return None, name
