"""The scripted provider end to end: real `script_agent` subprocesses, a real Unix-socket server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from peerd.errors import ProviderError
from peerd.providers.script import ScriptProvider, ScriptRun
from peerd.runtime.process import ProviderProcess
from peerd.runtime.provider import ItemProduced, ProviderEvent, RunFinished, RunSpec, SessionStarted
from tests.support.eventually import eventually

TOKEN = "run-token-123"


def script(*steps: Mapping[str, Any]) -> str:
    return "Do the thing.\n```peerd-script\n" + json.dumps({"steps": list(steps)}) + "\n```\n"


def make_spec(
    tmp_path: Path,
    prompt: str,
    *,
    runtime_mode: str = "full-access",
    interaction_mode: str = "default",
    resume: str | None = None,
    tool_env: Mapping[str, str] | None = None,
) -> RunSpec:
    cwd = tmp_path / "wt"
    cwd.mkdir(exist_ok=True)
    return RunSpec(
        thread_id="th_1",
        run_id="run_1",
        prompt=prompt,
        cwd=cwd,
        model="scripted-1",
        runtime_mode=runtime_mode,
        interaction_mode=interaction_mode,
        resume_session=resume,
        state_dir=tmp_path / "state",
        tool_env=dict(tool_env or {}),
    )


async def collect(run: ScriptRun) -> list[ProviderEvent]:
    async with asyncio.timeout(30):
        events = [event async for event in run.events()]
    finished = [e for e in events if isinstance(e, RunFinished)]
    assert len(finished) == 1
    assert events[-1] is finished[0]
    return events


async def run_prompt(tmp_path: Path, prompt: str, **kwargs: Any) -> list[ProviderEvent]:
    run = await ScriptProvider().start(make_spec(tmp_path, prompt, **kwargs))
    return await collect(run)


def items(events: list[ProviderEvent]) -> list[ItemProduced]:
    return [e for e in events if isinstance(e, ItemProduced)]


def finish(events: list[ProviderEvent]) -> RunFinished:
    last = events[-1]
    assert isinstance(last, RunFinished)
    return last


def session_id(events: list[ProviderEvent]) -> str:
    first = events[0]
    assert isinstance(first, SessionStarted)
    return first.session_id


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_reply_write_edit_run_and_wait_steps(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path,
        script(
            {"reply": "Looking at it."},
            {"write": {"path": "src/app.txt", "content": "hello world\n"}},
            {"edit": {"path": "src/app.txt", "old": "world", "new": "peerd"}},
            {"run": "cat src/app.txt; echo warn >&2; exit 4"},
            {"wait": 0.01},
            {"reply": "Done."},
        ),
    )
    assert len(session_id(events)) == 32
    assert [(i.kind, i.text, dict(i.data)) for i in items(events)] == [
        ("assistant_message", "Looking at it.", {}),
        # with what the step left in the file (orchestrate's proof that a change is the coder's)
        (
            "file_change",
            "src/app.txt",
            {"action": "write", "path": "src/app.txt", "sha256": _sha(b"hello world\n")},
        ),
        (
            "file_change",
            "src/app.txt",
            {"action": "edit", "path": "src/app.txt", "sha256": _sha(b"hello peerd\n")},
        ),
        (
            "command",
            "cat src/app.txt; echo warn >&2; exit 4",
            {"exit_code": 4, "output": "hello peerd\nwarn\n"},
        ),
        ("assistant_message", "Done.", {}),
    ]
    assert (tmp_path / "wt" / "src" / "app.txt").read_text() == "hello peerd\n"
    assert finish(events) == RunFinished("completed", exit_code=0)


async def test_command_output_is_truncated_to_64_kib(tmp_path: Path) -> None:
    events = await run_prompt(tmp_path, script({"run": "head -c 200000 /dev/zero | tr '\\0' x"}))
    (command,) = items(events)
    assert command.data["exit_code"] == 0
    assert command.data["output"] == "x" * 65536


async def test_checked_command_failure_fails_the_run(tmp_path: Path) -> None:
    events = await run_prompt(tmp_path, script({"run": {"cmd": "exit 2", "check": True}}, {"reply": "never"}))
    assert [i.kind for i in items(events)] == ["command", "error"]
    result = finish(events)
    assert result.status == "failed"
    assert result.error == "Command failed with exit code 2: exit 2"
    assert result.exit_code == 1


async def test_edit_of_missing_text_fails(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path,
        script(
            {"write": {"path": "f.txt", "content": "abc"}},
            {"edit": {"path": "f.txt", "old": "zz", "new": "y"}},
        ),
    )
    assert items(events)[-1].kind == "error"
    assert finish(events).status == "failed"
    assert "not found in f.txt" in (finish(events).error or "")


async def test_long_reply(tmp_path: Path) -> None:
    events = await run_prompt(tmp_path, script({"reply_repeat": {"text": "ab", "times": 22_500}}))
    (reply,) = items(events)
    assert reply.text == "ab" * 22_500
    assert len(reply.text) == 45_000
    assert finish(events).status == "completed"


async def test_plain_prompt_is_echoed(tmp_path: Path) -> None:
    prompt = "héllo ✓ " + "z" * 5000
    events = await run_prompt(tmp_path, prompt)
    (reply,) = items(events)
    assert reply == ItemProduced("assistant_message", "(script) " + prompt[:2000])
    assert finish(events).status == "completed"


async def test_script_file_reference(tmp_path: Path) -> None:
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / "plan.json").write_text(json.dumps({"steps": [{"reply": "from a file"}]}))
    events = await run_prompt(tmp_path, "Please follow\npeerd-script: plan.json\n")
    assert [i.text for i in items(events)] == ["from a file"]


async def test_fail_step(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path, script({"reply": "trying"}, {"fail": "cannot do it"}, {"reply": "never"})
    )
    assert [(i.kind, i.text) for i in items(events)] == [
        ("assistant_message", "trying"),
        ("error", "cannot do it"),
    ]
    assert finish(events) == RunFinished("failed", error="cannot do it", exit_code=1)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("```peerd-script\n{not json\n```\n", "is not valid JSON"),
        ("```peerd-script\n" + json.dumps({"steps": [{"dance": 1}]}) + "\n```\n", "exactly one action"),
        ("peerd-script: missing.json\n", "cannot read peerd-script file missing.json"),
    ],
)
async def test_invalid_script(tmp_path: Path, prompt: str, message: str) -> None:
    events = await run_prompt(tmp_path, prompt)
    assert isinstance(events[0], SessionStarted)
    (error,) = items(events)
    assert error.kind == "error"
    assert message in error.text
    assert finish(events).status == "failed"
    assert (finish(events).error or "").startswith("Invalid script")


@pytest.mark.slow
async def test_session_resume_with_a_runs_script(tmp_path: Path) -> None:
    runs = {"runs": [{"steps": [{"reply": "first"}]}, {"steps": [{"reply": "second"}]}]}
    first = await run_prompt(tmp_path, "```peerd-script\n" + json.dumps(runs) + "\n```")
    sid = session_id(first)
    assert [i.text for i in items(first)] == ["first"]

    second = await run_prompt(tmp_path, "Wake up: your task finished.", resume=sid)
    assert session_id(second) == sid
    assert [i.text for i in items(second)] == ["second"]

    third = await run_prompt(tmp_path, "anything else?", resume=sid)
    assert [i.text for i in items(third)] == ["(script) anything else?"]
    assert finish(third).status == "completed"


async def test_unknown_resume_id_fails_with_the_coder_message(tmp_path: Path) -> None:
    events = await run_prompt(tmp_path, "hi", resume="deadbeef")
    assert len(events) == 1
    result = finish(events)
    assert result.status == "failed"
    assert result.exit_code == 1
    assert "No session found with id deadbeef" in (result.error or "")


@pytest.mark.parametrize(
    ("mode", "step", "message"),
    [
        (
            "read-only",
            {"write": {"path": "a", "content": ""}},
            "runtime mode read-only: write needs auto-accept-edits",
        ),
        ("approval-required", {"edit": {"path": "a", "old": "", "new": ""}}, "edit needs auto-accept-edits"),
        ("auto-accept-edits", {"run": "true"}, "runtime mode auto-accept-edits: run needs auto"),
    ],
)
async def test_runtime_mode_denial(tmp_path: Path, mode: str, step: dict[str, Any], message: str) -> None:
    events = await run_prompt(tmp_path, script({"reply": "go"}, step), runtime_mode=mode)
    error = items(events)[-1]
    assert error.kind == "error"
    assert error.text.startswith("Denied by ")
    assert message in error.text
    assert finish(events).status == "failed"
    assert not (tmp_path / "wt" / "a").exists()


async def test_runtime_mode_allows_what_it_covers(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path, script({"write": {"path": "a", "content": "x"}}), runtime_mode="auto-accept-edits"
    )
    assert finish(events).status == "completed"
    assert (tmp_path / "wt" / "a").read_text() == "x"


async def test_paths_outside_the_worktree_are_denied(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path, script({"write": {"path": "../escape", "content": "x"}}), runtime_mode="auto"
    )
    assert "outside the worktree" in (finish(events).error or "")
    assert not (tmp_path / "escape").exists()


async def test_plan_mode_makes_no_changes(tmp_path: Path) -> None:
    events = await run_prompt(
        tmp_path, script({"reply": "planning"}, {"run": "touch made"}), interaction_mode="plan"
    )
    assert items(events)[0].text == "planning"
    assert "plan mode makes no changes" in items(events)[-1].text
    assert finish(events).status == "failed"
    assert not (tmp_path / "wt" / "made").exists()


async def test_wait_for_file_holds_the_run_until_the_file_appears(tmp_path: Path) -> None:
    run = await ScriptProvider().start(
        make_spec(tmp_path, script({"reply": "ready"}, {"wait_for_file": "go"}, {"reply": "done"}))
    )
    seen: list[ProviderEvent] = []
    async with asyncio.timeout(30):
        async for event in run.events():
            seen.append(event)
            if isinstance(event, ItemProduced) and event.text == "ready":
                (tmp_path / "wt" / "go").touch()
    assert [i.text for i in items(seen)] == ["ready", "done"]
    assert finish(seen).status == "completed"


async def test_interrupt_kills_the_whole_group(tmp_path: Path) -> None:
    prompt = script(
        {"reply": "starting"}, {"run": "echo $$ > sleep.tmp && mv sleep.tmp sleep.pid; exec sleep 30"}
    )
    run = await ScriptProvider().start(make_spec(tmp_path, prompt))
    pgid = run.pgid
    assert pgid is not None
    events = run.events()
    assert isinstance(await anext(events), SessionStarted)
    assert await anext(events) == ItemProduced("assistant_message", "starting")
    await eventually((tmp_path / "wt" / "sleep.pid").exists, what="the run's sleep.pid", every=0.01)
    sleep_pid = int((tmp_path / "wt" / "sleep.pid").read_text())

    started = time.monotonic()
    await run.interrupt()
    async with asyncio.timeout(10):
        rest = [event async for event in events]
    assert time.monotonic() - started < 5
    assert rest[-1] == RunFinished("interrupted", exit_code=130)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with pytest.raises(ProcessLookupError):
        os.kill(sleep_pid, 0)


async def test_interrupt_during_a_wait_step(tmp_path: Path) -> None:
    run = await ScriptProvider().start(
        make_spec(tmp_path, script({"reply": "holding"}, {"wait_for_file": "never"}))
    )
    events = run.events()
    assert isinstance(await anext(events), SessionStarted)
    assert await anext(events) == ItemProduced("assistant_message", "holding")
    await run.interrupt()
    async with asyncio.timeout(10):
        assert [event async for event in events] == [RunFinished("interrupted", exit_code=130)]


async def test_crash_without_result_maps_to_failed_with_stderr(tmp_path: Path) -> None:
    process = await ProviderProcess.spawn(
        ["sh", "-c", "echo oops >&2; exit 3"], cwd=tmp_path, env=dict(os.environ), stdin_data=None
    )
    events = await collect(ScriptRun(process))
    assert events == [RunFinished("failed", error="oops", exit_code=3)]


async def test_noise_and_unknown_events_are_ignored(tmp_path: Path) -> None:
    lines = [
        "garbage line",
        '{"type": "session", "session_id": "s1"}',
        '{"type": "telemetry", "x": 1}',
        '{"type": "item", "kind": "reasoning", "text": "hmm"}',
        '{"type": "item", "kind": "assistant_message", "text": "hi", "data": [1]}',
        '{"type": "result", "status": "completed"}',
        '{"type": "item", "kind": "assistant_message", "text": "after the end"}',
    ]
    body = "".join(f"echo '{line}'; " for line in lines) + "echo noise >&2"
    process = await ProviderProcess.spawn(
        ["sh", "-c", body], cwd=tmp_path, env=dict(os.environ), stdin_data=None
    )
    events = await collect(ScriptRun(process))
    assert events == [
        SessionStarted("s1"),
        ItemProduced("assistant_message", "hi"),
        RunFinished("completed", exit_code=0),
    ]


async def test_start_failure_is_a_provider_error(tmp_path: Path) -> None:
    with pytest.raises(ProviderError):
        await ScriptProvider(python="/nonexistent/python").start(make_spec(tmp_path, "hi"))


# --- agent tools over a real Unix-socket server -------------------------------------------------


@pytest.fixture
async def tool_server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"code": "unauthorized", "message": "bad run token"}, status=401)
        name = request.match_info["name"]
        arguments = await request.json()
        calls.append({"name": name, "arguments": arguments})
        if name == "project_list":
            return web.json_response({"result": {"projects": ["alpha"], "echo": arguments}})
        return web.json_response({"code": "not_found", "message": f"no tool {name}"}, status=404)

    app = web.Application()
    app.router.add_post("/v1/tools/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    # A short directory: Unix socket paths are limited to ~108 bytes.
    with tempfile.TemporaryDirectory(prefix="pd") as short:
        path = str(Path(short) / "peerd.sock")
        await web.UnixSite(runner, path).start()
        try:
            yield path, calls
        finally:
            await runner.cleanup()


async def test_tool_step_calls_peerd_with_the_run_token(
    tmp_path: Path, tool_server: tuple[str, list[dict[str, Any]]]
) -> None:
    path, calls = tool_server
    prompt = script(
        {"tool": {"name": "project_list", "arguments": {"limit": 5}}},
        {"tool": {"name": "no_such_tool", "arguments": {}}},
        {"reply": "still going"},
    )
    events = await run_prompt(tmp_path, prompt, tool_env={"PEERD_SOCKET": path, "PEERD_RUN_TOKEN": TOKEN})
    ok, missing, reply = items(events)
    assert ok == ItemProduced(
        "tool_call",
        "project_list",
        {"arguments": {"limit": 5}, "result": {"projects": ["alpha"], "echo": {"limit": 5}}, "error": None},
    )
    assert missing.data["error"] == {"code": "not_found", "message": "no tool no_such_tool"}
    assert missing.data["result"] is None
    assert reply.text == "still going"
    assert finish(events).status == "completed"
    assert [c["name"] for c in calls] == ["project_list", "no_such_tool"]


async def test_tool_step_with_a_bad_token_and_check_fails(
    tmp_path: Path, tool_server: tuple[str, list[dict[str, Any]]]
) -> None:
    path, calls = tool_server
    prompt = script({"tool": {"name": "project_list", "arguments": {}, "check": True}}, {"reply": "never"})
    events = await run_prompt(tmp_path, prompt, tool_env={"PEERD_SOCKET": path, "PEERD_RUN_TOKEN": "wrong"})
    call, error = items(events)
    assert call.data["error"] == {"code": "unauthorized", "message": "bad run token"}
    assert error.kind == "error"
    assert finish(events).error == "Tool project_list failed: unauthorized: bad run token"
    assert calls == []


async def test_tool_step_without_a_binding_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A binding in the daemon's own environment must not leak into a run.
    monkeypatch.setenv("PEERD_SOCKET", "/nonexistent.sock")
    events = await run_prompt(tmp_path, script({"tool": {"name": "project_list", "arguments": {}}}))
    (call,) = items(events)
    assert call.data["error"] == {
        "code": "unavailable",
        "message": "peerd agent tools are not configured for this run",
    }
    assert finish(events).status == "completed"
