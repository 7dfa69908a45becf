"""Helpers shared by the coder-CLI stream parsers (`codex_events`, `claude_events`, `gemini_events`).

Pure functions, no I/O. The parsers receive each stdout line already decoded as JSON and must never
raise on odd input, so every field read goes through the type-checking readers here; the finish
rules (success needs the CLI's own success event and exit 0, an interrupt wins over a failure) are
the same for all three CLIs and live in `finish_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from peerd.runtime.provider import ItemProduced, RunFinished

# How much of a command's or tool's output an item keeps (the end matters most: errors, summaries).
OUTPUT_TAIL_CHARS = 4000
# How much of stderr a failure message keeps.
ERROR_TAIL_CHARS = 2000
# Item texts are one-glance summaries; the full values live in the item's data.
ITEM_TEXT_CHARS = 500
# How much of an error message goes into an item's text.
ERROR_SNIPPET_CHARS = 300


def as_str(value: object) -> str:
    """The value if it is a string, else "" (wrong field types are treated as absent)."""
    return value if isinstance(value, str) else ""


def as_mapping(value: object) -> Mapping[str, Any]:
    """The value if it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    """The value if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def as_int(value: object) -> int | None:
    """The value if it is an integer (JSON booleans are not), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_count(value: object) -> int | None:
    """The value if it is a non-negative integer (a token count, a duration), else None."""
    number = as_int(value)
    return number if number is not None and number >= 0 else None


def as_float(value: object) -> float | None:
    """The value if it is a finite non-negative number (JSON booleans are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if 0.0 <= number < float("inf") else None


def clip_head(text: str, limit: int = ITEM_TEXT_CHARS) -> str:
    """The start of `text`, marked with an ellipsis when cut: for short item texts."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_tail(text: str, limit: int = OUTPUT_TAIL_CHARS) -> tuple[str, bool]:
    """The end of `text` and whether it was cut: outputs end with what matters (errors, counts)."""
    return (text, False) if len(text) <= limit else (text[-limit:], True)


def first_line(text: str) -> str:
    """The first non-empty line, for putting an error message into a one-line item text."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def with_failure(text: str, error: str) -> str:
    """An item text that says the tool failed and why, so the feed shows it without opening data."""
    reason = clip_head(first_line(error), ERROR_SNIPPET_CHARS)
    return f"{text} (failed: {reason})" if reason else f"{text} (failed)"


def joined_text(blocks: Iterable[Any]) -> str:
    """The text of content blocks (`{"type": "text", "text": ...}`) joined by newlines; others are skipped."""
    parts = [as_str(as_mapping(block).get("text")) for block in blocks]
    return "\n".join(part for part in parts if part)


HEAD_LINE_CHARS = 400  # the first stderr line kept in a reason (a CLI's usage error comes first)


def tail_of_stderr(
    stderr: str, *, noise_prefixes: tuple[str, ...] = (), limit: int = ERROR_TAIL_CHARS
) -> str:
    """Why the run failed, from stderr: all of it when it fits in `limit` chars, else its first line
    and its last lines (without the CLI's known noise lines).

    With no terminal event, stderr is all a user gets to see why the run failed. The fatal message
    is usually at the end, but a CLI refusing its arguments says so first and then prints its whole
    usage text (Gemini: "Unknown arguments: ..." and 4 KB of help), so the first line is kept too.
    """
    lines = [line.rstrip() for line in stderr.splitlines()]
    kept = [line for line in lines if line.strip() and not line.lstrip().startswith(noise_prefixes)]
    whole = "\n".join(kept)
    if len(whole) <= limit:
        return whole
    first = kept[0][:HEAD_LINE_CHARS] if len(kept) > 1 else ""
    budget = limit - (len(first) + len("\n...\n") if first else 0)
    picked: list[str] = []
    size = 0
    for line in reversed(kept[1:] if first else kept):
        if picked and size + len(line) + 1 > budget:
            break
        picked.append(line)
        size += len(line) + 1
    tail = "\n".join(reversed(picked))[-budget:]
    return f"{first}\n...\n{tail}" if first else tail


def exit_code_text(cli: str, exit_code: int, names: Mapping[int, str]) -> str:
    """`"<cli> exited with code N (meaning)"`, naming the codes the CLI documents."""
    if exit_code < 0:
        return f"{cli} was ended by signal {-exit_code}"
    name = names.get(exit_code)
    return f"{cli} exited with code {exit_code}" + (f" ({name})" if name else "")


def finish_run(
    cli: str,
    *,
    succeeded: bool,
    failed: bool,
    message: str | None,
    fallback: str | None,
    exit_code: int,
    stderr_tail: str,
    interrupted: bool,
    noise_prefixes: tuple[str, ...] = (),
    exit_names: Mapping[int, str] | None = None,
) -> RunFinished:
    """The run's outcome from what the stream said and how the process ended.

    `succeeded`/`failed`: the CLI's own terminal success/failure event was seen (the last one wins,
    the caller decides). `message`: the CLI's own failure text; `fallback`: a weaker hint (e.g. the
    last non-fatal error) used before stderr when the failure event carries no text.
    """
    names = exit_names or {}
    stderr = tail_of_stderr(stderr_tail, noise_prefixes=noise_prefixes)
    if succeeded:
        # A run that completed before the interrupt took effect did complete, whatever the signal
        # did to the exit code afterwards.
        if exit_code == 0 or interrupted:
            return RunFinished("completed", exit_code=exit_code)
        error = f"{cli} reported success but " + exit_code_text(cli, exit_code, names).removeprefix(cli + " ")
        return RunFinished("failed", error=error + (f": {stderr}" if stderr else ""), exit_code=exit_code)
    if interrupted:
        return RunFinished("interrupted", exit_code=exit_code)
    if failed:
        error = message or fallback or stderr or exit_code_text(cli, exit_code, names)
        return RunFinished("failed", error=error, exit_code=exit_code)
    if stderr or fallback:
        return RunFinished("failed", error=stderr or fallback, exit_code=exit_code)
    error = exit_code_text(cli, exit_code, names)
    if exit_code == 0:
        error += " without reporting the end of its turn"
    return RunFinished("failed", error=error, exit_code=exit_code)


def file_change_item(
    tool: str, path: str, kind: str, status: str, error: str | None, text: str
) -> ItemProduced:
    """A file-editing tool's item (Claude's Edit/Write, Gemini's write_file/replace)."""
    data = {"tool": tool, "changes": [{"path": path, "kind": kind}], "status": status, "error": error}
    return ItemProduced("file_change", text, data)


def tool_call_item(
    server: str | None,
    tool: str,
    arguments: Mapping[str, Any],
    result: str | None,
    error: str | None,
    status: str,
    text: Callable[[str], str],
) -> ItemProduced:
    """Any other tool's item, MCP tools named `server.tool`."""
    data = {"server": server, "tool": tool, "arguments": dict(arguments), "result": result, "error": error,
            "status": status}  # fmt: skip
    label = f"{server}.{tool}" if server else tool or "tool"
    return ItemProduced("tool_call", text(clip_head(label)), data)


def shell_item(
    command: str, output: str, truncated: bool, status: str, error: str | None, text: str
) -> ItemProduced:
    """A shell tool's item (Claude's Bash, Gemini's run_shell_command): no exit code in the stream."""
    data = {"command": command, "exit_code": None, "output": output, "output_truncated": truncated,
            "status": status, "error": error}  # fmt: skip
    return ItemProduced("command", text, data)
