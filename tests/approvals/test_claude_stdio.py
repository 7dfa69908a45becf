"""The real Claude Code (pinned 2.1.332) at approval-required with a gate: it asks over its stdio
permission protocol, peerd's gate answers, and the model sees the outcome. Offline against the fake
model; the provider is started directly with a small in-test gate, and once in a real daemon whose
approval is decided through the API."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.providers.coders import CoderProvider
from peerd.runtime.provider import ItemProduced, ProviderEvent, RunFinished, RunSpec, SessionStarted
from peerd.runtime.sandbox import Confinement
from tests.fakemodel import FakeModel
from tests.helpers import client_for, make_repo, running_daemon, wait_terminal
from tests.realcli import fake_marker, offline_settings, sandbox_binds, secure_dir, system_view
from tests.support.approvals import Gate, model_saw, pending_approvals, replies, run_to_end

pytestmark = pytest.mark.slow  # the real coder CLIs

SHELL = "python3 -c \"open('shell-ran.txt', 'w').write('yes')\" && echo SHELL-OUTPUT-42"
SCRIPTS: dict[str, dict[str, Any]] = {
    "shell": {
        "steps": [
            {
                "tool_call": {
                    "name": "Bash",
                    "arguments": {"command": SHELL, "description": "harmless, trust me"},
                }
            },
            {"text": "Shell said: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "write": {
        "steps": [
            {
                "tool_call": {
                    "name": "Write",
                    "arguments": {"file_path": "{cwd}/NOTES.md", "content": "written by the agent\n"},
                }
            },
            {"text": "Write said: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "cd_then_shell": {
        "steps": [
            {"tool_call": {"name": "Bash", "arguments": {"command": "cd sub", "description": "go"}}},
            {"tool_call": {"name": "Bash", "arguments": {"command": SHELL, "description": "run"}}},
            {"text": "Shell said: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "tools_then_shell": {
        "steps": [
            {"tool_call": {"server": "peerd", "tool": "project_list", "arguments": {}}},
            {"tool_call": {"name": "Bash", "arguments": {"command": SHELL, "description": "run"}}},
            {"text": "Shell said: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModel]:
    with FakeModel(SCRIPTS, log_path=tmp_path / "model-requests.jsonl") as model:
        yield model


@pytest.fixture
def provider(tmp_path: Path, fake: FakeModel) -> CoderProvider:
    config = offline_settings(tmp_path / "clis", fake).providers["claude"]
    return CoderProvider("claude", "claude", config)


def spec_for(
    tmp_path: Path, gate: Gate, prompt: str, *, resume: str | None = None, run: str = "r1"
) -> RunSpec:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return RunSpec(
        thread_id="t1",
        run_id=run,
        prompt=prompt,
        cwd=work,
        model=None,
        runtime_mode="approval-required",
        interaction_mode="default",
        resume_session=resume,
        state_dir=tmp_path / "state",
        approvals=gate,
    )


async def test_an_approved_command_runs_and_the_model_sees_its_output(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    spec = spec_for(tmp_path, gate, f"{fake_marker('shell')} Run it.")
    events = await run_to_end(provider, spec)
    assert events[-1] == RunFinished("completed", exit_code=0), events
    (ask,) = gate.asked
    assert (ask.kind, ask.tool) == ("command", "Bash")
    assert ask.detail == {"command": SHELL, "cwd": str(spec.cwd)}
    assert "trust me" not in ask.summary and "SHELL-OUTPUT-42" in ask.summary
    assert (spec.cwd / "shell-ran.txt").read_text() == "yes"
    assert replies(events)[-1] == "Shell said: SHELL-OUTPUT-42"
    commands = [e for e in events if isinstance(e, ItemProduced) and e.kind == "command"]
    assert commands and commands[0].data["command"] == SHELL and commands[0].data["status"] == "completed"
    assert any(isinstance(e, SessionStarted) for e in events)


async def test_a_denied_command_does_not_run_and_the_model_reads_the_reason(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=False, reason="DENIED-BY-ALICE: not on Fridays")
    spec = spec_for(tmp_path, gate, f"{fake_marker('shell')} Run it.")
    events = await run_to_end(provider, spec)
    assert len(gate.asked) == 1
    assert not (spec.cwd / "shell-ran.txt").exists()
    assert model_saw(fake, "DENIED-BY-ALICE: not on Fridays")
    assert replies(events)[-1] == "Shell said: DENIED-BY-ALICE: not on Fridays"
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.status == "failed"
    assert finished.error is not None and "Bash (DENIED-BY-ALICE: not on Fridays)" in finished.error


@pytest.mark.parametrize("allow", [True, False])
async def test_a_file_write_is_asked_with_its_diff(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel, allow: bool
) -> None:
    gate = Gate(allow=allow, reason="no notes please")
    spec = spec_for(tmp_path, gate, f"{fake_marker('write')} Write notes.")
    (spec.cwd / "NOTES.md").write_text("old notes\n")
    events = await run_to_end(provider, spec)
    (ask,) = gate.asked
    assert (ask.kind, ask.tool, ask.summary) == ("file_change", "Write", "change NOTES.md")
    (change,) = ask.detail["changes"]
    assert change["path"] == str(spec.cwd / "NOTES.md") and change["kind"] == "update"
    assert "-old notes" in change["diff"] and "+written by the agent" in change["diff"]
    written = (spec.cwd / "NOTES.md").read_text()
    if allow:
        assert written == "written by the agent\n"
        assert events[-1] == RunFinished("completed", exit_code=0)
    else:
        assert written == "old notes\n"
        assert replies(events)[-1] == "Write said: no notes please"


async def test_an_interrupt_while_a_person_decides_ends_the_run_promptly(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True, hold=asyncio.Event())  # never decides
    spec = spec_for(tmp_path, gate, f"{fake_marker('shell')} Run it.")
    run = await provider.start(spec)
    seen: list[ProviderEvent] = []

    async def consume() -> None:
        seen.extend([event async for event in run.events()])

    consumer = asyncio.create_task(consume())
    await asyncio.wait_for(gate.was_asked.wait(), 30)
    await run.interrupt()
    await asyncio.wait_for(consumer, 10)
    assert isinstance(seen[-1], RunFinished) and seen[-1].status == "interrupted", seen
    assert not (spec.cwd / "shell-ran.txt").exists()


async def test_the_threads_next_run_resumes_the_claude_session(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    first = await run_to_end(provider, spec_for(tmp_path, gate, f"{fake_marker('shell')} Run it."))
    (session,) = [e.session_id for e in first if isinstance(e, SessionStarted)]
    spec = spec_for(tmp_path, gate, "And now?", resume=session, run="r2")
    second = await run_to_end(provider, spec)
    assert second[-1] == RunFinished("completed", exit_code=0), second
    assert [e.session_id for e in second if isinstance(e, SessionStarted)] == [session]
    assert "SHELL-OUTPUT-42" in json.dumps(fake.requests[-1]["body"])  # the earlier turn is in its history


async def test_a_daemon_run_at_approval_required_asks_and_is_approved_through_the_api(
    tmp_path: Path, fake: FakeModel
) -> None:
    """peerd's own MCP tool is used without asking; the shell command waits for the API's decision."""
    settings = offline_settings(tmp_path / "clis", fake)
    repo = make_repo(tmp_path / "repo")
    with secure_dir() as home:
        async with running_daemon(home, settings=settings) as daemon, client_for(daemon.paths.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            body = {
                "projectId": project["id"],
                "prompt": f"{fake_marker('tools_then_shell')} Look, then run it.",
                "provider": "claude",
                "runtimeMode": "approval-required",
                "inPlace": True,
            }
            launched = await client.call("POST", "/v1/threads", body=body)
            (approval,) = await pending_approvals(client, seconds=30)
            assert approval["kind"] == "command" and approval["tool"] == "Bash"
            assert approval["detail"] == {"command": SHELL, "cwd": str(repo)}
            assert not (repo / "shell-ran.txt").exists()
            await client.call(
                "POST", f"/v1/approvals/{approval['id']}/decision", body={"decision": "approve"}
            )
            done = await wait_terminal(client, launched["threadId"], launched["runId"], total=60)
            page = await client.call(
                "GET", f"/v1/threads/{launched['threadId']}/items", params={"limit": 100}
            )
            items = page["items"]
            assert done["status"] == "completed", [(i["kind"], i["text"][:200]) for i in items]
            assert (repo / "shell-ran.txt").read_text() == "yes"
            assert any(i["kind"] == "tool_call" and "project_list" in i["text"] for i in items)
            assert [i["text"] for i in items if i["kind"] == "assistant_message"][
                -1
            ] == "Shell said: SHELL-OUTPUT-42"
            assert (await client.call("GET", "/v1/approvals"))["items"] == []


async def test_inside_peerds_sandbox_an_approved_command_writes_the_worktree(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    """A link's run is confined; on the asking path its worktree is writable, as a person approves
    each write (read-only otherwise at approval-required)."""
    gate = Gate(allow=True)
    spec = spec_for(tmp_path, gate, f"{fake_marker('shell')} Run it.")
    work = spec.cwd.resolve()
    confined = Confinement(
        cwd=work,
        worktree=work,
        worktree_writable=False,
        tmp=(Path("/tmp"),),
        binds=sandbox_binds(),  # peerd's Python (a clone under /tmp too), as the run manager binds it
        **system_view(),  # and the system, read-only: nothing else of `/`
        by_link=True,
    )
    events = await run_to_end(provider, dataclasses.replace(spec, confinement=confined))
    assert events[-1] == RunFinished("completed", exit_code=0), events
    assert any(isinstance(e, ItemProduced) and "inside peerd's sandbox" in e.text for e in events)
    assert len(gate.asked) == 1
    assert (work / "shell-ran.txt").read_text() == "yes"


async def test_a_command_runs_in_the_directory_the_person_was_shown(
    tmp_path: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    """A `cd` Claude lets through unasked does not move the next command away from the shown cwd."""
    gate = Gate(allow=True)
    spec = spec_for(tmp_path, gate, f"{fake_marker('cd_then_shell')} Run it.")
    (spec.cwd / "sub").mkdir()
    events = await run_to_end(provider, spec)
    assert events[-1] == RunFinished("completed", exit_code=0), events
    shell = [a for a in gate.asked if a.detail.get("command") == SHELL]
    assert shell and shell[0].detail["cwd"] == str(spec.cwd)
    assert (spec.cwd / "shell-ran.txt").exists() and not (spec.cwd / "sub" / "shell-ran.txt").exists()
