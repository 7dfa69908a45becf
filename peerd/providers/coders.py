"""The real coder CLIs as providers: Codex CLI, Claude Code, Gemini CLI.

Each builds the exact headless invocation its CLI documents (versions tested: codex 0.171.0,
claude-code 2.1.332, gemini-cli 0.61.0), maps peerd's access level to the CLI's own sandbox or
permission flags, attaches peerd's MCP tools for this run only (the daemon's own MCP endpoint on
loopback, with the run's token as a bearer header kept in a 0600 file or the CLI's environment,
never in argv), and resumes the CLI's own session on the thread's later runs (follow-ups and wakes).

Access levels never widen: where a CLI has no equivalent (no human to approve in headless mode),
the nearest narrower mode is used and a notice in the run's items says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from peerd.config import ProviderConfig
from peerd.errors import ProviderError
from peerd.providers.asking import asks_person, duplex_launch
from peerd.providers.claude_events import ClaudeEvents
from peerd.providers.claude_stdio import claude_binding_flags
from peerd.providers.cli import (
    Launch,
    StreamParser,
    ToolBinding,
    base_env,
    bind_tools,
    confine,
    home_mounts,
    resolve_binary,
    scratch_dir,
    start_cli,
)
from peerd.providers.codex_appserver import codex_mcp_flags
from peerd.providers.codex_events import CodexEvents
from peerd.providers.duplex import start_duplex
from peerd.providers.gemini_acp import (
    gemini_tool_settings,
    writable_ancestor,  # noqa: F401  # tests/realcli.py imports it here
)
from peerd.providers.gemini_events import GeminiEvents
from peerd.runtime.provider import ProviderRun, RunSpec
from peerd.runtime.sandbox import Mount
from peerd.runtime.sandbox_profile import real

# Linux caps one argv string at 128 KiB; a longer Gemini prompt goes through stdin instead.
MAX_ARG_BYTES = 100_000


@dataclass(frozen=True)
class AccessFlags:
    flags: list[str]
    notices: list[str]


# --- access levels -------------------------------------------------------------------------------

CODEX_NO_SANDBOX = "--dangerously-bypass-approvals-and-sandbox"


def codex_access(runtime: str, interaction: str) -> AccessFlags:
    """`codex exec` forces approval `never`: nothing can wait for a person, so "ask first" levels
    run read-only and say so."""
    if interaction == "plan":
        return AccessFlags(["--sandbox", "read-only"], ["Plan mode: Codex runs with a read-only sandbox."])
    if runtime == "read-only":
        return AccessFlags(["--sandbox", "read-only"], [])
    if runtime == "approval-required":
        return AccessFlags(
            ["--sandbox", "read-only"],
            [
                "Codex in headless mode cannot ask for approval: this run uses a read-only sandbox "
                "(the nearest narrower mode). Launch with auto-accept-edits or wider to let it write."
            ],
        )
    if runtime == "auto-accept-edits":
        return AccessFlags(
            ["--sandbox", "read-only"],
            [
                "Codex cannot let a run edit files without also running commands (its workspace-write "
                "sandbox allows both): this run uses a read-only sandbox, the nearest narrower mode. "
                "Launch with access level auto to let it edit."
            ],
        )
    if runtime == "auto":
        return AccessFlags(["--sandbox", "workspace-write"], [])
    return AccessFlags([CODEX_NO_SANDBOX], [])


CODEX_IN_PEERD_SANDBOX = (
    "Codex runs with its own sandbox off inside peerd's sandbox (nested, Codex's sandbox cannot see "
    "worktrees below /tmp), which enforces the same rule: the worktree is writable only at access "
    "level auto and wider."
)


def codex_confined_access(runtime: str, interaction: str) -> AccessFlags:
    """Codex inside peerd's sandbox: its own sandbox off, the level's notices kept; peerd's sandbox
    leaves the worktree writable exactly where Codex's own mapping would (`codex_writes`)."""
    access = codex_access(runtime, interaction)
    return AccessFlags([CODEX_NO_SANDBOX], [*access.notices, CODEX_IN_PEERD_SANDBOX])


def codex_writes(runtime: str, interaction: str) -> bool:
    """Whether Codex's own mapping lets this level write the worktree (workspace-write or wider)."""
    flags = codex_access(runtime, interaction).flags
    return "workspace-write" in flags or CODEX_NO_SANDBOX in flags


def claude_access(runtime: str, interaction: str) -> AccessFlags:
    """Claude Code's permission modes; shell commands have no sandbox there, so below full access
    they stay denied (and a denied call is reported by the run, not hidden)."""
    if interaction == "plan":
        return AccessFlags(["--permission-mode", "plan"], [])
    if runtime == "read-only":
        return AccessFlags(["--permission-mode", "dontAsk", "--tools", "Read,Grep,Glob"], [])
    if runtime == "approval-required":
        return AccessFlags(
            ["--permission-mode", "dontAsk"],
            [
                "Claude Code in headless mode cannot ask for approval: tools that need it are denied "
                "(the nearest narrower mode). Launch with auto-accept-edits or wider to let it edit."
            ],
        )
    if runtime == "auto-accept-edits":
        return AccessFlags(["--permission-mode", "acceptEdits"], [])
    if runtime == "auto":
        return AccessFlags(
            ["--permission-mode", "acceptEdits"],
            [
                "Claude Code has no sandbox for shell commands: at access level auto it may edit files, "
                "but shell commands stay denied (full-access allows them)."
            ],
        )
    return AccessFlags(["--permission-mode", "bypassPermissions"], [])


def gemini_access(runtime: str, interaction: str) -> AccessFlags:
    if interaction == "plan" or runtime == "read-only":
        return AccessFlags(["--approval-mode", "plan"], [])
    if runtime == "approval-required":
        return AccessFlags(
            ["--approval-mode", "default"],
            [
                "Gemini CLI in headless mode cannot ask for approval: tools that need it are refused "
                "(the nearest narrower mode). Launch with auto-accept-edits or wider to let it edit."
            ],
        )
    if runtime in ("auto-accept-edits", "auto"):
        notices = []
        if runtime == "auto":
            notices.append(
                "Gemini CLI has no sandbox here: at access level auto it may edit files, but shell "
                "commands stay refused (full-access allows them)."
            )
        return AccessFlags(["--approval-mode", "auto_edit"], notices)
    return AccessFlags(["--approval-mode", "yolo"], [])


# --- argv ----------------------------------------------------------------------------------------


def codex_argv(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> Launch:
    if spec.confinement is not None:
        access = codex_confined_access(spec.runtime_mode, spec.interaction_mode)
    else:
        access = codex_access(spec.runtime_mode, spec.interaction_mode)
    argv = [binary, "exec", "--json", "--skip-git-repo-check", "-C", str(spec.cwd)]
    if model := spec.model or config.model:
        argv += ["-m", model]
    argv += access.flags
    mcp, env = codex_mcp_flags(binding)  # the same on the asking path (codex app-server)
    argv += mcp
    argv += config.args
    if spec.resume_session:
        argv += ["resume", spec.resume_session]  # shared options go before `resume`
    argv.append("-")  # the prompt comes on stdin
    return Launch(argv, env, spec.cwd, spec.prompt.encode("utf-8"), scratch, access.notices)


def claude_argv(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> Launch:
    access = claude_access(spec.runtime_mode, spec.interaction_mode)
    argv = [binary, "-p", "--output-format", "stream-json", "--verbose"]
    if model := spec.model or config.model:
        argv += ["--model", model]
    argv += access.flags
    env: dict[str, str] = {}
    if "CLAUDE_CODE_MAX_RETRIES" not in config.env:  # the owner's own setting wins
        env["CLAUDE_CODE_MAX_RETRIES"] = str(config.model_retries)
    notices = list(access.notices)
    if "bypassPermissions" in access.flags and os.geteuid() == 0:
        # Claude Code refuses bypassPermissions as root unless told it runs in a sandbox; the
        # owner asked for full access on a machine where peerd runs as root.
        env["IS_SANDBOX"] = "1"
        notices.append("peerd runs as root: Claude Code's full access was allowed with IS_SANDBOX=1.")
    argv += claude_binding_flags(spec, binding, scratch)
    argv += config.args
    return Launch(argv, env, spec.cwd, spec.prompt.encode("utf-8"), scratch, notices)


def gemini_argv(
    binary: str, spec: RunSpec, config: ProviderConfig, binding: ToolBinding | None, scratch: Path
) -> Launch:
    access = gemini_access(spec.runtime_mode, spec.interaction_mode)
    prompt = spec.prompt
    stdin: bytes | None = None
    if len(prompt.encode("utf-8")) > MAX_ARG_BYTES:
        # Gemini prepends piped stdin to -p: the task travels on stdin, -p only points at it.
        stdin, prompt = prompt.encode("utf-8"), "Carry out the task given above."
    notices = list(access.notices)
    argv = [binary, "-p", prompt, "--output-format", "stream-json", "--skip-trust"]
    if model := spec.model or config.model:
        argv += ["-m", model]
    argv += access.flags
    # One process (no self-relaunch as a child) so a signal reaches the CLI itself.
    env = {"GEMINI_CLI_NO_RELAUNCH": "1"}
    tools, tool_env, tool_notices = gemini_tool_settings(config, binding, scratch)  # as in ACP mode
    argv += tools
    env.update(tool_env)
    notices += tool_notices
    if spec.resume_session:
        argv += ["--resume", spec.resume_session]
    argv += config.args
    launch = Launch(argv, env, spec.cwd, stdin, scratch, notices)
    launch.skip_sigint = True  # without a terminal Gemini ignores SIGINT; SIGTERM ends it
    return launch


# --- peerd's sandbox -----------------------------------------------------------------------------


def state_mounts(kind: str, env: Mapping[str, str]) -> list[Mount]:
    """The directories (and Claude's one file) each CLI keeps its own state in, writable."""
    home = real(env.get("HOME") or Path.home())
    if kind == "codex":
        return [Mount(real(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex", writable=True)]
    if kind == "claude":
        config_dir = real(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
        return [Mount(config_dir, writable=True), Mount(home / ".claude.json", writable=True, optional=True)]
    if kind == "gemini":
        return [Mount(home / ".gemini", writable=True)]
    return []


# --- providers -----------------------------------------------------------------------------------


class CoderProvider:
    """One configured coder CLI (kind codex, claude or gemini)."""

    def __init__(self, name: str, kind: str, config: ProviderConfig) -> None:
        self.name = name
        self.kind = kind
        self.config = config
        self.binary = config.binary or kind

    async def start(self, spec: RunSpec) -> ProviderRun:
        scratch = scratch_dir(spec)
        binding = bind_tools(spec, scratch)
        env = base_env(self.config, spec, binding)
        binary = resolve_binary(self.binary, env)
        if binary is None:
            raise ProviderError(
                f"Provider {self.name!r}: {self.binary!r} was not found (PATH or providers.{self.name}.binary "
                "in the config file). `peerd provider list` shows what is installed."
            )
        if asks_person(spec) and spec.approvals is not None:
            asking = duplex_launch(self.kind, binary, spec, self.config, binding, scratch)
            if asking is not None:
                launch, driver = asking
                launch.env = {**env, **launch.env}
                launch.timeout_s = self.config.timeout_s
                # Every write passes a person first (the CLI asks before each edit and command),
                # so the worktree is writable inside peerd's sandbox, as the person approves.
                base = spec.confinement
                if base is not None:
                    base = dataclasses.replace(base, worktree_writable=True)
                mounts = [*home_mounts(self.config, launch.env), *state_mounts(self.kind, launch.env)]
                confine(launch, base, binary, *mounts, config=self.config, name=self.name)
                return await start_duplex(launch, driver, spec.approvals, cli=self.kind)
        parser: StreamParser
        if self.kind == "codex":
            launch, parser = (
                codex_argv(binary, spec, self.config, binding, scratch),
                CodexEvents(model_retries=self.config.model_retries, usage_before=spec.usage_before),
            )
        elif self.kind == "claude":
            launch, parser = (
                claude_argv(binary, spec, self.config, binding, scratch),
                ClaudeEvents(cost_before=None if spec.usage_before is None else spec.usage_before.cost_usd),
            )
        elif self.kind == "gemini":
            launch, parser = gemini_argv(binary, spec, self.config, binding, scratch), GeminiEvents()
        else:
            raise ProviderError(f"Provider {self.name!r} has an unknown kind {self.kind!r}.")
        launch.env = {**env, **launch.env}
        launch.timeout_s = self.config.timeout_s
        base = spec.confinement
        if base is not None and self.kind == "codex":
            writes = base.worktree_writable and codex_writes(spec.runtime_mode, spec.interaction_mode)
            base = dataclasses.replace(base, worktree_writable=writes)
        mounts = [*home_mounts(self.config, launch.env), *state_mounts(self.kind, launch.env)]
        confine(launch, base, binary, *mounts, config=self.config, name=self.name)
        return await start_cli(launch, parser, cli=self.kind)
