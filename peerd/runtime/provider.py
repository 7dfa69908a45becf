"""The provider interface: a run spec in, a stream of provider events out, interruptible.

A provider turns one run of a thread (prompt, working directory, model, modes, the provider session
to resume, the agent-tool binding) into events. The run manager owns everything durable: it writes
items, statuses and the session id to the store; a provider only translates a coder's own output.

Every `ProviderRun.events()` stream ends with exactly one `RunFinished`, also when the process
crashed or was interrupted, so the run manager always learns how the run ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from peerd.core.usage import Usage
from peerd.runtime.gate import ApprovalGate
from peerd.runtime.sandbox import Confinement

ItemKind = Literal[
    "user_message", "assistant_message", "command", "file_change", "tool_call", "error", "notice"
]
FinishStatus = Literal["completed", "failed", "interrupted"]


@dataclass(frozen=True)
class RunSpec:
    thread_id: str
    run_id: str
    prompt: str
    cwd: Path
    model: str | None
    runtime_mode: str
    interaction_mode: str
    resume_session: str | None
    # Provider-private state (sessions, scratch files) lives here, under the daemon's home.
    state_dir: Path
    # Environment variables that bind peerd's agent tools to this run (socket path and a run
    # token). Passed through the environment, never argv.
    tool_env: Mapping[str, str] = field(default_factory=dict)
    # peerd's sandbox for this run (see `peerd.runtime.sandbox`), or None when it runs unconfined.
    # The provider adds what its CLI needs (install dir, state dirs, network) and runs inside it.
    confinement: Confinement | None = None
    # Who decides a guarded action (access level approval-required): a CLI with a protocol for
    # asking its host (see `peerd.providers.duplex`) asks this gate; None: nobody can be asked.
    approvals: ApprovalGate | None = None
    # What the thread's earlier runs spent in the session this run resumes: a CLI that reports the
    # session's running total (Codex) reports this run's part as the total less this.
    usage_before: Usage | None = None


@dataclass(frozen=True)
class SessionStarted:
    """The provider's own session id, to resume the conversation on the thread's next run."""

    session_id: str


@dataclass(frozen=True)
class ItemProduced:
    kind: ItemKind
    text: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunFinished:
    status: FinishStatus
    error: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class UsageReported:
    """What the run has spent so far (a snapshot, not a delta; see `peerd.core.usage`)."""

    usage: Usage


ProviderEvent = SessionStarted | ItemProduced | UsageReported | RunFinished


class ProviderRun(Protocol):
    @property
    def pgid(self) -> int | None:
        """The process group the run lives in (None when it runs in-process)."""

    def events(self) -> AsyncIterator[ProviderEvent]:
        """Events in order; the last one is always a `RunFinished`."""

    async def interrupt(self) -> None:
        """Stop the run: signal its whole process group, escalating until it is gone."""


class Provider(Protocol):
    name: str

    async def start(self, spec: RunSpec) -> ProviderRun:
        """Start the run; raise `ProviderError` with the coder's own message if it cannot start."""
