"""The pure Gemini ACP driver, fed the line shapes gemini-cli 0.61.0 really wrote (`--acp`, recorded
against the fake model; long ids and texts shortened)."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from peerd.config import ProviderConfig
from peerd.core.usage import Usage
from peerd.providers.cli import bind_tools, scratch_dir
from peerd.providers.duplex import AskPerson, DuplexOutput, EndInput, Send
from peerd.providers.gemini_acp import duplex_launch, spare_same_minute_session
from peerd.providers.gemini_acp_driver import GeminiAcpDriver
from peerd.runtime.gate import ApprovalAnswer
from peerd.runtime.provider import ItemProduced, RunFinished, RunSpec, SessionStarted, UsageReported

CWD = "/w/repo"
SID = "fe2c95d3-0b02-4358-af44-cc7d6cbe0d30"
SHELL_ID = "run_shell_command__run_shell_command_1796138537971_0"
WRITE_ID = "write_file__write_file_1796138538442_0"
MCP_ID = "mcp_peerd_project_list__mcp_peerd_project_list_1796138597364_0"
COMMAND = "python3 -c \"open('shell-ran.txt','w').write('x')\"; echo SHELL-OUTPUT"
OPTIONS = [
    {"optionId": "proceed_always", "name": "Allow for this session", "kind": "allow_always"},
    {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
]


def driver(resume: str | None = None) -> GeminiAcpDriver:
    return GeminiAcpDriver(prompt="do it", cwd=CWD, resume_session=resume, client_version="0.1.0")


def sent(outputs: Any) -> list[dict[str, Any]]:
    return [dict(o.message) for o in outputs if isinstance(o, Send)]


def events(outputs: Any) -> list[Any]:
    return [o for o in outputs if not isinstance(o, Send | AskPerson | EndInput)]


def update(session_update: str, **fields: Any) -> dict[str, Any]:
    body = {"sessionUpdate": session_update, **fields}
    return {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": SID, "update": body}}


def text_chunk(text: str) -> dict[str, Any]:
    return update("agent_message_chunk", content={"type": "text", "text": text})


def shell_permission(rpc_id: int = 0) -> dict[str, Any]:
    tool_call = {
        "toolCallId": SHELL_ID,
        "status": "pending",
        "title": COMMAND,
        "content": [
            {
                "type": "content",
                "content": {"type": "text", "text": f"[current working directory {CWD}] (make a file)"},
            }
        ],
        "locations": [],
        "kind": "execute",
    }
    params = {"sessionId": SID, "options": OPTIONS, "toolCall": tool_call}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "session/request_permission", "params": params}


def write_permission(rpc_id: int = 1) -> dict[str, Any]:
    diff = {"type": "diff", "path": f"{CWD}/NOTES.md", "oldText": "old\n", "newText": "hello\n"}
    tool_call = {
        "toolCallId": WRITE_ID,
        "status": "pending",
        "title": "Writing to NOTES.md",
        "content": [{**diff, "_meta": {"kind": "modify"}}],
        "locations": [{"path": f"{CWD}/NOTES.md"}],
        "kind": "edit",
    }
    params = {"sessionId": SID, "options": OPTIONS, "toolCall": tool_call}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "session/request_permission", "params": params}


def prompt_done(
    number: int = 1, stop: str = "end_turn", tokens: tuple[int, int] = (30, 15)
) -> dict[str, Any]:
    counts = {"input_tokens": tokens[0], "output_tokens": tokens[1]}
    usage = [{"model": "gemini-2.5-flash", "token_count": counts}]
    meta = {"quota": {"token_count": counts, "model_usage": usage}}
    return {"jsonrpc": "2.0", "id": f"prompt-{number}", "result": {"stopReason": stop, "_meta": meta}}


def started(d: GeminiAcpDriver) -> list[DuplexOutput]:
    """initialize and session/new answered as 0.61.0 answers them; returns the last outputs."""
    d.opening()
    d.feed(
        {"jsonrpc": "2.0", "id": "init", "result": {"protocolVersion": 1, "agentInfo": {"version": "0.61.0"}}}
    )
    return list(d.feed({"jsonrpc": "2.0", "id": "new", "result": {"sessionId": SID, "modes": {}}}))


def test_the_opening_says_the_cli_reads_and_writes_files_itself() -> None:
    (init,) = sent(driver().opening())
    assert init["method"] == "initialize" and init["params"]["protocolVersion"] == 1
    assert init["params"]["clientCapabilities"]["fs"] == {"readTextFile": False, "writeTextFile": False}


def test_a_new_session_is_started_and_prompted() -> None:
    d = driver()
    d.opening()
    (new,) = sent(d.feed({"jsonrpc": "2.0", "id": "init", "result": {"protocolVersion": 1}}))
    assert new["method"] == "session/new" and new["params"] == {"cwd": CWD, "mcpServers": []}
    outputs = d.feed({"jsonrpc": "2.0", "id": "new", "result": {"sessionId": SID}})
    assert events(outputs) == [SessionStarted(SID)]
    (prompt,) = sent(outputs)
    assert prompt["method"] == "session/prompt"
    assert prompt["params"] == {"sessionId": SID, "prompt": [{"type": "text", "text": "do it"}]}


def test_a_shell_command_is_asked_with_its_command_line_and_directory() -> None:
    d = driver()
    started(d)
    (ask,) = [o.ask for o in d.feed(shell_permission()) if isinstance(o, AskPerson)]
    assert (ask.key, ask.kind, ask.tool) == ("0", "command", "run_shell_command")
    assert ask.detail == {"command": COMMAND, "cwd": CWD}
    assert ask.summary == f"run `{COMMAND}` in {CWD}"


def test_an_approval_selects_allow_once_and_the_command_item_follows_its_update() -> None:
    d = driver()
    started(d)
    d.feed(shell_permission())
    (answer,) = sent(d.answered("0", ApprovalAnswer(True)))
    assert answer == {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {"outcome": {"outcome": "selected", "optionId": "proceed_once"}},
    }
    done = update(
        "tool_call_update", toolCallId=SHELL_ID, status="completed", title=COMMAND, content=[], kind="execute"
    )
    (item,) = events(d.feed(done))
    assert item.kind == "command" and item.data["command"] == COMMAND and item.data["status"] == "completed"
    outputs = d.feed(text_chunk("Done."))
    assert outputs == []  # gathered until the turn ends, as on the headless path
    outputs = d.feed(prompt_done())
    assert ItemProduced("assistant_message", "Done.") in outputs
    assert UsageReported(Usage(input_tokens=30, output_tokens=15)) in outputs
    assert outputs[-1] == EndInput(linger_s=1.0)
    assert d.finish(exit_code=0, stderr_tail="", interrupted=False) == RunFinished("completed", exit_code=0)


def test_a_cli_the_shell_ends_after_its_last_turn_completed() -> None:
    """0.61.0 lingers after its input ends; the shell's SIGTERM can land before its own handler
    (a loaded machine): the run completed all the same. Before the end, the signal is a failure."""
    d = driver()
    started(d)
    assert d.feed(prompt_done())[-1] == EndInput(linger_s=1.0)
    assert d.finish(exit_code=-15, stderr_tail="", interrupted=False) == RunFinished("completed", exit_code=0)
    early = driver()
    started(early)
    assert early.finish(exit_code=-15, stderr_tail="", interrupted=False).status == "failed"


def test_a_denial_selects_reject_and_its_reason_reaches_the_model_in_a_follow_up_turn() -> None:
    d = driver()
    started(d)
    d.feed(shell_permission())
    outputs = d.answered("0", ApprovalAnswer(False, "not on Fridays"))
    (answer,) = sent(outputs)
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "cancel"}}
    (item,) = events(outputs)
    assert item.kind == "command" and item.data["status"] == "failed"
    assert "denied by a person: not on Fridays" in item.text
    d.feed(text_chunk('Tool "run_shell_command" was canceled by the user.'))
    outputs = d.feed(prompt_done())
    (notice,) = [e for e in events(outputs) if isinstance(e, ItemProduced) and e.kind == "notice"]
    assert notice.data["denials"] == [f"run `{COMMAND}` in {CWD}: not on Fridays"]
    (follow_up,) = sent(outputs)
    assert follow_up["method"] == "session/prompt" and follow_up["id"] == "prompt-2"
    text = follow_up["params"]["prompt"][0]["text"]
    assert f"run `{COMMAND}` in {CWD}: not on Fridays" in text
    outputs = d.feed(prompt_done(2, tokens=(12, 6)))
    assert UsageReported(Usage(input_tokens=42, output_tokens=21)) in outputs  # both turns
    assert outputs[-1] == EndInput(linger_s=1.0)


def test_a_denial_without_a_reason_needs_no_follow_up() -> None:
    d = driver()
    started(d)
    d.feed(shell_permission())
    d.answered("0", ApprovalAnswer(False))
    assert d.feed(prompt_done())[-1] == EndInput(linger_s=1.0)


def test_a_file_write_is_asked_with_its_diff() -> None:
    d = driver()
    started(d)
    (ask,) = [o.ask for o in d.feed(write_permission()) if isinstance(o, AskPerson)]
    assert (ask.kind, ask.tool, ask.summary) == ("file_change", "write_file", "change NOTES.md")
    (change,) = ask.detail["changes"]
    assert change["path"] == f"{CWD}/NOTES.md" and change["kind"] == "update"
    assert "--- a/NOTES.md" in change["diff"] and "-old" in change["diff"] and "+hello" in change["diff"]


def test_without_an_allow_once_option_an_approval_answers_cancelled() -> None:
    d = driver()
    started(d)
    line = shell_permission()
    line["params"]["options"] = [o for o in OPTIONS if o["kind"] != "allow_once"]
    d.feed(line)
    (answer,) = sent(d.answered("0", ApprovalAnswer(True)))
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}


def test_peerds_own_tool_runs_unasked_and_is_a_tool_call_item() -> None:
    d = driver()
    started(d)
    args = {"type": "content", "content": {"type": "text", "text": '{"limit":5}'}}
    begun = update("tool_call", toolCallId=MCP_ID, status="in_progress", title="project_list (peerd MCP Server)",
                   content=[args], locations=[], kind="other")  # fmt: skip
    assert d.feed(begun) == []
    result = {"type": "content", "content": {"type": "text", "text": '{"projects": []}'}}
    done = update("tool_call_update", toolCallId=MCP_ID, status="completed", content=[result], kind="other")
    (item,) = events(d.feed(done))
    assert item.kind == "tool_call" and item.text == "peerd.project_list"
    assert item.data["arguments"] == {"limit": 5} and item.data["result"] == '{"projects": []}'


def test_a_resumed_session_is_loaded_and_its_history_is_not_this_runs() -> None:
    d = driver(resume=SID)
    d.opening()
    (load,) = sent(d.feed({"jsonrpc": "2.0", "id": "init", "result": {"protocolVersion": 1}}))
    assert load["method"] == "session/load" and load["params"] == {
        "sessionId": SID,
        "cwd": CWD,
        "mcpServers": [],
    }
    assert d.feed(update("user_message_chunk", content={"type": "text", "text": "earlier"})) == []
    outputs = d.feed({"jsonrpc": "2.0", "id": "load", "result": {"modes": {}}})
    assert events(outputs) == [SessionStarted(SID)]
    (barrier,) = sent(outputs)
    # The rest of the history is streamed back after the load's answer, before the barrier's.
    old_tool = update(
        "tool_call", toolCallId=SHELL_ID, status="completed", title="ls", content=[], kind="execute"
    )
    assert d.feed(old_tool) == [] and d.feed(text_chunk("the earlier reply")) == []
    unknown = {"code": -32601, "message": f"Method not found: {barrier['method']}"}
    (prompt,) = sent(d.feed({"jsonrpc": "2.0", "id": barrier["id"], "error": unknown}))
    assert prompt["method"] == "session/prompt"
    d.feed(text_chunk("now"))
    assert [e.text for e in events(d.feed(prompt_done())) if isinstance(e, ItemProduced)] == ["now"]


def test_a_session_that_cannot_be_loaded_starts_a_new_one_with_a_notice() -> None:
    d = driver(resume=SID)
    d.opening()
    d.feed({"jsonrpc": "2.0", "id": "init", "result": {"protocolVersion": 1}})
    error = {
        "code": -32603,
        "message": "Internal error",
        "data": {"details": "No previous sessions found for this project."},
    }
    outputs = d.feed({"jsonrpc": "2.0", "id": "load", "error": error})
    (notice,) = events(outputs)
    assert (
        notice.kind == "notice"
        and "No previous sessions found" in notice.text
        and "new session" in notice.text
    )
    assert [m["method"] for m in sent(outputs)] == ["session/new"]


def test_an_interrupt_cancels_the_turn_and_every_open_question() -> None:
    d = driver()
    started(d)
    d.feed(shell_permission(0))
    d.feed(write_permission(1))
    out = sent(d.interrupting())
    assert out[0] == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SID}}
    assert [(m["id"], m["result"]) for m in out[1:]] == [(0, {"outcome": {"outcome": "cancelled"}}),
                                                         (1, {"outcome": {"outcome": "cancelled"}})]  # fmt: skip
    assert d.answered("0", ApprovalAnswer(True)) == []  # a late decision is not sent
    assert d.feed({"jsonrpc": "2.0", "id": "prompt-1", "result": {"stopReason": "cancelled"}})[
        -1
    ] == EndInput(linger_s=1.0)
    assert d.finish(exit_code=0, stderr_tail="", interrupted=True) == RunFinished("interrupted", exit_code=0)


def test_a_failed_prompt_fails_the_run_with_the_clis_message() -> None:
    d = driver()
    started(d)
    error = {"code": 400, "message": "FAKE-MODEL: this request was rejected (xyz)"}
    assert d.feed({"jsonrpc": "2.0", "id": "prompt-1", "error": error})[-1] == EndInput(linger_s=1.0)
    finished = d.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert finished.status == "failed" and finished.error == "FAKE-MODEL: this request was rejected (xyz)"


def test_a_turn_stopped_by_its_limit_fails_the_run() -> None:
    d = driver()
    started(d)
    d.feed(prompt_done(stop="max_turn_requests"))
    finished = d.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert finished.status == "failed" and finished.error is not None and "turn limit" in finished.error


def test_a_session_that_could_not_start_fails_the_run_with_why() -> None:
    d = driver()
    d.opening()
    d.feed({"jsonrpc": "2.0", "id": "init", "result": {"protocolVersion": 1}})
    auth = {"code": -32000, "message": "Gemini API key is missing or not configured."}
    assert d.feed({"jsonrpc": "2.0", "id": "new", "error": auth})[-1] == EndInput(linger_s=1.0)
    finished = d.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert (
        finished.status == "failed" and finished.error is not None and "API key is missing" in finished.error
    )


def test_file_system_requests_are_refused_not_left_hanging() -> None:
    d = driver()
    started(d)
    read = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "fs/read_text_file",
        "params": {"sessionId": SID, "path": "/etc/x"},
    }
    (answer,) = sent(d.feed(read))
    assert answer["id"] == 7 and answer["error"]["code"] == -32601


def test_a_session_file_of_this_minute_is_moved_out_of_the_loads_way(tmp_path: Path) -> None:
    chats = tmp_path / "tmp" / "repo" / "chats"
    chats.mkdir(parents=True)
    now = datetime(2026, 12, 1, 15, 33, 20, tzinfo=UTC)
    mine = chats / "session-2026-12-01T15-33-fe2c95d3.jsonl"
    mine.write_text("{}")
    taken = chats / "session-2026-12-01T15-32-fe2c95d3.jsonl"
    taken.write_text("{}")
    older = chats / "session-2026-12-01T15-20-aaaaaaaa.jsonl"
    older.write_text("{}")
    assert spare_same_minute_session(tmp_path, SID, now) == [
        chats / "session-2026-12-01T15-31-fe2c95d3.jsonl"
    ]
    assert not mine.exists() and taken.exists() and older.exists()
    assert spare_same_minute_session(tmp_path, SID, now) == []  # nothing of this minute left


def test_only_a_session_id_gemini_made_names_the_files_moved(tmp_path: Path) -> None:
    chats = tmp_path / "tmp" / "repo" / "chats"
    chats.mkdir(parents=True)
    now = datetime(2026, 12, 1, 15, 33, 20, tzinfo=UTC)
    other = chats / "session-2026-12-01T15-33-aaaaaaaa.jsonl"
    other.write_text("{}")
    for hostile in ("*", "aaaa*", "[a]aaaaaaa", "../../x", ""):
        assert spare_same_minute_session(tmp_path, hostile, now) == []
    assert other.exists()


def test_the_launch_keeps_peerds_tools_as_on_the_headless_path_and_the_token_out_of_argv(
    tmp_path: Path,
) -> None:
    url = "http://127.0.0.1:4242/mcp"
    tool_env = {
        "PEERD_SOCKET": "/run/peerd.sock",
        "PEERD_RUN_TOKEN": "secret-token-value",
        "PEERD_MCP_URL": url,
    }
    s = RunSpec("t1", "r1", "fix it", tmp_path / "wt", "gemini-2.5-flash", "approval-required", "default", None,
                tmp_path / "state", tool_env)  # fmt: skip
    scratch = scratch_dir(s)
    built = duplex_launch(
        "gemini", s, ProviderConfig(model_retries=2, args=["--x"]), bind_tools(s, scratch), scratch
    )
    assert built is not None
    launch, _ = built
    assert launch.argv == ["gemini", "--acp", "--skip-trust", "-m", "gemini-2.5-flash", "--approval-mode", "default",
                           "--allowed-mcp-server-names", "peerd", "--x"]  # fmt: skip
    assert launch.stdin is None and launch.skip_sigint
    assert not any("secret-token-value" in part for part in [*launch.argv, *launch.env.values()])
    settings_path = Path(launch.env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"])
    assert stat.S_IMODE(settings_path.stat().st_mode) == 0o600
    settings = json.loads(settings_path.read_text())
    server = settings["mcpServers"]["peerd"]
    assert server["httpUrl"] == url and server["trust"] is True
    assert server["headers"] == {"Authorization": "Bearer secret-token-value"}
    assert settings["general"] == {"maxAttempts": 3}
