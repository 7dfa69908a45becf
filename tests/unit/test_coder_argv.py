"""The coder CLIs' invocations: access levels never widen, tools bind to the run, sessions resume."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest

from peerd.config import ProviderConfig
from peerd.contracts import RUNTIME_MODES
from peerd.core.access import runtime_rank
from peerd.errors import ProviderError
from peerd.providers.cli import bind_tools, scratch_dir
from peerd.providers.coders import (
    CODEX_IN_PEERD_SANDBOX,
    CODEX_NO_SANDBOX,
    claude_access,
    claude_argv,
    codex_access,
    codex_argv,
    codex_writes,
    gemini_access,
    gemini_argv,
    state_mounts,
)
from peerd.providers.command import TextEvents, expand
from peerd.runtime.provider import RunSpec
from peerd.runtime.sandbox import Confinement, Mount

MCP_URL = "http://127.0.0.1:5555/mcp"
STDIO_ONLY = {"PEERD_SOCKET": "/run/peerd.sock", "PEERD_RUN_TOKEN": "secret-token-value"}


def spec(tmp_path: Path, **kw: object) -> RunSpec:
    base: dict[str, object] = {
        "thread_id": "t1",
        "run_id": "r1",
        "prompt": "fix the bug",
        "cwd": tmp_path / "wt",
        "model": None,
        "runtime_mode": "auto",
        "interaction_mode": "default",
        "resume_session": None,
        "state_dir": tmp_path / "state",
        "tool_env": {
            "PEERD_SOCKET": "/run/peerd.sock",
            "PEERD_RUN_TOKEN": "secret-token-value",
            "PEERD_MCP_URL": MCP_URL,
        },
    }
    base.update(kw)
    return RunSpec(**base)  # type: ignore[arg-type]


# What each CLI flag allows, ranked on peerd's own scale: a level must map to a flag ranked no higher.
CODEX_RANK = {"read-only": 0, "workspace-write": 3, "bypass": 4}
CLAUDE_RANK = {"plan": 0, "dontAsk": 0, "default": 1, "acceptEdits": 2, "bypassPermissions": 4}
GEMINI_RANK = {"plan": 0, "default": 1, "auto_edit": 2, "yolo": 4}


@pytest.mark.parametrize("runtime", RUNTIME_MODES)
def test_no_access_level_maps_to_a_wider_cli_mode(runtime: str) -> None:
    rank = runtime_rank(runtime)  # type: ignore[arg-type]
    codex = codex_access(runtime, "default").flags
    codex_mode = "bypass" if "--dangerously-bypass-approvals-and-sandbox" in codex else codex[1]
    assert CODEX_RANK[codex_mode] <= rank or runtime == "full-access"
    claude = claude_access(runtime, "default").flags
    assert CLAUDE_RANK[claude[1]] <= rank or runtime == "full-access"
    gemini = gemini_access(runtime, "default").flags
    assert GEMINI_RANK[gemini[1]] <= rank or runtime == "full-access"


@pytest.mark.parametrize("runtime", RUNTIME_MODES)
def test_plan_mode_never_writes(runtime: str) -> None:
    assert codex_access(runtime, "plan").flags == ["--sandbox", "read-only"]
    assert claude_access(runtime, "plan").flags == ["--permission-mode", "plan"]
    assert gemini_access(runtime, "plan").flags == ["--approval-mode", "plan"]


def test_a_level_a_cli_cannot_honour_is_narrowed_and_said() -> None:
    for access in (codex_access, claude_access, gemini_access):
        narrowed = access("approval-required", "default")
        assert narrowed.notices and "nearest narrower" in narrowed.notices[0]
        assert not access("read-only", "default").notices
    assert "nearest narrower" in codex_access("auto-accept-edits", "default").notices[0]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_run_token_travels_in_private_files_or_the_environment_never_in_argv(
    tmp_path: Path, transport: str
) -> None:
    s = spec(tmp_path) if transport == "http" else spec(tmp_path, tool_env=STDIO_ONLY)
    scratch = scratch_dir(s)
    binding = bind_tools(s, scratch)
    assert binding is not None and (binding.url is not None) is (transport == "http")
    assert "secret-token-value" not in repr(binding)
    token_file = Path(binding.env["PEERD_RUN_TOKEN_FILE"])
    assert token_file.read_text() == "secret-token-value"
    for build in (codex_argv, claude_argv, gemini_argv):
        launch = build("cli", s, ProviderConfig(), binding, scratch)
        assert not any("secret-token-value" in arg for arg in launch.argv)
        holding = {key for key, value in launch.env.items() if "secret-token-value" in value}
        # Codex reads its bearer token from its environment (bearer_token_env_var), nothing else does.
        assert holding == ({"PEERD_RUN_TOKEN"} if build is codex_argv and transport == "http" else set())
    for path in scratch.iterdir():  # the run token file, Claude's MCP config, Gemini's settings
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_codex_invocation(tmp_path: Path) -> None:
    s = spec(tmp_path, model="gpt-5.5", resume_session="thread-9")
    scratch = scratch_dir(s)
    launch = codex_argv("codex", s, ProviderConfig(args=["--x"]), bind_tools(s, scratch), scratch)
    argv = launch.argv
    assert argv[:4] == ["codex", "exec", "--json", "--skip-git-repo-check"]
    assert argv[argv.index("-C") + 1] == str(s.cwd)
    assert argv[argv.index("-m") + 1] == "gpt-5.5"
    assert argv[argv.index("--sandbox") + 1] == "workspace-write"
    # shared options before `resume`; the prompt on stdin
    assert argv[-3:] == ["resume", "thread-9", "-"]
    assert argv.index("--x") < argv.index("resume")
    assert launch.stdin == b"fix the bug"
    server = codex_mcp_server(argv)
    assert server["default_tools_approval_mode"] == "approve"  # required under `codex exec`
    assert server["required"] is True  # its first model request waits for peerd's tools
    assert server["url"] == MCP_URL and server["bearer_token_env_var"] == "PEERD_RUN_TOKEN"
    assert "command" not in server
    assert launch.env["PEERD_RUN_TOKEN"] == "secret-token-value"
    stdio = spec(tmp_path, tool_env=STDIO_ONLY)  # no loopback endpoint: `peerd mcp` over stdio
    launch = codex_argv("codex", stdio, ProviderConfig(), bind_tools(stdio, scratch), scratch)
    server = codex_mcp_server(launch.argv)
    assert server["args"] == ["-m", "peerd.mcp_proxy"] and server["required"] is True
    assert server["env"]["PEERD_SOCKET"] == "/run/peerd.sock" and "url" not in server
    assert "PEERD_RUN_TOKEN" not in launch.env


def codex_mcp_server(argv: list[str]) -> dict[str, Any]:
    override = argv[argv.index("-c") + 1]
    key, _, value = override.partition("=")
    assert key == "mcp_servers.peerd"
    server: dict[str, Any] = tomllib.loads(f"v = {value}")["v"]
    return server


@pytest.mark.parametrize("runtime", RUNTIME_MODES)
def test_inside_peerds_sandbox_codex_runs_its_own_sandbox_off_and_says_so(
    tmp_path: Path, runtime: str
) -> None:
    confined = Confinement(cwd=tmp_path, worktree=tmp_path, worktree_writable=True)
    s = spec(tmp_path, runtime_mode=runtime, confinement=confined)
    launch = codex_argv("codex", s, ProviderConfig(), None, scratch_dir(s))
    assert CODEX_NO_SANDBOX in launch.argv and "--sandbox" not in launch.argv
    assert launch.notices[-1] == CODEX_IN_PEERD_SANDBOX
    # peerd's sandbox lets it write exactly where its own mapping would have (auto and wider).
    assert codex_writes(runtime, "default") is (runtime in ("auto", "full-access"))
    assert not codex_writes(runtime, "plan")


def test_each_cli_writes_its_own_state_dirs(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert state_mounts("codex", env) == [Mount(tmp_path / ".codex", writable=True)]
    assert state_mounts("codex", {**env, "CODEX_HOME": str(tmp_path / "c")}) == [
        Mount(tmp_path / "c", writable=True)
    ]
    assert state_mounts("claude", env) == [
        Mount(tmp_path / ".claude", writable=True),
        Mount(tmp_path / ".claude.json", writable=True, optional=True),
    ]
    assert state_mounts("gemini", env) == [Mount(tmp_path / ".gemini", writable=True)]


def test_claude_invocation(tmp_path: Path) -> None:
    s = spec(tmp_path, runtime_mode="auto-accept-edits")
    scratch = scratch_dir(s)
    launch = claude_argv(
        "claude", s, ProviderConfig(model="claude-sonnet-5"), bind_tools(s, scratch), scratch
    )
    argv = launch.argv
    assert argv[:5] == ["claude", "-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--model") + 1] == "claude-sonnet-5"
    assert argv[argv.index("--permission-mode") + 1] == "acceptEdits"
    assert "--strict-mcp-config" in argv
    assert argv[argv.index("--allowedTools") + 1] == "mcp__peerd__*"
    assert "--session-id" in argv and "--resume" not in argv
    config = json.loads(Path(argv[argv.index("--mcp-config") + 1]).read_text())
    server = config["mcpServers"]["peerd"]
    assert server["alwaysLoad"] is True
    assert server["type"] == "http" and server["url"] == MCP_URL
    assert server["headers"] == {"Authorization": "Bearer secret-token-value"}
    resumed = claude_argv("claude", spec(tmp_path, resume_session="sess-1"), ProviderConfig(), None, scratch)
    assert resumed.argv[resumed.argv.index("--resume") + 1] == "sess-1"
    assert "--session-id" not in resumed.argv and "--mcp-config" not in resumed.argv


def test_gemini_invocation(tmp_path: Path) -> None:
    s = spec(tmp_path, resume_session="g-1", runtime_mode="full-access")
    scratch = scratch_dir(s)
    launch = gemini_argv("gemini", s, ProviderConfig(), bind_tools(s, scratch), scratch)
    argv = launch.argv
    assert argv[argv.index("-p") + 1] == "fix the bug"
    assert "--skip-trust" in argv
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert argv[argv.index("--resume") + 1] == "g-1"
    assert launch.env["GEMINI_CLI_NO_RELAUNCH"] == "1"
    assert launch.skip_sigint
    settings = json.loads(Path(launch.env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"]).read_text())
    server = settings["mcpServers"]["peerd"]
    assert server["trust"] is True
    assert server["httpUrl"] == MCP_URL and server["headers"] == {
        "Authorization": "Bearer secret-token-value"
    }
    # pytest's tmp_path is below /tmp, which others can write: Gemini would skip the file; say so
    assert any("ignores settings files" in notice for notice in launch.notices)
    big = gemini_argv("gemini", spec(tmp_path, prompt="x" * 200_000), ProviderConfig(), None, scratch)
    assert big.stdin == b"x" * 200_000
    assert all(len(arg) < 1000 for arg in big.argv)


def test_command_templates_substitute_only_spec_and_worktree() -> None:
    argv = expand(
        "my-coder run --task-file {SPEC} --workdir '{WORKTREE}' --model {MODEL}",
        spec_file="/s",
        worktree="/w t",
    )
    assert argv == ["my-coder", "run", "--task-file", "/s", "--workdir", "/w t", "--model", "{MODEL}"]
    with pytest.raises(ProviderError):
        expand("unterminated 'quote", spec_file="/s", worktree="/w")


def test_a_text_coder_reply_is_its_stdout_and_success_is_exit_zero() -> None:
    parser = TextEvents("my-coder")
    parser.feed_text("line one")
    parser.feed({"looks": "json"})
    assert [i.text for i in parser.final_items()] == ['line one\n{"looks": "json"}']
    assert parser.finish(exit_code=0, stderr_tail="", interrupted=False).status == "completed"
    failed = parser.finish(exit_code=3, stderr_tail="boom\n", interrupted=False)
    assert failed.status == "failed" and failed.error == "my-coder exited with code 3: boom"
    assert parser.finish(exit_code=130, stderr_tail="", interrupted=True).status == "interrupted"
