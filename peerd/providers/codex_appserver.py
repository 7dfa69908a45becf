"""`codex app-server`: a Codex run whose guarded actions a person approves (see `peerd.providers.asking`).

Verified against codex-cli **0.171.0** (`codex app-server generate-json-schema` / `generate-ts`, and
by driving the real binary against tests/fakemodel.py); the protocol and driver are in
`peerd.providers.codex_rpc`. What this module decides:

- argv: `codex app-server` (stdio transport, its default) with peerd's MCP server as one
  `-c mcp_servers.peerd={...}` override exactly as `codex exec` gets it (`codex_mcp_flags`, shared
  with `peerd.providers.coders.codex_argv`): the daemon's loopback URL with the run token in the
  environment (`bearer_token_env_var`), never in argv; its tools `default_tools_approval_mode =
  "approve"` (peerd checks its own tools itself), `required = true`. Of the provider's configured
  `args` only the options `app-server` takes (`-c`, `--enable`, `--disable`, `--strict-config`)
  are kept; the others are `codex exec`'s and are left out with a notice.
  `--dangerously-bypass-approvals-and-sandbox` is never on this path (app-server has no such flag).
- the thread: approval policy `untrusted` (0.171 asks before every shell command, `ls` included,
  every patch and every MCP tool call of a server not set to approve; `on-request` with full
  access asks nothing, verified), sandbox `danger-full-access` inside peerd's sandbox (which
  confines the run: Codex's own nested sandbox cannot work there) and `workspace-write` outside it.
  The model is `spec.model or config.model`; `spec.resume_session` resumes the Codex thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from peerd.config import ProviderConfig
from peerd.providers.cli import MCP_SERVER_NAME, MCP_TOOL_TIMEOUT_S, TOKEN_ENV, Launch, ToolBinding
from peerd.providers.codex_rpc import CodexAppServerDriver
from peerd.providers.duplex import DuplexDriver
from peerd.runtime.provider import RunSpec

APPROVAL_POLICY = "untrusted"
SANDBOX_CONFINED = "danger-full-access"  # peerd's sandbox confines the run
SANDBOX_UNCONFINED = "workspace-write"  # Codex's own sandbox: writes only in the worktree
# Options of `codex app-server` that take a value, and the one that takes none.
_VALUED = frozenset({"-c", "--config", "--enable", "--disable"})
_FLAGS = frozenset({"--strict-config"})

CODEX_ASKS = (
    "Codex asks before each shell command, each file change and each MCP tool call of servers other "
    "than peerd's (codex app-server, approval policy untrusted); peerd asks a person and answers."
)
CODEX_CONFINED = (
    "Codex runs with its own sandbox off inside peerd's sandbox (nested, Codex's sandbox cannot work "
    "there); peerd's sandbox confines it, and the worktree is writable, as each write passes a person."
)


def toml_value(value: object) -> str:
    """A TOML value for `codex -c key=value` (JSON strings are valid TOML basic strings)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value))


def codex_mcp_flags(binding: ToolBinding | None) -> tuple[list[str], dict[str, str]]:
    """peerd's MCP server for one Codex run: the `-c` override and the environment it needs."""
    if binding is None:
        return [], {}
    env: dict[str, str] = {}
    server: dict[str, object]
    if binding.url:
        # The daemon's MCP endpoint; Codex sends the token it reads from TOKEN_ENV as a bearer.
        server = {"url": binding.url, "bearer_token_env_var": TOKEN_ENV}
        env[TOKEN_ENV] = binding.token
    else:
        server = {"command": binding.command, "args": binding.args, "env": binding.env}
    server.update(
        {
            # peerd's own tools are checked by peerd itself: Codex never asks about them (under
            # `codex exec`, whose approval policy is "never", every call would fail without this).
            "default_tools_approval_mode": "approve",
            "tool_timeout_sec": MCP_TOOL_TIMEOUT_S,
            "required": True,  # the first model request waits until peerd's tools are listed
        }
    )
    return ["-c", f"mcp_servers.{MCP_SERVER_NAME}={toml_value(server)}"], env


def app_server_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The provider's configured args split into those `codex app-server` takes and the rest."""
    kept: list[str] = []
    dropped: list[str] = []
    pending = False
    for arg in args:
        if pending:
            kept.append(arg)
            pending = False
        elif arg in _VALUED:
            kept.append(arg)
            pending = True
        elif arg in _FLAGS or any(arg.startswith(f"{option}=") for option in _VALUED if option[1] == "-"):
            kept.append(arg)
        else:
            dropped.append(arg)
    if pending:  # a trailing option without its value: leave it out rather than break the argv
        dropped.append(kept.pop())
    return kept, dropped


def thread_params(spec: RunSpec, config: ProviderConfig) -> dict[str, object]:
    params: dict[str, object] = {
        "cwd": str(spec.cwd),
        "approvalPolicy": APPROVAL_POLICY,
        "sandbox": SANDBOX_CONFINED if spec.confinement is not None else SANDBOX_UNCONFINED,
    }
    if model := spec.model or config.model:
        params["model"] = model
    return params


def duplex_launch(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> tuple[Launch, DuplexDriver] | None:
    mcp, env = codex_mcp_flags(binding)
    kept, dropped = app_server_args(config.args)
    argv = [binary, "app-server", *mcp, *kept]
    notices = [CODEX_ASKS]
    if spec.confinement is not None:
        notices.append(CODEX_CONFINED)
    if dropped:
        notices.append(
            "Left out of this run's codex app-server command line (options of codex exec only): "
            + " ".join(dropped)
        )
    driver = CodexAppServerDriver(
        prompt=spec.prompt,
        thread=thread_params(spec, config),
        resume=spec.resume_session,
        model_retries=config.model_retries,
    )
    return Launch(argv, env, spec.cwd, None, scratch, notices), driver
