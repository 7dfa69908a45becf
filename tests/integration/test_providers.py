"""Providers from the config file: `peerd provider list`, custom commands and their approval."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, ProviderConfig
from peerd.daemon import Daemon
from peerd.errors import Conflict, NotFound
from tests.helpers import client_for, make_repo, running_daemon, wait_terminal
from tests.realcli import cli_binary
from tests.support.cli import ok, peerd

# A custom coder: reads the task from {SPEC}, writes a file in {WORKTREE}, prints its report.
CODER = """\
import pathlib, sys
spec, worktree = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
task = spec.read_text()
(worktree / "DONE.md").write_text("did: " + task)
print("report line 1")
print("did: " + task.strip())
if "fail" in task:
    print("it broke", file=sys.stderr)
    sys.exit(3)
"""


@pytest.fixture
async def custom(tmp_path: Path) -> AsyncIterator[tuple[Daemon, LocalClient, dict[str, Any], str]]:
    coder = tmp_path / "coder.py"
    coder.write_text(CODER)
    command = f"{sys.executable} {coder} {{SPEC}} {{WORKTREE}}"
    settings = Config(
        providers={
            "mine": ProviderConfig(command=command),
            "trusted": ProviderConfig(command=command + " --trusted"),
            "codex": ProviderConfig(binary=str(cli_binary("codex"))),
            "claude": ProviderConfig(binary="no-such-claude-binary"),
        },
        approved_commands=["trusted"],
    )
    async with (
        running_daemon(tmp_path / "home", settings=settings) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        yield daemon, client, project, command


async def run_with(
    client: LocalClient, project: dict[str, Any], provider: str, prompt: str
) -> dict[str, Any]:
    launched: dict[str, Any] = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt, "provider": provider}
    )
    await wait_terminal(client, launched["threadId"], launched["runId"])
    thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    items = (await client.call("GET", f"/v1/threads/{launched['threadId']}/items"))["items"]
    return {**launched, "run": thread["latestRun"], "items": items}


async def test_an_unapproved_command_fails_showing_what_would_run(
    custom: tuple[Daemon, LocalClient, dict[str, Any], str],
) -> None:
    _, client, project, command = custom
    result = await run_with(client, project, "mine", "write the notes")
    assert result["run"]["status"] == "failed"
    reason = result["run"]["reason"]
    assert command in reason and "peerd provider approve mine" in reason
    assert not (Path(result["worktreePath"]) / "DONE.md").exists()  # nothing ran


async def test_an_approved_command_runs_with_its_spec_and_worktree(
    custom: tuple[Daemon, LocalClient, dict[str, Any], str],
) -> None:
    _, client, project, command = custom
    approved = await client.call("POST", "/v1/providers/mine/approve", body={"command": command})
    assert approved["approved"] is True
    result = await run_with(client, project, "mine", "write the notes")
    assert result["run"]["status"] == "completed", result["items"]
    assert (Path(result["worktreePath"]) / "DONE.md").read_text() == "did: write the notes"
    replies = [i["text"] for i in result["items"] if i["kind"] == "assistant_message"]
    assert replies == ["report line 1\ndid: write the notes"]
    failed = await run_with(client, project, "mine", "please fail")
    assert failed["run"]["status"] == "failed"
    assert failed["run"]["reason"] == "mine exited with code 3: it broke"
    # The allowlist in the config file approves a command as written there.
    trusted = await run_with(client, project, "trusted", "write the notes")
    assert trusted["run"]["status"] == "completed"


async def test_approval_binds_to_the_exact_command(
    custom: tuple[Daemon, LocalClient, dict[str, Any], str],
) -> None:
    _, client, _, command = custom
    with pytest.raises(Conflict, match="not the one you were shown"):
        await client.call("POST", "/v1/providers/mine/approve", body={"command": command + " --evil"})
    with pytest.raises(NotFound):
        await client.call("POST", "/v1/providers/codex/approve", body={"command": "codex"})
    listed = {p["name"]: p for p in (await client.call("GET", "/v1/providers"))["items"]}
    assert listed["mine"]["approved"] is False


async def test_provider_list_shows_found_versions_and_commands(
    custom: tuple[Daemon, LocalClient, dict[str, Any], str],
) -> None:
    daemon, _, _, command = custom
    listed = json.loads(ok(await peerd(daemon.paths.home, "provider", "list", "--json")))
    by_name = {p["name"]: p for p in listed}
    assert set(by_name) >= {"script", "codex", "claude", "gemini", "mine", "trusted"}
    assert by_name["codex"]["found"] and by_name["codex"]["version"] == "codex-cli 0.171.0"
    assert not by_name["claude"]["found"] and "not found" in by_name["claude"]["problem"]
    assert by_name["mine"]["command"] == command and by_name["mine"]["approved"] is False
    assert by_name["trusted"]["approved"] is True
    text = ok(await peerd(daemon.paths.home, "provider", "list"))
    assert "NOT APPROVED" in text and f"mine runs: {command}" in text
    # Approving through the CLI shows the command and asks first.
    refused = await peerd(daemon.paths.home, "provider", "approve", "mine")
    assert refused.returncode != 0 and command in refused.stdout
    ok(await peerd(daemon.paths.home, "provider", "approve", "mine", "--yes"))
    again = json.loads(ok(await peerd(daemon.paths.home, "provider", "list", "--json")))
    assert {p["name"]: p for p in again}["mine"]["approved"] is True
    ok(await peerd(daemon.paths.home, "provider", "revoke", "mine"))


async def test_config_show_hides_secrets(tmp_path: Path) -> None:
    settings = Config(providers={"codex": ProviderConfig(env={"OPENAI_API_KEY": "sk-very-secret"})})
    async with running_daemon(tmp_path / "home", settings=settings) as daemon:
        shown = ok(await peerd(daemon.paths.home, "config", "show", "--json"))
    assert "sk-very-secret" not in shown
    data = json.loads(shown)
    assert data["providers"]["codex"]["env"] == {"OPENAI_API_KEY": "********"}
    assert data["label"] == "test" and data["home"] == str(daemon.paths.home)


async def test_editing_an_approved_command_withdraws_the_approval(tmp_path: Path) -> None:
    coder = tmp_path / "coder.py"
    coder.write_text(CODER)
    command = f"{sys.executable} {coder} {{SPEC}} {{WORKTREE}}"
    home = tmp_path / "home"
    first = Config(providers={"mine": ProviderConfig(command=command)})
    async with running_daemon(home, settings=first) as daemon, client_for(daemon.paths.home) as client:
        await client.call("POST", "/v1/providers/mine/approve", body={"command": command})
    edited = Config(providers={"mine": ProviderConfig(command=command + " --and-more")})
    async with running_daemon(home, settings=edited) as daemon, client_for(daemon.paths.home) as client:
        listed = {p["name"]: p for p in (await client.call("GET", "/v1/providers"))["items"]}
        assert listed["mine"]["approved"] is False
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        result = await run_with(client, project, "mine", "write the notes")
    assert result["run"]["status"] == "failed"
    assert "--and-more" in result["run"]["reason"]


async def test_config_show_without_a_daemon_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('label = "box"\n[providers.codex]\nenv = { OPENAI_API_KEY = "sk-file-secret" }\n')
    done = await peerd(tmp_path / "home", "config", "show", "--config", str(path), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["label"] == "box" and data["source"] == str(path)
    assert "sk-file-secret" not in done.stdout and "not running" in done.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("lable = 1\n")
    refused = await peerd(tmp_path / "home", "config", "show", "--config", str(broken))
    assert refused.returncode == 2 and "config_invalid" in refused.stderr and "lable" in refused.stderr
