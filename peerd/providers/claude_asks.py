"""What Claude Code asks before a guarded action, as peerd's `ApprovalAsk` (pure but for the reader).

Claude Code's `can_use_tool` request names the tool and its exact input (see `claude_stdio`):

- `Bash` -> `command`: {"command": the command line, "cwd": the run's working directory}. The
  input's `description` is the model's own account of the command, so it is never shown in place
  of the command: the summary is the command itself;
- `Edit`, `MultiEdit`, `Write`, `NotebookEdit` -> `file_change`: the path as Claude gave it and a
  unified diff. A `Write` is diffed against the file's current text and an `Edit` applied to it,
  read through a `FileReader` given at construction (`worktree_reader`: only regular files inside
  the run's worktree, size-capped; anything else is "not shown"), so the driver itself does no I/O;
- `mcp__<server>__<tool>` -> `mcp_tool`: {"server", "tool", "arguments"} (peerd's own tools are
  allowed on the command line and never asked about: peerd checks them itself);
- anything else -> `tool`: {"input": the raw input}.

`detail` holds only the action itself (never the model's descriptions), so the same action always
has the same identity for the approval rules (`peerd.approvals.rules.digest`).
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from peerd.providers.stream_common import as_list, as_mapping, as_str, clip_head
from peerd.runtime.gate import ApprovalAsk, command_summary, file_change_summary

FILE_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit"})
# How much of a file the reader shows a person (a diff of a larger file says it is not shown).
MAX_READ_BYTES = 512 * 1024
# How much of a diff goes into one question; a longer one is cut and says so.
MAX_DIFF_CHARS = 64_000
SUMMARY_ARGS_CHARS = 160


@dataclass(frozen=True)
class OnDisk:
    """A file as the reader found it: its text, missing, or there but not shown (outside the
    worktree, not a regular file, too large, not UTF-8)."""

    state: Literal["file", "missing", "hidden"]
    text: str = ""


FileReader = Callable[[str], OnDisk]


def worktree_reader(root: Path, *, limit: int = MAX_READ_BYTES) -> FileReader:
    """A reader of the regular files below `root` only, for the diffs a person sees.

    A path outside the worktree is never read, nor is its existence told: the person deciding may
    be on another machine, and the model names the path. The path is walked one directory at a
    time without following symlinks (a symlink anywhere in it is "not shown"), so a run that swaps
    a directory for a symlink meanwhile cannot point the reader elsewhere."""
    roots = [str(root), str(root.resolve())]

    def read(path: str) -> OnDisk:
        parts = _below(path, roots)
        if not parts:
            return OnDisk("hidden")
        try:
            return _read_below(roots[-1], parts, limit)
        except FileNotFoundError:
            return OnDisk("missing")
        except (OSError, ValueError):
            return OnDisk("hidden")

    return read


def _below(path: str, roots: list[str]) -> list[str]:
    """The path's parts below one of `roots` (lexically, `..` resolved), or [] when outside."""
    for base in roots:
        parts = list(Path(os.path.relpath(os.path.normpath(Path(base) / path), base)).parts)
        if parts and parts != ["."] and parts[0] != "..":
            return parts
    return []


def _read_below(base: str, parts: list[str], limit: int) -> OnDisk:
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(base, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            child = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        if not stat.S_ISREG(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
            return OnDisk("hidden")  # not opened at all: a FIFO or a device could block or act
        file = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(file).st_mode):
            return OnDisk("hidden")
        data = os.read(file, limit + 1)
    finally:
        os.close(file)
    if len(data) > limit:
        return OnDisk("hidden")
    try:
        return OnDisk("file", data.decode("utf-8"))
    except UnicodeDecodeError:
        return OnDisk("hidden")


def printable(text: str) -> str:
    """A summary line without control characters (a terminal shows it as it is)."""
    return "".join("?" if unicodedata.category(ch).startswith("C") else ch for ch in text)


def ask_for(key: str, request: Mapping[str, Any], *, cwd: str, read: FileReader) -> ApprovalAsk:
    """The question for one `can_use_tool` request (`key`: its request id)."""
    tool = as_str(request.get("tool_name")) or "unknown tool"
    tool_input = as_mapping(request.get("input"))
    if tool == "Bash":
        command = as_str(tool_input.get("command"))
        return ApprovalAsk(
            key, "command", tool, printable(command_summary(command, cwd)), {"command": command, "cwd": cwd}
        )
    if tool in FILE_TOOLS:
        change = file_change(tool, tool_input, cwd=cwd, read=read)
        summary = file_change_summary([shown_path(change["path"], cwd)])
        return ApprovalAsk(key, "file_change", tool, printable(summary), {"changes": [change]})
    server, name = mcp_name(tool)
    if server is not None:
        summary = f"call {server}.{name} with {clip_head(compact(tool_input), SUMMARY_ARGS_CHARS)}"
        detail = {"server": server, "tool": name, "arguments": dict(tool_input)}
        return ApprovalAsk(key, "mcp_tool", tool, printable(summary), detail)
    summary = f"use {tool} with {clip_head(compact(tool_input), SUMMARY_ARGS_CHARS)}"
    return ApprovalAsk(key, "tool", tool, printable(summary), {"input": dict(tool_input)})


def file_change(tool: str, tool_input: Mapping[str, Any], *, cwd: str, read: FileReader) -> dict[str, str]:
    """{"path", "kind", "diff"} for one file tool's input."""
    path = as_str(tool_input.get("file_path")) or as_str(tool_input.get("notebook_path"))
    label = shown_path(path, cwd)
    on_disk = read(path) if path else OnDisk("hidden")
    if tool == "Write":
        content = as_str(tool_input.get("content"))
        if on_disk.state == "hidden":
            note = f"(the current content of {label}, if any, is not shown)\n"
            return {"path": path, "kind": "update", "diff": note + unified("", content, label)}
        kind = "add" if on_disk.state == "missing" else "update"
        return {"path": path, "kind": kind, "diff": unified(on_disk.text, content, label)}
    if tool == "NotebookEdit":
        cell = as_str(tool_input.get("cell_id")) or "new cell"
        mode = as_str(tool_input.get("edit_mode")) or "replace"
        header = f"(notebook {label}, {mode} {cell}, {as_str(tool_input.get('cell_type')) or 'cell'})\n"
        new = "" if mode == "delete" else as_str(tool_input.get("new_source"))
        return {"path": path, "kind": "update", "diff": header + unified("", new, f"{label} [{cell}]")}
    edits = [as_mapping(e) for e in as_list(tool_input.get("edits"))] if tool == "MultiEdit" else [tool_input]
    if on_disk.state == "file" and (after := apply_edits(on_disk.text, edits)) is not None:
        return {"path": path, "kind": "update", "diff": unified(on_disk.text, after, label)}
    # The file is not shown (or the text to replace is not in it: Claude will refuse the edit):
    # each replacement on its own.
    parts = [unified(as_str(e.get("old_string")), as_str(e.get("new_string")), label) for e in edits]
    return {"path": path, "kind": "update", "diff": clip_diff("".join(parts))}


def apply_edits(text: str, edits: list[Mapping[str, Any]]) -> str | None:
    """The text after Claude's string replacements, or None when one of them does not apply."""
    for edit in edits:
        old, new = as_str(edit.get("old_string")), as_str(edit.get("new_string"))
        if not old or old not in text:
            return None
        text = text.replace(old, new) if edit.get("replace_all") is True else text.replace(old, new, 1)
    return text


def unified(before: str, after: str, label: str) -> str:
    """A unified diff (the person reads it; a very long one is cut and says so)."""
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), f"a/{label}", f"b/{label}", lineterm=""
    )
    return clip_diff("\n".join(lines) + "\n")


def clip_diff(diff: str) -> str:
    if len(diff) <= MAX_DIFF_CHARS:
        return diff
    return diff[:MAX_DIFF_CHARS] + f"\n… (diff cut here: {len(diff) - MAX_DIFF_CHARS} more characters)\n"


def shown_path(path: str, cwd: str) -> str:
    """The path relative to the run's directory when it is inside it, else as given."""
    try:
        relative = Path(path).relative_to(cwd)
    except ValueError:
        return path
    return str(relative) if str(relative) != "." else path


def mcp_name(name: str) -> tuple[str | None, str]:
    """`mcp__<server>__<tool>` -> (server, tool); a built-in tool -> (None, name)."""
    if name.startswith("mcp__"):
        server, sep, tool = name.removeprefix("mcp__").partition("__")
        if sep and server and tool:
            return server, tool
    return None, name


def compact(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "), default=str)
