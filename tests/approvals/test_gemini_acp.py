"""The real Gemini CLI (pinned 0.61.0) at approval-required with a gate: ACP mode (`--acp`), its
`session/request_permission` requests answered by peerd's gate, and the model sees the outcome.
Offline against the fake model; the provider is started directly with a small in-test gate, and once
in a real daemon whose approval is decided through the API."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.providers.coders import CoderProvider
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
from tests.realcli import fake_marker, offline_settings, sandbox_binds, secure_dir, system_view
from tests.support.approvals import Gate, model_saw, pending_approvals, replies, run_to_end

pytestmark = pytest.mark.slow  # the real coder CLIs

SHELL = "python3 -c \"open('shell-ran.txt', 'w').write('yes')\" && echo SHELL-OUTPUT-42"
REASON = "DENIED-BY-ALICE: not on Fridays"
SHELL_STEP = {
    "tool_call": {"name": "run_shell_command", "arguments": {"command": SHELL, "description": "run"}}
}
SCRIPTS: dict[str, dict[str, Any]] = {
    "shell": {"steps": [SHELL_STEP, {"text": "Shell said: {tool_result}"}], "fallback_text": "side request"},
    "write": {
        "steps": [
            {
                "tool_call": {
                    "name": "write_file",
                    "arguments": {"file_path": "{cwd}/NOTES.md", "content": "written by the agent\n"},
                }
            },
            {"text": "Write said: {tool_result}"},
        ],
        "fallback_text": "side request",
    },
    "tools_then_shell": {
        "steps": [
            {"tool_call": {"server": "peerd", "tool": "project_list", "arguments": {}}},
            SHELL_STEP,
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
    config = offline_settings(tmp_path / "clis", fake).providers["gemini"]
    return CoderProvider("gemini", "gemini", config)


@pytest.fixture
def state() -> Iterator[Path]:
    with secure_dir() as path:  # Gemini CLI ignores a settings file below a world-writable dir
        yield path


def spec_for(
    tmp_path: Path, state: Path, gate: Gate, prompt: str, *, resume: str | None = None, run: str = "r1"
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
        state_dir=state,
        approvals=gate,
    )


def items(events: list[ProviderEvent], kind: str) -> list[ItemProduced]:
    return [e for e in events if isinstance(e, ItemProduced) and e.kind == kind]


async def test_an_approved_command_runs_and_the_model_sees_its_output(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    spec = spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Run it.")
    events = await run_to_end(provider, spec)
    assert events[-1] == RunFinished("completed", exit_code=0), events
    (ask,) = gate.asked
    assert (ask.kind, ask.tool) == ("command", "run_shell_command")
    assert ask.detail == {"command": SHELL, "cwd": str(spec.cwd)}
    assert ask.summary.startswith("run `python3 -c") and ask.summary.endswith(f"in {spec.cwd}")
    assert (spec.cwd / "shell-ran.txt").read_text() == "yes"
    assert model_saw(fake, "SHELL-OUTPUT-42")
    assert replies(events)[-1].startswith("Shell said: ") and "SHELL-OUTPUT-42" in replies(events)[-1]
    (command,) = items(events, "command")
    assert command.data["command"] == SHELL and command.data["status"] == "completed"
    assert any(isinstance(e, SessionStarted) for e in events)
    usage = [e.usage for e in events if isinstance(e, UsageReported)]
    assert usage and (usage[-1].input_tokens, usage[-1].output_tokens) == (20, 10)  # 2 requests of 10 + 5


async def test_a_denied_command_does_not_run_and_the_model_reads_the_reason(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=False, reason=REASON)
    spec = spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Run it.")
    events = await run_to_end(provider, spec)
    assert len(gate.asked) == 1
    assert not (spec.cwd / "shell-ran.txt").exists()
    assert model_saw(fake, 'Tool \\"run_shell_command\\" was canceled by the user.')  # Gemini's own words
    # ...and the reason, in the follow-up turn (Gemini CLI cannot carry it with the denial).
    follow_up = fake.requests[-1]["body"]["contents"][-1]
    assert follow_up["role"] == "user" and REASON in json.dumps(follow_up)
    assert events[-1] == RunFinished("completed", exit_code=0), events
    (command,) = items(events, "command")
    assert command.data["status"] == "failed" and REASON in command.text


@pytest.mark.parametrize("allow", [True, False])
async def test_a_file_write_is_asked_with_its_diff(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel, allow: bool
) -> None:
    gate = Gate(allow=allow, reason="no notes please")
    spec = spec_for(tmp_path, state, gate, f"{fake_marker('write')} Write notes.")
    (spec.cwd / "NOTES.md").write_text("old notes\n")
    events = await run_to_end(provider, spec)
    (ask,) = gate.asked
    assert (ask.kind, ask.tool, ask.summary) == ("file_change", "write_file", "change NOTES.md")
    (change,) = ask.detail["changes"]
    assert change["path"] == str(spec.cwd / "NOTES.md") and change["kind"] == "update"
    assert "-old notes" in change["diff"] and "+written by the agent" in change["diff"]
    written = (spec.cwd / "NOTES.md").read_text()
    assert events[-1] == RunFinished("completed", exit_code=0), events
    (item,) = items(events, "file_change")
    if allow:
        assert written == "written by the agent\n"
        assert item.data["status"] == "completed"
    else:
        assert written == "old notes\n"
        assert item.data["status"] == "failed"
        assert "no notes please" in json.dumps(fake.requests[-1]["body"]["contents"][-1])


async def test_an_interrupt_while_a_person_decides_ends_the_run_promptly(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True, hold=asyncio.Event())  # never decides
    spec = spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Run it.")
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


async def test_the_threads_next_run_resumes_the_gemini_session(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    first = await run_to_end(provider, spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Run it."))
    (session,) = [e.session_id for e in first if isinstance(e, SessionStarted)]
    spec = spec_for(tmp_path, state, gate, "And now?", resume=session, run="r2")
    second = await run_to_end(provider, spec)
    assert second[-1] == RunFinished("completed", exit_code=0), second
    assert [e.session_id for e in second if isinstance(e, SessionStarted)] == [session], items(
        second, "notice"
    )
    assert "SHELL-OUTPUT-42" in json.dumps(fake.requests[-1]["body"])  # the earlier turn is in its history
    # The loaded history streamed back is not this run's: one reply, no tool items.
    assert len(replies(second)) == 1 and not items(second, "command"), second
    assert len(gate.asked) == 1


async def test_a_session_that_cannot_be_loaded_starts_a_new_one_with_a_notice(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    gate = Gate(allow=True)
    gone = "00000000-0000-4000-8000-000000000000"
    events = await run_to_end(
        provider, spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Go.", resume=gone)
    )
    assert events[-1] == RunFinished("completed", exit_code=0), events
    assert any(gone in n.text and "new session" in n.text for n in items(events, "notice"))
    (session,) = [e.session_id for e in events if isinstance(e, SessionStarted)]
    assert session != gone


async def test_inside_peerds_sandbox_an_approved_command_writes_the_worktree(
    tmp_path: Path, state: Path, provider: CoderProvider, fake: FakeModel
) -> None:
    """A link's run is confined; on the asking path its worktree is writable, as a person approves
    each write (read-only otherwise at approval-required)."""
    gate = Gate(allow=True)
    spec = spec_for(tmp_path, state, gate, f"{fake_marker('shell')} Run it.")
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
    assert any("inside peerd's sandbox" in n.text for n in items(events, "notice"))
    assert len(gate.asked) == 1
    assert (work / "shell-ran.txt").read_text() == "yes"


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
                "provider": "gemini",
                "runtimeMode": "approval-required",
                "inPlace": True,
            }
            launched = await client.call("POST", "/v1/threads", body=body)
            (approval,) = await pending_approvals(client, seconds=30)
            assert approval["kind"] == "command" and approval["tool"] == "run_shell_command"
            assert approval["detail"] == {"command": SHELL, "cwd": str(repo)}
            assert not (repo / "shell-ran.txt").exists()
            await client.call(
                "POST", f"/v1/approvals/{approval['id']}/decision", body={"decision": "approve"}
            )
            done = await wait_terminal(client, launched["threadId"], launched["runId"], total=60)
            page = await client.call(
                "GET", f"/v1/threads/{launched['threadId']}/items", params={"limit": 100}
            )
            found = page["items"]
            assert done["status"] == "completed", [(i["kind"], i["text"][:200]) for i in found]
            assert (repo / "shell-ran.txt").read_text() == "yes"
            assert any(i["kind"] == "tool_call" and "project_list" in i["text"] for i in found)
            reply = [i["text"] for i in found if i["kind"] == "assistant_message"][-1]
            assert reply.startswith("Shell said: ") and "SHELL-OUTPUT-42" in reply
            assert (await client.call("GET", "/v1/approvals"))["items"] == []
