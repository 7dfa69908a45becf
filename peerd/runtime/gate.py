"""What a provider sees of approvals: one question per guarded action, one answer.

A CLI driver that can ask (Claude Code's permission prompts, Codex app-server's approval
requests, Gemini CLI's ACP permission requests, the scripted coder's `ask` step) turns the CLI's
own request into an `ApprovalAsk` and awaits `ApprovalGate.ask`. The gate records the question
durably, lets a person decide (here, or on the linked machine that started the run), and answers;
a deadline answers "deny" with a reason the model sees. The driver then answers the CLI in its own
protocol. A driver never decides by itself: no answer means no action.

This is the run layer's side of approvals: the run manager asks a `RunApprovals` (given to its
constructor by the daemon; `peerd/approvals/service.py:RunGates` is the one it is given) for the
gate of a run at approval-required, and tells it when a run ends. `peerd.runtime` never imports
`peerd.approvals`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from peerd.contracts import Thread

AskKind = Literal["command", "file_change", "mcp_tool", "tool"]


@dataclass(frozen=True)
class ApprovalAsk:
    """One guarded action a CLI wants to take, exactly as it asked.

    `key` is the CLI's own id for the request (Claude's tool_use_id, a JSON-RPC request id, a
    scripted step's index): unique within the run. `detail` is the exact input a person decides on:
    - command: {"command": "make test", "cwd": "/abs/dir"} (the command line as one string);
    - file_change: {"changes": [{"path": "a.py", "kind": "add|delete|update", "diff": "..."}]};
    - mcp_tool: {"server": "...", "tool": "...", "arguments": {...}};
    - tool: {"input": {...}} for anything else (the CLI's raw tool input).
    """

    key: str
    kind: AskKind
    tool: str  # the CLI's own tool name: Bash, Write, exec_command, apply_patch, run_shell_command
    summary: str  # one line a person reads: "run `make test` in /w/repo"
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ApprovalAnswer:
    """The decision. `message` is what the model sees when denied (the person's reason, or why
    peerd denied: the deadline passed, the run's link forbids approvals)."""

    allow: bool
    message: str = ""
    approval_id: str | None = None  # the durable record it came from (None: decided by a rule)


class ApprovalGate(Protocol):
    async def ask(self, ask: ApprovalAsk) -> ApprovalAnswer:
        """Record the question, wait for its decision (or deadline), return it. Never raises for a
        denial; raises only when the run is being torn down (CancelledError)."""
        ...


class RunApprovals(Protocol):
    """Who decides a run's guarded actions, as the run manager sees it."""

    async def gate_for(self, thread: Thread, run_id: str) -> ApprovalGate | None:
        """The gate for this run of `thread` (asked only at approval-required)."""
        ...

    async def run_ended(self, run_id: str, *, cut: bool) -> None:
        """The run is ending: its open questions are withdrawn, unless a stop of this daemon cut
        it (`cut`: they wait for the restart). Awaited before the run's end is recorded."""
        ...


def command_summary(command: str, cwd: str | None = None, *, limit: int = 200) -> str:
    """One line for a command: the command line, shortened, and where it runs."""
    line = " ".join(command.split())
    if len(line) > limit:
        line = line[: limit - 1] + "…"
    return f"run `{line}`" + (f" in {cwd}" if cwd else "")


def file_change_summary(paths: list[str], *, limit: int = 5) -> str:
    shown = ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")
    return f"change {shown}" if paths else "change files"
