"""Codex at approval-required asks a person (codex app-server), driven for real against the fake model.

Each test starts the pinned Codex CLI through peerd's provider with an in-test gate, so what the
person decided is exactly what Codex did: the command ran or not, the file was written or not, and
the model's next request (`fake.requests`) shows what the model was told.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.config import ProviderConfig
from peerd.providers.coders import CoderProvider
from peerd.providers.codex_appserver import CODEX_ASKS, CODEX_CONFINED, toml_value
from peerd.runtime.provider import (
    ItemProduced,
    ProviderEvent,
    RunFinished,
    RunSpec,
    SessionStarted,
    UsageReported,
)
from peerd.runtime.sandbox import Confinement
from tests.fakemodel import FakeModel
from tests.helpers import client_for, make_repo, running_daemon, wait_terminal
from tests.realcli import REPO, fake_marker, offline_settings, sandbox_binds, secure_dir, system_view
from tests.support.approvals import Gate, pending_approvals

pytestmark = pytest.mark.slow  # the real coder CLIs

RUN_IDS = itertools.count(1)
RAN = "shell-ran.txt"
SHELL = f"python3 -c \"open('{RAN}', 'w').write('x')\"; echo RAN-OK"
ADD_NOTES = "*** Begin Patch\n*** Add File: NOTES.md\n+edited by the agent\n*** End Patch\n"
SCRIPTS: dict[str, dict[str, Any]] = {
    "shell": {
        "steps": [
            {"tool_call": {"name": "exec_command", "arguments": {"cmd": SHELL}}},
            {"text": "Saw: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "edit": {
        "steps": [
            {"tool_call": {"name": "apply_patch", "arguments": {"input": ADD_NOTES}}},
            {"text": "Patch: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "reply": {"steps": [{"text": "Hello again."}]},
    "echo": {
        "steps": [
            {"tool_call": {"server": "echo", "tool": "echo", "arguments": {"text": "hello"}}},
            {"text": "Echo: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "tools_then_shell": {
        "steps": [
            {"tool_call": {"server": "peerd", "tool": "project_list", "arguments": {}}},
            {"tool_call": {"name": "exec_command", "arguments": {"cmd": SHELL}}},
            {"text": "Saw: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModel]:
    with FakeModel(SCRIPTS, log_path=tmp_path / "model.jsonl") as model:
        yield model


@pytest.fixture
def codex(tmp_path: Path, fake: FakeModel) -> Iterator[ProviderConfig]:
    with secure_dir() as home:
        yield offline_settings(home / "clis", fake).providers["codex"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def run_spec(tmp_path: Path, repo: Path, gate: Gate, prompt: str, resume: str | None = None) -> RunSpec:
    return RunSpec(
        thread_id="t1",
        run_id=f"r{next(RUN_IDS)}",
        prompt=prompt,
        cwd=repo,
        model=None,
        runtime_mode="approval-required",
        interaction_mode="default",
        resume_session=resume,
        state_dir=tmp_path / "state",
        approvals=gate,
    )


async def run_codex(config: ProviderConfig, spec: RunSpec) -> list[ProviderEvent]:
    run = await CoderProvider("codex", "codex", config).start(spec)
    return await asyncio.wait_for(collect(run.events()), 30)


async def collect(events: AsyncIterator[ProviderEvent]) -> list[ProviderEvent]:
    return [event async for event in events]


def items(events: list[ProviderEvent], kind: str) -> list[ItemProduced]:
    return [e for e in events if isinstance(e, ItemProduced) and e.kind == kind]


def last_input(fake: FakeModel) -> str:
    """The input items of the model's last request, as JSON text."""
    return json.dumps(fake.requests[-1]["body"]["input"][-3:])


async def test_an_approved_command_runs_and_the_model_sees_its_output(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel
) -> None:
    gate = Gate(allow=True, delay=0.3)
    events = await run_codex(codex, run_spec(tmp_path, repo, gate, f"{fake_marker('shell')} Run it."))
    assert events[-1] == RunFinished("completed", exit_code=0), events
    [ask] = gate.asked
    assert ask.kind == "command" and ask.tool == "exec_command"
    # The whole command line Codex runs (its shell wrapper included); the summary shows the model's.
    assert ask.detail["command"].startswith("/bin/bash -lc ") and "echo RAN-OK" in ask.detail["command"]
    assert ask.detail["cwd"] == str(repo) and ask.summary == f"run `{SHELL}` in {repo}"
    assert (repo / RAN).exists()
    assert "RAN-OK" in items(events, "assistant_message")[-1].text
    [command] = items(events, "command")
    assert command.data["exit_code"] == 0 and command.data["status"] == "completed"
    assert events[0] == ItemProduced("notice", CODEX_ASKS)
    [session] = [e for e in events if isinstance(e, SessionStarted)]
    usage = [e.usage for e in events if isinstance(e, UsageReported)]
    assert usage[-1].input_tokens == 20 and usage[-1].output_tokens == 10  # two model requests
    assert session.session_id


async def test_a_denied_command_does_not_run_and_the_model_reads_the_reason(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel
) -> None:
    gate = Gate(allow=False, reason="not on this machine (REASON-7)")
    events = await run_codex(codex, run_spec(tmp_path, repo, gate, f"{fake_marker('shell')} Run it."))
    assert events[-1] == RunFinished("completed", exit_code=0), events
    assert len(gate.asked) == 1 and not (repo / RAN).exists()
    seen = last_input(fake)
    assert "rejected by user" in seen and "not on this machine (REASON-7)" in seen, seen
    [command] = items(events, "command")
    assert command.text.endswith("(declined)")


async def test_a_file_change_is_asked_with_its_diff_and_written_only_when_approved(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel
) -> None:
    denied = Gate(allow=False, reason="keep the notes as they are")
    events = await run_codex(codex, run_spec(tmp_path, repo, denied, f"{fake_marker('edit')} Write it."))
    [ask] = denied.asked
    assert ask.kind == "file_change" and ask.tool == "apply_patch"
    assert ask.detail["changes"] == [
        {"path": str(repo / "NOTES.md"), "kind": "add", "diff": "edited by the agent\n"}
    ]
    assert ask.summary == f"change {repo / 'NOTES.md'}"
    assert not (repo / "NOTES.md").exists()
    assert "keep the notes as they are" in last_input(fake)
    assert events[-1] == RunFinished("completed", exit_code=0)

    allowed = Gate(allow=True)
    events = await run_codex(codex, run_spec(tmp_path, repo, allowed, f"{fake_marker('edit')} Write it."))
    assert (repo / "NOTES.md").read_text() == "edited by the agent\n"
    [change] = items(events, "file_change")
    assert change.text == str(repo / "NOTES.md") and change.data["status"] == "completed"


async def test_an_interrupt_while_a_person_decides_ends_the_run_promptly(
    tmp_path: Path, repo: Path, codex: ProviderConfig
) -> None:
    gate = Gate(allow=True, delay=600)
    run = await CoderProvider("codex", "codex", codex).start(
        run_spec(tmp_path, repo, gate, f"{fake_marker('shell')} Run it.")
    )
    consumer = asyncio.create_task(collect(run.events()))
    await asyncio.wait_for(gate.was_asked.wait(), 20)
    assert gate.asked
    await run.interrupt()
    events = await asyncio.wait_for(consumer, 10)
    assert isinstance(events[-1], RunFinished) and events[-1].status == "interrupted", events
    assert not (repo / RAN).exists()


async def test_the_next_run_resumes_the_codex_session(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    first = await run_codex(codex, run_spec(tmp_path, repo, gate, f"{fake_marker('shell')} Run it."))
    [session] = [e for e in first if isinstance(e, SessionStarted)]
    second = await run_codex(
        codex, run_spec(tmp_path, repo, gate, "And now say hello.", resume=session.session_id)
    )
    assert second[-1] == RunFinished("completed", exit_code=0), second
    assert [e for e in second if isinstance(e, SessionStarted)] == [session]
    assert fake.requests[-1]["script"] == "shell"  # the marker is in the resumed history
    usage = [e.usage for e in second if isinstance(e, UsageReported)]
    assert usage[-1].input_tokens == 10  # this run's own request, not the thread's total


async def test_a_session_codex_exec_started_goes_on_under_app_server(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel
) -> None:
    """A thread's runs may change level: an `auto` run (codex exec) then an asking one resumes it."""
    headless = dataclasses.replace(
        run_spec(tmp_path, repo, Gate(allow=True), f"{fake_marker('reply')} Hi."),
        runtime_mode="auto",
        approvals=None,
    )
    first = await run_codex(codex, headless)
    [session] = [e for e in first if isinstance(e, SessionStarted)]
    gate = Gate(allow=True)
    second = await run_codex(codex, run_spec(tmp_path, repo, gate, "Again.", resume=session.session_id))
    assert second[-1] == RunFinished("completed", exit_code=0), second
    assert ItemProduced("notice", CODEX_ASKS) in second
    assert [e for e in second if isinstance(e, SessionStarted)] == [session]
    assert "Hello again." in json.dumps(fake.requests[-1]["body"]["input"])  # the first run's reply


@pytest.mark.parametrize("allow", [True, False])
async def test_another_mcp_servers_tool_is_asked_with_its_arguments(
    tmp_path: Path, repo: Path, codex: ProviderConfig, fake: FakeModel, allow: bool
) -> None:
    calls = tmp_path / "echo-calls.jsonl"
    echo = {"command": sys.executable, "args": [str(REPO / "tests" / "echo_mcp.py")],
            "env": {"ECHO_MCP_LOG": str(calls)}, "required": True}  # fmt: skip
    config = codex.model_copy(update={"args": [*codex.args, "-c", f"mcp_servers.echo={toml_value(echo)}"]})
    gate = Gate(allow=allow, reason="no echoes today")
    events = await run_codex(config, run_spec(tmp_path, repo, gate, f"{fake_marker('echo')} Echo it."))
    assert events[-1] == RunFinished("completed", exit_code=0), events
    [ask] = gate.asked
    assert ask.kind == "mcp_tool" and ask.tool == "echo.echo"
    assert ask.detail == {"server": "echo", "tool": "echo", "arguments": {"text": "hello"}}
    reply = items(events, "assistant_message")[-1].text
    if allow:
        assert calls.read_text().count("\n") == 1 and "echo: hello" in reply
    else:
        assert not calls.exists() and "no echoes today" in last_input(fake)


async def test_inside_peerds_sandbox_an_approved_command_writes_the_worktree(
    tmp_path: Path, repo: Path, codex: ProviderConfig
) -> None:
    """A link's run is confined: Codex's own sandbox is off (danger-full-access), peerd's confines
    it, and every command still asks."""
    gate = Gate(allow=True)
    work = repo.resolve()
    confined = Confinement(
        cwd=work,
        worktree=work,
        worktree_writable=False,
        tmp=(Path("/tmp"),),
        binds=sandbox_binds(),  # peerd's Python (a clone under /tmp too), as the run manager binds it
        **system_view(),  # and the system, read-only: nothing else of `/`
        by_link=True,
    )
    spec = dataclasses.replace(
        run_spec(tmp_path, repo, gate, f"{fake_marker('shell')} Run it."), confinement=confined
    )
    events = await run_codex(codex, spec)
    assert events[-1] == RunFinished("completed", exit_code=0), events
    assert ItemProduced("notice", CODEX_CONFINED) in events
    assert len(gate.asked) == 1 and (work / RAN).read_text() == "x"


async def test_a_daemon_run_at_approval_required_asks_and_is_approved_through_the_api(
    tmp_path: Path, fake: FakeModel
) -> None:
    """peerd's own MCP tool is used without asking; the shell command waits for the API's decision."""
    repo = make_repo(tmp_path / "repo")
    with secure_dir() as home:
        settings = offline_settings(home / "clis", fake)
        async with (
            running_daemon(home / "peerd", settings=settings) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            body = {
                "projectId": project["id"],
                "prompt": f"{fake_marker('tools_then_shell')} Look, then run it.",
                "provider": "codex",
                "runtimeMode": "approval-required",
                "inPlace": True,
            }
            launched = await client.call("POST", "/v1/threads", body=body)
            (approval,) = await pending_approvals(client, seconds=30)
            assert approval["kind"] == "command" and approval["tool"] == "exec_command"
            assert approval["detail"]["cwd"] == str(repo) and "echo RAN-OK" in approval["detail"]["command"]
            assert not (repo / RAN).exists()
            await client.call(
                "POST", f"/v1/approvals/{approval['id']}/decision", body={"decision": "approve"}
            )
            done = await wait_terminal(client, launched["threadId"], launched["runId"], total=60)
            page = await client.call(
                "GET", f"/v1/threads/{launched['threadId']}/items", params={"limit": 100}
            )
            found = page["items"]
            assert done["status"] == "completed", [(i["kind"], i["text"][:200]) for i in found]
            assert (repo / RAN).read_text() == "x"
            assert any(i["kind"] == "tool_call" and "project_list" in i["text"] for i in found)
            assert "RAN-OK" in [i["text"] for i in found if i["kind"] == "assistant_message"][-1]
            assert (await client.call("GET", "/v1/approvals"))["items"] == []
