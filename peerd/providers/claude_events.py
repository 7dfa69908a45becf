"""Claude Code `-p --output-format stream-json --verbose` stdout -> peerd provider events (pure).

Format of claude-code 2.1.332. Claude writes one `assistant` line per completed content block and
reports each tool's outcome later in a `user` line (`tool_result`), so a tool item is emitted when
its result arrives, joined to the remembered `tool_use` by id. Lines of sub-agents
(`parent_tool_use_id` set) are the sub-agent's own work and make no items. The `result` line ends
the turn: its `result` text is the reply, and `permission_denials` tell that the run's access level
stopped tools, which peerd reports as a failure rather than a clean success. It also carries the
turn's `usage` (cache reads and writes apart from `input_tokens`), `total_cost_usd` and `duration_ms`:
the run's usage, reported once, at the end (`peerd.core.usage`). `total_cost_usd` is the session's
running total (a resumed session counts its earlier runs again, claude-code 2.1.332 measured): the
run's cost is it less what the session cost before (`cost_before`, from peerd's record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from peerd.core.usage import Usage
from peerd.providers.stream_common import (
    as_count,
    as_float,
    as_list,
    as_mapping,
    as_str,
    clip_head,
    clip_tail,
    file_change_item,
    finish_run,
    joined_text,
    shell_item,
    tool_call_item,
    with_failure,
)
from peerd.runtime.provider import ItemProduced, RunFinished, SessionStarted, UsageReported

CLI_NAME = "Claude Code"
EXIT_NAMES: Mapping[int, str] = {1: "error", 143: "terminated"}
FILE_TOOLS: Mapping[str, str] = {
    "Edit": "edit",
    "MultiEdit": "edit",
    "NotebookEdit": "edit",
    "Write": "write",
}
# Why a run stopped early, for the error subtypes of `result`.
SUBTYPE_TEXT: Mapping[str, str] = {
    "error_max_turns": "Claude Code reached its turn limit",
    "error_max_budget_usd": "Claude Code reached its budget limit",
    "error_during_execution": "Claude Code failed during execution",
    "error_max_structured_output_retries": "Claude Code could not produce the structured output",
}


class ClaudeEvents:
    """Parser state for one `claude -p` stream-json run."""

    def __init__(self, *, cost_before: float | None = None) -> None:
        # What the resumed session had cost before this run: `total_cost_usd` is the session's
        # running total, and the run's own cost is the total less this.
        self._cost_before = cost_before
        self._sessions: set[str] = set()
        self._tools: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._last_item: ItemProduced | None = None
        self._last_text: str | None = None
        self._result: Mapping[str, Any] | None = None
        self._messages: dict[str, Usage] = {}  # per model message id: its usage as last streamed

    @property
    def reply(self) -> str | None:
        """`result.result` of a successful turn; before (or without) one, the last assistant text."""
        if self._succeeded():
            text = as_str(as_mapping(self._result).get("result"))
            if text.strip():
                return text
        return self._last_text

    @property
    def succeeded(self) -> bool:
        """Whether the turn's `result` said success (tools may still have been denied)."""
        return self._succeeded()

    @property
    def permission_denials(self) -> list[Mapping[str, Any]]:
        """The `result`'s `permission_denials` ({tool_name, tool_use_id, tool_input} each)."""
        return [as_mapping(d) for d in as_list(as_mapping(self._result).get("permission_denials"))]

    def feed(self, line: Mapping[str, Any]) -> list[SessionStarted | ItemProduced | UsageReported]:
        kind = line.get("type")
        events: list[SessionStarted | ItemProduced | UsageReported] = []
        session_id = as_str(line.get("session_id"))
        # The id is in `system/init`; other lines carry it too, which covers streams without an init
        # (e.g. `--bare`). Each distinct id is reported once.
        if (
            session_id
            and session_id not in self._sessions
            and (line.get("subtype") == "init" or not self._sessions)
        ):
            self._sessions.add(session_id)
            events.append(SessionStarted(session_id))
        if kind == "assistant" and self._result is None and (so_far := self._message_usage(line)):
            events.append(UsageReported(so_far))
        if kind == "result":
            self._result = line
            if self._succeeded():
                self._emit_text(as_str(line.get("result")), events, always=False)
            if (usage := _usage(line)) is not None:
                events.append(UsageReported(usage.cost_since(self._cost_before)))
        elif line.get("parent_tool_use_id") is not None:
            pass  # a sub-agent's work: its parent's tool item stands for it
        elif kind == "assistant":
            self._assistant(line, events)
        elif kind == "user":
            for block in map(as_mapping, as_list(as_mapping(line.get("message")).get("content"))):
                if block.get("type") == "tool_result" and (item := self._tool_item(block)) is not None:
                    self._emit(item, events)
        return events

    def finish(self, *, exit_code: int, stderr_tail: str, interrupted: bool) -> RunFinished:
        result = as_mapping(self._result)
        outcome = finish_run(
            CLI_NAME,
            succeeded=self._succeeded(),
            failed=self._result is not None and not self._succeeded(),
            message=_failure_text(result) if self._result is not None else None,
            fallback=None,
            exit_code=exit_code,
            stderr_tail=stderr_tail,
            interrupted=interrupted,
            exit_names=EXIT_NAMES,
        )
        denials = as_list(result.get("permission_denials"))
        if outcome.status == "completed" and denials:
            return RunFinished("failed", error=_denials_text(denials), exit_code=exit_code)
        return outcome

    def _message_usage(self, line: Mapping[str, Any]) -> Usage | None:
        """The run's usage so far from the model messages seen (sub-agents' too), before `result`.

        Each `assistant` line repeats its message's `usage` as the stream had it when the message
        started (output counted as 1 then), so this is a lower bound while the run lasts, growing with
        each model request; the `result`'s figures replace it. None when the line adds nothing."""
        message = as_mapping(line.get("message"))
        message_id = as_str(message.get("id"))
        usage = _counts(as_mapping(message.get("usage")))
        if not message_id or usage is None or self._messages.get(message_id) == usage:
            return None
        self._messages[message_id] = usage
        so_far: Usage | None = None
        for each in self._messages.values():
            so_far = each if so_far is None else so_far.plus(each)
        return so_far

    def _succeeded(self) -> bool:
        result = as_mapping(self._result)
        return result.get("subtype") == "success" and result.get("is_error") is not True

    def _assistant(
        self, line: Mapping[str, Any], events: list[SessionStarted | ItemProduced | UsageReported]
    ) -> None:
        # An assistant line with `error` set is Claude's own synthetic "API Error: ..." message: a
        # notice, not part of the reply (the failing `result` carries the error for the run).
        api_error = as_str(line.get("error"))
        for block in map(as_mapping, as_list(as_mapping(line.get("message")).get("content"))):
            block_type = block.get("type")
            if block_type == "text":
                text = as_str(block.get("text"))
                if api_error and text.strip():
                    self._emit(ItemProduced("notice", text, {"error": api_error}), events)
                elif not api_error:
                    self._emit_text(text, events, always=True)
            elif block_type == "tool_use":
                tool_id = as_str(block.get("id"))
                if tool_id:
                    self._tools[tool_id] = (as_str(block.get("name")), as_mapping(block.get("input")))

    def _emit_text(
        self, text: str, events: list[SessionStarted | ItemProduced | UsageReported], *, always: bool
    ) -> None:
        """Emit an assistant text, never the same text twice in a row.

        `always=False` (the result) skips a text equal to the last assistant text even with tool
        items in between: the last assistant_message item must be the reply, and it already is.
        """
        if not text.strip():
            return
        last = self._last_item
        if (always and last is not None and last.kind == "assistant_message" and last.text == text) or (
            not always and text == self._last_text
        ):
            return
        self._last_text = text
        self._emit(ItemProduced("assistant_message", text), events)

    def _emit(self, item: ItemProduced, events: list[SessionStarted | ItemProduced | UsageReported]) -> None:
        self._last_item = item
        events.append(item)

    def _tool_item(self, block: Mapping[str, Any]) -> ItemProduced | None:
        """The item for a finished tool call, from its `tool_use` and this `tool_result`."""
        tool = self._tools.pop(as_str(block.get("tool_use_id")), None)
        if tool is None:
            return None  # no matching tool_use seen: nothing sensible to show
        name, tool_input = tool
        content = block.get("content")
        output_text = content if isinstance(content, str) else joined_text(as_list(content))
        output, truncated = clip_tail(output_text)
        is_error = block.get("is_error") is True
        status = "failed" if is_error else "completed"
        error = output if is_error else None

        def text(base: str) -> str:
            return with_failure(base, output_text) if is_error else base

        if name == "Bash":
            command = as_str(tool_input.get("command"))
            return shell_item(
                command, output, truncated, status, error, text(clip_head(command) or "(command)")
            )
        if name in FILE_TOOLS:
            path = as_str(tool_input.get("file_path")) or as_str(tool_input.get("notebook_path"))
            return file_change_item(
                name, path, FILE_TOOLS[name], status, error, text(clip_head(path) or name)
            )
        server, tool_name = _mcp_name(name)
        return tool_call_item(
            server, tool_name, tool_input, None if is_error else output, error, status, text
        )


def _usage(result: Mapping[str, Any]) -> Usage | None:
    """The turn's usage from `result`, with its cost and duration; None without `usage`."""
    usage = result.get("usage")
    if not isinstance(usage, Mapping) or (counts := _counts(usage)) is None:
        return None
    return replace(
        counts,
        cost_usd=as_float(result.get("total_cost_usd")),
        provider_ms=as_count(result.get("duration_ms")),
    )


def _counts(usage: Mapping[str, Any]) -> Usage | None:
    """An Anthropic `usage` object: cache reads and writes are input too. None when it is empty."""
    if not usage:
        return None
    cached = as_count(usage.get("cache_read_input_tokens")) or 0
    written = as_count(usage.get("cache_creation_input_tokens")) or 0
    return Usage(
        input_tokens=(as_count(usage.get("input_tokens")) or 0) + cached + written,
        output_tokens=as_count(usage.get("output_tokens")) or 0,
        cached_tokens=cached,
        reasoning_tokens=as_count(as_mapping(usage.get("output_tokens_details")).get("thinking_tokens")) or 0,
    )


def _mcp_name(name: str) -> tuple[str | None, str]:
    """`mcp__<server>__<tool>` -> (server, tool); a built-in tool -> (None, name)."""
    if name.startswith("mcp__"):
        server, sep, tool = name.removeprefix("mcp__").partition("__")
        if sep and server and tool:
            return server, tool
    return None, name


def _failure_text(result: Mapping[str, Any]) -> str:
    """Claude's own words for a failed turn: its `errors[]`, else the result text, else the subtype."""
    subtype = as_str(result.get("subtype"))
    errors = "; ".join(text.strip() for text in map(as_str, as_list(result.get("errors"))) if text.strip())
    detail = errors or as_str(result.get("result")).strip()
    if subtype and subtype != "success":
        head = f"{SUBTYPE_TEXT[subtype]} ({subtype})" if subtype in SUBTYPE_TEXT else subtype
        return f"{head}: {detail}" if detail else head
    return detail or "Claude Code reported an error"


def _denials_text(denials: list[Any]) -> str:
    """Which tools the access level refused, each named once in order of the first refusal."""
    names = list(dict.fromkeys(as_str(as_mapping(d).get("tool_name")) or "unknown tool" for d in denials))
    return (
        f"Claude Code denied {len(denials)} tool call(s) this run's access level does not allow: "
        f"{', '.join(names)}. The reply may be incomplete."
    )
