"""Codex `exec --json` stdout -> peerd provider events (pure; format of codex 0.171.0).

Only `item.completed` makes items: `item.started`/`item.updated` are progress of the same item and
would duplicate it. Top-level `error` events are not fatal (Codex emits "Reconnecting... k/N" ones while
it retries), so they make no item; the last one is kept to explain a failed turn. Success is
`turn.completed`, failure `turn.failed`; see `peerd.providers.stream_common.finish_run`.
`turn.completed` carries `usage` (cached input is part of `input_tokens`, reasoning part of
`output_tokens`; no cost, no duration): the session's running total (codex 0.171.0: a resumed
session's first turn reports the earlier runs' tokens too), so the run's usage is the last total
less what the session had spent before the run (`usage_before`, from peerd's own record).

Retries are bounded here, not by Codex's config: its built-in providers' `request_max_retries` /
`stream_max_retries` cannot be set per run, and against a model server that keeps failing they
keep a run "running" for ~45 s of silent retries (36 requests measured). Each top-level `error`
event is one failed attempt; after `model_retries` retries with no progress in between, the parser
says it gives up (`give_up_reason`) and the run is stopped and failed with that reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from peerd.core.usage import Usage
from peerd.providers.stream_common import (
    as_count,
    as_int,
    as_list,
    as_mapping,
    as_str,
    clip_head,
    clip_tail,
    finish_run,
    joined_text,
    with_failure,
)
from peerd.runtime.provider import ItemProduced, RunFinished, SessionStarted, UsageReported

CLI_NAME = "Codex"
# Lines Codex prints on stderr in ordinary runs; they say nothing about why a run failed.
STDERR_NOISE = (
    "Reading additional input from stdin...",
    "Reading prompt from stdin...",
    "WARNING: proceeding, even though we could not create PATH aliases",
)
EXIT_NAMES: Mapping[int, str] = {1: "fatal error", 2: "usage error"}


class CodexEvents:
    """Parser state for one `codex exec --json` run."""

    def __init__(self, *, model_retries: int | None = None, usage_before: Usage | None = None) -> None:
        self._model_retries = model_retries
        self._failed_attempts = 0  # top-level errors since the last progress
        self._give_up: str | None = None
        self._session_id: str | None = None
        self._reply: str | None = None
        self._succeeded = False
        self._failed = False
        self._failure: str | None = None
        self._last_error: str | None = None
        self._usage: Usage | None = None
        self._usage_before = usage_before

    @property
    def give_up_reason(self) -> str | None:
        """Set once the model's attempts exceed `model_retries`: the run should be stopped."""
        return self._give_up

    @property
    def reply(self) -> str | None:
        """The last `agent_message` of the turn, as the Codex SDK's `Thread.run()` takes it."""
        return self._reply

    def feed(self, line: Mapping[str, Any]) -> list[SessionStarted | ItemProduced | UsageReported]:
        kind = line.get("type")
        if kind == "thread.started":
            thread_id = as_str(line.get("thread_id"))
            if thread_id and thread_id != self._session_id:
                self._session_id = thread_id
                return [SessionStarted(thread_id)]
        elif kind == "turn.started":
            self._reply = None
        elif kind == "item.completed":
            self._failed_attempts = 0  # the model answered: earlier failures were transient
            item = _item(as_mapping(line.get("item")))
            if item is not None and item.kind == "assistant_message":
                self._reply = item.text
            return [item] if item is not None else []
        elif kind == "turn.completed":
            self._succeeded, self._failed = True, False
            if isinstance(usage := line.get("usage"), Mapping):
                total = _usage(usage)
                self._usage = total if self._usage_before is None else total.since(self._usage_before)
                return [UsageReported(self._usage)]
        elif kind == "turn.failed":
            self._succeeded, self._failed = False, True
            self._failure = as_str(as_mapping(line.get("error")).get("message")).strip() or None
        elif kind == "error":
            self._last_error = as_str(line.get("message")).strip() or self._last_error
            self._failed_attempts += 1
            limit = self._model_retries
            if limit is not None and self._give_up is None and self._failed_attempts > limit:
                self._give_up = (
                    f"The model server failed {limit + 1} attempts in a row (model_retries = {limit}); "
                    f"peerd stopped Codex. Last error: {self._last_error or 'none given'}"
                )
        return []

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        if self._give_up is not None and not self._succeeded:
            return RunFinished("failed", error=self._give_up, exit_code=exit_code)
        return finish_run(
            CLI_NAME,
            succeeded=self._succeeded,
            failed=self._failed,
            message=self._failure,
            fallback=self._last_error,
            exit_code=exit_code,
            stderr_tail=stderr_tail,
            interrupted=interrupted,
            noise_prefixes=STDERR_NOISE,
            exit_names=EXIT_NAMES,
        )


def _usage(usage: Mapping[str, Any]) -> Usage:
    """One turn's `usage` (cached input is part of input, reasoning part of output)."""
    return Usage(
        input_tokens=as_count(usage.get("input_tokens")) or 0,
        output_tokens=as_count(usage.get("output_tokens")) or 0,
        cached_tokens=as_count(usage.get("cached_input_tokens")) or 0,
        reasoning_tokens=as_count(usage.get("reasoning_output_tokens")) or 0,
    )


def _item(item: Mapping[str, Any]) -> ItemProduced | None:
    """One completed Codex item as a peerd item, or None for kinds peerd does not show."""
    kind = item.get("type")
    status = as_str(item.get("status")) or "completed"
    if kind == "agent_message":
        text = as_str(item.get("text"))
        return ItemProduced("assistant_message", text) if text.strip() else None
    if kind == "command_execution":
        command = as_str(item.get("command"))
        output, truncated = clip_tail(as_str(item.get("aggregated_output")))
        data: dict[str, Any] = {
            "command": command,
            "exit_code": as_int(item.get("exit_code")),
            "output": output,
            "output_truncated": truncated,
            "status": status,
        }
        label = clip_head(command) or "(command)"
        # `declined`: the sandbox/approval policy refused to run it; say so where the user looks.
        return ItemProduced("command", f"{label} (declined)" if status == "declined" else label, data)
    if kind == "file_change":
        changes = [
            {"path": as_str(change.get("path")), "kind": as_str(change.get("kind"))}
            for change in map(as_mapping, as_list(item.get("changes")))
        ]
        paths = ", ".join(change["path"] for change in changes if change["path"])
        data = {"changes": changes, "status": status}
        return ItemProduced("file_change", clip_head(paths) or "(file change)", data)
    if kind == "mcp_tool_call":
        return _mcp_item(item, status)
    if kind == "error":
        message = as_str(item.get("message")).strip()
        return ItemProduced("notice", message) if message else None
    if kind == "web_search":
        query = as_str(item.get("query"))
        data = {"tool": "web_search", "query": query}
        return ItemProduced("tool_call", clip_head(f"web_search: {query}"), data)
    if kind == "todo_list":
        todos = [
            {"text": as_str(todo.get("text")), "completed": todo.get("completed") is True}
            for todo in map(as_mapping, as_list(item.get("items")))
        ]
        done = sum(1 for todo in todos if todo["completed"])
        text = f"todo list: {done}/{len(todos)} done"
        return ItemProduced("tool_call", text, {"tool": "todo_list", "items": todos})
    # `reasoning` is the model's private notes, and unknown kinds are newer than this parser.
    return None


def _mcp_item(item: Mapping[str, Any], status: str) -> ItemProduced:
    """An MCP call; a refused or failed call says why in its text (e.g. the approval policy)."""
    server, tool = as_str(item.get("server")), as_str(item.get("tool"))
    name = f"{server}.{tool}" if server else tool or "mcp tool"
    result = as_mapping(item.get("result"))
    result_text = joined_text(as_list(result.get("content")))
    if not result_text and result.get("structured_content") is not None:
        result_text = json.dumps(result.get("structured_content"), ensure_ascii=False, default=str)
    error = as_str(as_mapping(item.get("error")).get("message")).strip() or None
    data: dict[str, Any] = {
        "server": server,
        "tool": tool,
        "arguments": item.get("arguments"),
        "result": clip_tail(result_text)[0] if result else None,
        "error": error,
        "status": status,
    }
    failed = error is not None or status == "failed"
    # A tool that answered with an error (MCP `isError`) fails the call with no `error` of Codex's
    # own: its answer is the reason (peerd's is "code: message").
    reason = error or (result_text if failed else "")
    return ItemProduced("tool_call", with_failure(name, reason) if failed else name, data)
