"""Which coder CLIs can ask a person before a guarded action, and how each is started to do so.

At access level `approval-required` (not in plan mode), when the run has a gate
(`RunSpec.approvals`), a CLI with a host protocol for approvals is started in that mode instead of
its one-shot headless mode, driven by `peerd.providers.duplex`:

- Claude Code (`claude_stdio`): `--input-format stream-json --permission-prompt-tool stdio`,
  whose `can_use_tool` control requests are answered on stdin;
- Codex (`codex_appserver`): `codex app-server` (JSON-RPC 2.0 on stdio), whose
  `*/requestApproval` server requests are answered;
- Gemini CLI (`gemini_acp`): ACP (`--experimental-acp`, JSON-RPC 2.0 on stdio), whose
  `session/request_permission` requests are answered.

Each module's `duplex_launch` returns the launch and its pure driver, or None where that CLI (or
its pinned version) has no such protocol, and the run keeps today's behaviour: the nearest
narrower mode, said in a notice.
"""

from __future__ import annotations

from pathlib import Path

from peerd.config import ProviderConfig
from peerd.providers import claude_stdio, codex_appserver, gemini_acp
from peerd.providers.cli import Launch, ToolBinding
from peerd.providers.duplex import DuplexDriver
from peerd.runtime.provider import RunSpec


def asks_person(spec: RunSpec) -> bool:
    """Whether this run's guarded actions go to a person (else nobody can be asked)."""
    return (
        spec.approvals is not None
        and spec.runtime_mode == "approval-required"
        and spec.interaction_mode != "plan"
    )


def duplex_launch(
    kind: str, binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[Launch, DuplexDriver] | None:
    if kind == "claude":
        return claude_stdio.duplex_launch(binary, spec, config, binding, scratch)
    if kind == "codex":
        return codex_appserver.duplex_launch(binary, spec, config, binding, scratch)
    if kind == "gemini":
        return gemini_acp.duplex_launch(binary, spec, config, binding, scratch)
    return None
