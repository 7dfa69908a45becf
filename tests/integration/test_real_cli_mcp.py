"""The real Codex CLI, Claude Code and Gemini CLI reach peerd's tools over the daemon's loopback MCP
endpoint (no `peerd mcp` process), with the run token in no process's argv.

What each model receives from the tools (errors, hints, a delegation and its wake) is checked in
`test_real_clis.py`, whose fixtures these tests share.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from peerd.daemon import Daemon
from tests.fakemodel import FakeModel
from tests.helpers import LocalClient, processes_in, wait_terminal
from tests.realcli import CLIS, fake_marker
from tests.support.realclis import cli_client, cli_daemon, cli_project, fake, launch

# The fixtures (tests/support/realclis.py): a daemon whose providers are the real CLIs on the fake model.
__all__ = ["cli_client", "cli_daemon", "cli_project", "fake"]


def every_argv() -> list[bytes]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit():
                found.append((proc / "cmdline").read_bytes())
    return found


def argv_of(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return []


@pytest.mark.parametrize("cli", CLIS)
async def test_each_cli_calls_the_tools_over_loopback_http(
    cli: str, cli_daemon: Daemon, cli_client: LocalClient, cli_project: dict[str, Any]
) -> None:
    before = dict(cli_daemon.mcp.served)
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('tool_error')} Try it.")
    done = await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=90)
    assert done["status"] == "completed"
    assert cli_daemon.mcp.served["tcp"] > before.get("tcp", 0)  # listed and called over HTTP
    assert cli_daemon.mcp.served["agent"] == before.get("agent", 0)  # no stdio bridge on the socket


@pytest.mark.parametrize("cli", CLIS)
async def test_while_a_cli_runs_no_bridge_runs_and_no_argv_holds_the_token(
    cli: str, cli_daemon: Daemon, cli_client: LocalClient, cli_project: dict[str, Any], fake: FakeModel
) -> None:
    launched = await launch(cli_client, cli_project, cli, f"{fake_marker('hang')} Think hard.")
    assert await asyncio.to_thread(fake.wait_held, 1, 60.0), "the CLI never reached the model"
    scratch = cli_daemon.paths.provider_state / cli / "runs" / launched["runId"]
    token = (scratch / "run-token").read_text()
    assert len(token) >= 32
    leaked = [argv for argv in every_argv() if token.encode() in argv]
    bridges = [p for p in processes_in(launched["worktreePath"]) if "peerd.mcp_proxy" in argv_of(p)]
    await cli_client.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
    await wait_terminal(cli_client, launched["threadId"], launched["runId"], total=60)
    assert leaked == [], "the run token was in a process's argv"
    assert bridges == []
