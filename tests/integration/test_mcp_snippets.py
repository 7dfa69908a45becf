"""The snippets in examples/mcp/ work as written: each pinned CLI, started by hand (not by peerd)
with the snippet as its MCP settings and headless as a script would run it, calls one of peerd's
tools through `peerd mcp` and gets its answer.

The CLIs run offline against the scripted fake model (tests/fakemodel.py), each with its own HOME;
`peerd` is the one in this virtualenv, found on PATH as the snippets expect, and reaches the test's
daemon through `PEERD_HOME` (what the snippets' README says to set for a home other than the
default). The model's script calls `thread_launch` (a tool that changes something, which a CLI may
want approved: read-only tools pass without), the CLI's final answer carries the tool's answer,
and the daemon has the thread the agent launched.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.daemon import Daemon
from tests.fakemodel import FakeModel
from tests.helpers import client_for, make_repo, running_daemon
from tests.realcli import CODEX_MODEL, GEMINI_MODEL, cli_binary, codex_catalog, fake_marker, secure_dir

pytestmark = pytest.mark.slow  # the real coder CLIs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mcp"
SCRIPTS: dict[str, dict[str, Any]] = {
    "list": {
        "steps": [
            {
                "tool_call": {
                    "server": "peerd",
                    "tool": "thread_launch",
                    "arguments": {"projectId": "{var:project}", "prompt": "hello", "title": "from a snippet"},
                }
            },
            {"text": "LAUNCHED: {tool_result}"},
        ],
        "fallback_text": "side request",
    }
}
PROMPT = f"{fake_marker('list')} Start a thread in peerd."


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    with FakeModel(SCRIPTS, log_path=tmp_path / "model-requests.jsonl") as model:
        yield model


@pytest.fixture
async def daemon(tmp_path: Path, fake: FakeModel) -> AsyncIterator[Daemon]:
    with secure_dir() as home:
        async with running_daemon(home) as running:
            async with client_for(home) as client:
                project = await client.call(
                    "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))}
                )
            fake.variables["project"] = project["id"]
            yield running


def base_env(home: Path, daemon: Daemon) -> dict[str, str]:
    """A user's shell: this virtualenv's `peerd` first on PATH, the test daemon's home."""
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "PEERD_HOME": str(daemon.paths.home),
        "LANG": "C.UTF-8",
    }


def codex_run(scratch: Path, fake: FakeModel, daemon: Daemon) -> tuple[list[str], dict[str, str]]:
    home = scratch / "codex-home"
    (home / "codex").mkdir(parents=True)
    snippet = (EXAMPLES / "codex-config.toml").read_text()
    tomllib.loads(snippet)  # the snippet is valid TOML on its own
    provider = (
        "[model_providers.mock]\n"
        f'name = "mock"\nbase_url = "{fake.base_url}/v1"\nwire_api = "responses"\n'
        'env_key = "MOCK_API_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
    )
    top = (
        f'model = "{CODEX_MODEL}"\nmodel_provider = "mock"\n'
        f'model_catalog_json = "{codex_catalog(scratch)}"\n\n[analytics]\nenabled = false\n\n'
    )
    # Appended, as the README says, with the home in the server's `env` (Codex hands an MCP server
    # only a few variables of its own environment: PEERD_HOME is not one of them).
    server_env = f'env = {{ PEERD_HOME = "{daemon.paths.home}" }}\n'
    (home / "codex" / "config.toml").write_text(top + provider + "\n" + snippet + server_env)
    env = base_env(home, daemon) | {"CODEX_HOME": str(home / "codex"), "MOCK_API_KEY": "fake-offline-key"}
    argv = [str(cli_binary("codex")), "exec", "--skip-git-repo-check", "--disable", "plugins", PROMPT]
    return argv, env


def gemini_run(scratch: Path, fake: FakeModel, daemon: Daemon) -> tuple[list[str], dict[str, str]]:
    home = scratch / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    settings = {
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 1},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    }
    settings |= json.loads((EXAMPLES / "gemini-settings.json").read_text())  # merged, as the README says
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    env = base_env(home, daemon) | {
        "GOOGLE_GEMINI_BASE_URL": fake.base_url,
        "GEMINI_API_KEY": "fake-offline-key",
    }
    argv = [str(cli_binary("gemini")), "-m", GEMINI_MODEL, "--skip-trust", "-p", PROMPT]
    return argv, env


def claude_run(scratch: Path, fake: FakeModel, daemon: Daemon) -> tuple[list[str], dict[str, str]]:
    home = scratch / "claude-home"
    home.mkdir(parents=True)
    env = base_env(home, daemon) | {
        "ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake-offline-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    config = str(EXAMPLES / "claude-code.mcp.json")
    # Headless, Claude Code asks before an MCP tool that changes something unless it is allowed.
    argv = [str(cli_binary("claude")), "-p", PROMPT, "--mcp-config", config, "--allowedTools", "mcp__peerd"]
    return argv, env


RUNS = {"codex": codex_run, "gemini": gemini_run, "claude": claude_run}


async def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


@pytest.mark.parametrize("cli", sorted(RUNS))
async def test_each_snippet_gives_a_headless_cli_peerds_tools(
    cli: str, tmp_path: Path, fake: FakeModel, daemon: Daemon
) -> None:
    argv, env = RUNS[cli](tmp_path / "scratch", fake, daemon)
    code, out, err = await run_cli(argv, env, tmp_path / "repo")
    assert code == 0, f"{cli} exited {code}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    async with client_for(daemon.paths.home) as client:
        threads = (await client.call("GET", "/v1/threads"))["items"]
    said = f"{cli} said:\n{out[-2000:]}\n{err[-2000:]}"
    assert [t["title"] for t in threads] == ["from a snippet"], f"the agent launched no thread; {said}"
    assert "LAUNCHED: " in out and threads[0]["id"] in out, f"the agent never saw the tool's answer; {said}"
