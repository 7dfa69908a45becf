"""The codex app-server driver, pure: the lines are the ones codex-cli 0.171.0 wrote (trimmed)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peerd.config import ProviderConfig
from peerd.core.usage import Usage
from peerd.providers.cli import TOKEN_ENV, bind_tools, scratch_dir
from peerd.providers.coders import CODEX_NO_SANDBOX
from peerd.providers.codex_appserver import app_server_args, duplex_launch
from peerd.providers.codex_rpc import CodexAppServerDriver, exec_shape
from peerd.providers.duplex import AskPerson, DuplexOutput, EndInput, Send
from peerd.runtime.gate import ApprovalAnswer
from peerd.runtime.provider import ItemProduced, RunFinished, RunSpec, SessionStarted, UsageReported
from peerd.runtime.sandbox import Confinement

THREAD = "01a23232-7c9e-77e0-bfa7-e5fe9ba9fc90"
TURN = "01a23232-7ccd-7572-ab43-6901d3a5b228"
CWD = "/tmp/h12/run/work"
PARAMS = {"cwd": CWD, "approvalPolicy": "untrusted", "sandbox": "danger-full-access", "model": "fake-model"}

INIT_OK = {"id": 1, "result": {"userAgent": "peerd/0.171.0", "codexHome": "/h/codex", "platformOs": "linux"}}
THREAD_OK = {
    "id": 2,
    "result": {
        "thread": {"id": THREAD, "sessionId": THREAD, "cliVersion": "0.171.0", "status": {"type": "idle"}},
        "approvalPolicy": "untrusted",
        "sandbox": {"type": "dangerFullAccess"},
    },
}
TURN_OK = {"id": 3, "result": {"turn": {"id": TURN, "items": [], "status": "inProgress", "error": None}}}
COMMAND = "/bin/bash -lc \"python3 -c \\\"open('shell-ran.txt','w').write('x')\\\"; echo RAN-OK\""
INNER = "python3 -c \"open('shell-ran.txt','w').write('x')\"; echo RAN-OK"
ASK_COMMAND = {
    "method": "item/commandExecution/requestApproval",
    "id": 0,
    "params": {
        "kind": "command",
        "threadId": THREAD,
        "turnId": TURN,
        "itemId": "call_fake_d76b",
        "startedAtMs": 1796138499450,
        "environmentId": "local",
        "command": COMMAND,
        "cwd": CWD,
        "commandActions": [{"type": "unknown", "command": INNER}],
        "proposedExecpolicyAmendment": ["python3", "-c", "open('shell-ran.txt','w').write('x')"],
        "availableDecisions": ["accept", "cancel"],
    },
}
COMMAND_DONE = {
    "method": "item/completed",
    "params": {
        "item": {
            "type": "commandExecution",
            "id": "call_fake_d76b",
            "command": COMMAND,
            "cwd": CWD,
            "processId": "40659",
            "source": "unifiedExecStartup",
            "status": "completed",
            "commandActions": [{"type": "unknown", "command": INNER}],
            "aggregatedOutput": "RAN-OK\n",
            "exitCode": 0,
            "durationMs": 0,
        },
        "threadId": THREAD,
        "turnId": TURN,
    },
}
PATCH_STARTED = {
    "method": "item/started",
    "params": {
        "item": {
            "type": "fileChange",
            "id": "call_fake_132f",
            "changes": [
                {"path": f"{CWD}/NOTES.md", "kind": {"type": "add"}, "diff": "edited by the agent\n"}
            ],
            "status": "inProgress",
        },
        "threadId": THREAD,
        "turnId": TURN,
    },
}
ASK_PATCH = {
    "method": "item/fileChange/requestApproval",
    "id": 1,
    "params": {
        "threadId": THREAD,
        "turnId": TURN,
        "itemId": "call_fake_132f",
        "reason": None,
        "grantRoot": None,
    },
}
ASK_MCP = {
    "method": "mcpServer/elicitation/request",
    "id": 2,
    "params": {
        "threadId": THREAD,
        "turnId": TURN,
        "serverName": "echo",
        "mode": "form",
        "_meta": {
            "codex_approval_kind": "mcp_tool_call",
            "persist": ["session", "always"],
            "tool_name": "echo",
            "tool_params": {"text": "hello"},
        },
        "message": 'Allow the echo MCP server to run tool "echo"?',
        "requestedSchema": {"type": "object", "properties": {}},
    },
}
REPLY = {
    "method": "item/completed",
    "params": {
        "item": {"type": "agentMessage", "id": "msg_fake_5bb7", "text": "Saw: RAN-OK", "phase": None},
        "threadId": THREAD,
        "turnId": TURN,
    },
}


def usage_line(turn: str, inp: int, out: int) -> dict[str, Any]:
    total = {
        "totalTokens": inp + out,
        "inputTokens": inp,
        "cachedInputTokens": 3,
        "cacheWriteInputTokens": 0,
        "outputTokens": out,
        "reasoningOutputTokens": 2,
    }
    usage = {"total": total, "last": total, "modelContextWindow": 258400}
    return {
        "method": "thread/tokenUsage/updated",
        "params": {"threadId": THREAD, "turnId": turn, "tokenUsage": usage},
    }


def turn_completed(status: str = "completed", error: str | None = None) -> dict[str, Any]:
    turn = {"id": TURN, "items": [], "status": status, "error": {"message": error} if error else None}
    return {"method": "turn/completed", "params": {"threadId": THREAD, "turn": turn}}


def sent(outputs: Sequence[DuplexOutput]) -> list[Mapping[str, Any]]:
    return [o.message for o in outputs if isinstance(o, Send)]


def started(resume: str | None = None) -> CodexAppServerDriver:
    driver = CodexAppServerDriver(
        prompt="[[fake:shell]] Run it.", thread=PARAMS, resume=resume, model_retries=2
    )
    driver.opening()
    driver.feed(INIT_OK)
    driver.feed(THREAD_OK)
    driver.feed(TURN_OK)
    return driver


def test_the_session_starts_in_order_and_the_thread_id_is_the_session() -> None:
    driver = CodexAppServerDriver(prompt="Run it.", thread=PARAMS, resume=None)
    [init] = sent(driver.opening())
    assert init["method"] == "initialize" and init["params"]["clientInfo"]["name"] == "peerd"
    assert "jsonrpc" not in init  # 0.171 neither sends nor needs it
    initialized, start = sent(driver.feed(INIT_OK))
    assert initialized == {"method": "initialized"}
    assert start == {"id": 2, "method": "thread/start", "params": PARAMS}
    out = driver.feed(THREAD_OK)
    assert out[0] == SessionStarted(THREAD)
    [turn] = sent(out)
    assert turn["method"] == "turn/start"
    assert turn["params"] == {
        "threadId": THREAD,
        "input": [{"type": "text", "text": "Run it.", "text_elements": []}],
    }
    assert driver.feed(TURN_OK) == []


def test_a_resumed_run_resumes_the_thread_and_counts_only_its_own_usage() -> None:
    driver = CodexAppServerDriver(prompt="again", thread=PARAMS, resume=THREAD)
    driver.opening()
    [_, resume] = sent(driver.feed(INIT_OK))
    assert resume["method"] == "thread/resume"
    assert resume["params"] == {**PARAMS, "threadId": THREAD, "excludeTurns": True}
    driver.feed(THREAD_OK)
    assert driver.feed(usage_line("an-older-turn", 20, 10)) == []  # the thread's total, replayed
    driver.feed(TURN_OK)
    [report] = driver.feed(usage_line(TURN, 30, 15))
    assert report == UsageReported(
        Usage(input_tokens=10, output_tokens=5, cached_tokens=0, reasoning_tokens=0)
    )


def test_a_command_is_asked_with_its_exact_line_and_answered_accept() -> None:
    driver = started()
    [ask] = driver.feed(ASK_COMMAND)
    assert isinstance(ask, AskPerson)
    assert ask.ask.key == "0" and ask.ask.kind == "command" and ask.ask.tool == "exec_command"
    assert ask.ask.detail == {"command": COMMAND, "cwd": CWD}
    assert ask.ask.summary == f"run `{INNER}` in {CWD}"
    assert sent(driver.answered("0", ApprovalAnswer(True))) == [{"id": 0, "result": {"decision": "accept"}}]
    assert driver.answered("0", ApprovalAnswer(True)) == []  # answered once


def test_a_denial_tells_the_model_why_before_codex_declines() -> None:
    driver = started()
    driver.feed(ASK_COMMAND)
    steer, decline = sent(driver.answered("0", ApprovalAnswer(False, "not on this machine")))
    assert steer["method"] == "turn/steer"
    assert steer["params"]["threadId"] == THREAD and steer["params"]["expectedTurnId"] == TURN
    [text] = steer["params"]["input"]
    assert text["text"] == f"[peerd] The request to run `{INNER}` in {CWD} was denied: not on this machine"
    assert decline == {"id": 0, "result": {"decision": "decline"}}
    driver.feed(ASK_COMMAND | {"id": 5})
    assert sent(driver.answered("5", ApprovalAnswer(False))) == [{"id": 5, "result": {"decision": "decline"}}]


def test_a_patch_is_asked_with_the_changes_its_item_carried() -> None:
    driver = started()
    assert driver.feed(PATCH_STARTED) == []
    [ask] = driver.feed(ASK_PATCH)
    assert isinstance(ask, AskPerson) and ask.ask.kind == "file_change" and ask.ask.tool == "apply_patch"
    assert ask.ask.detail == {
        "changes": [{"path": f"{CWD}/NOTES.md", "kind": "add", "diff": "edited by the agent\n"}]
    }
    assert ask.ask.summary == f"change {CWD}/NOTES.md"
    assert sent(driver.answered("1", ApprovalAnswer(True))) == [{"id": 1, "result": {"decision": "accept"}}]


def test_an_mcp_tool_call_is_asked_and_answered_as_an_elicitation() -> None:
    driver = started()
    [ask] = driver.feed(ASK_MCP)
    assert isinstance(ask, AskPerson) and ask.ask.kind == "mcp_tool" and ask.ask.tool == "echo.echo"
    assert ask.ask.detail == {"server": "echo", "tool": "echo", "arguments": {"text": "hello"}}
    assert ask.ask.summary == 'call echo.echo {"text": "hello"}'
    [accept] = sent(driver.answered("2", ApprovalAnswer(True)))
    assert accept == {"id": 2, "result": {"action": "accept", "content": {}, "_meta": None}}
    driver.feed(ASK_MCP | {"id": 3})
    assert sent(driver.answered("3", ApprovalAnswer(False)))[-1]["result"]["action"] == "decline"


def test_questions_peerd_cannot_put_to_a_person_are_declined_not_left_waiting() -> None:
    driver = started()
    form = {"method": "mcpServer/elicitation/request", "id": 7, "params": {"serverName": "x", "mode": "form",
            "_meta": None, "message": "Your name?", "requestedSchema": {}}}  # fmt: skip
    notice, decline = driver.feed(form)
    assert isinstance(notice, ItemProduced) and notice.kind == "notice" and "Your name?" in notice.text
    assert isinstance(decline, Send) and decline.message["result"]["action"] == "decline"
    [error] = sent(driver.feed({"method": "item/tool/call", "id": 8, "params": {}}))
    assert error["id"] == 8 and error["error"]["code"] == -32601


def test_items_usage_and_the_end_of_the_turn() -> None:
    driver = started()
    [command] = driver.feed(COMMAND_DONE)
    assert command == ItemProduced(
        "command",
        COMMAND,
        {
            "command": COMMAND,
            "exit_code": 0,
            "output": "RAN-OK\n",
            "output_truncated": False,
            "status": "completed",
        },
    )
    [usage] = driver.feed(usage_line(TURN, 20, 10))
    assert (
        isinstance(usage, UsageReported) and usage.usage.input_tokens == 20 and usage.usage.cached_tokens == 3
    )
    assert driver.feed(REPLY) == [ItemProduced("assistant_message", "Saw: RAN-OK")]
    assert driver.feed(turn_completed()) == [EndInput()]
    assert driver.finish(exit_code=0, stderr_tail="", interrupted=False) == RunFinished(
        "completed", exit_code=0
    )


def test_a_question_codex_stopped_waiting_for_is_not_answered() -> None:
    driver = started()
    driver.feed(ASK_COMMAND)
    driver.feed({"method": "serverRequest/resolved", "params": {"threadId": THREAD, "requestId": 0}})
    assert driver.answered("0", ApprovalAnswer(True)) == []


def test_interrupt_asks_codex_to_stop_the_turn_and_ends_interrupted() -> None:
    driver = started()
    [interrupt] = sent(driver.interrupting())
    assert interrupt["method"] == "turn/interrupt" and interrupt["params"] == {
        "threadId": THREAD,
        "turnId": TURN,
    }
    assert driver.feed(turn_completed("interrupted")) == [EndInput()]
    assert driver.interrupting() == []
    assert driver.finish(exit_code=0, stderr_tail="", interrupted=True).status == "interrupted"


def test_a_failed_turn_and_a_session_that_cannot_resume_fail_with_codexs_words() -> None:
    driver = started()
    driver.feed(turn_completed("failed", "FAKE-MODEL: this request was rejected (xyz)"))
    finished = driver.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert finished.status == "failed" and finished.error == "FAKE-MODEL: this request was rejected (xyz)"
    driver = CodexAppServerDriver(prompt="again", thread=PARAMS, resume="no-such-thread")
    driver.opening()
    driver.feed(INIT_OK)
    error = {"id": 2, "error": {"code": -32600, "message": "no rollout found for thread id no-such-thread"}}
    assert driver.feed(error) == [EndInput()]
    finished = driver.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert finished.error is not None and finished.error.startswith(
        "Codex could not resume its session no-such-thread: no rollout found for thread id no-such-thread. "
    )
    assert "CODEX_HOME" in finished.error


def test_model_attempts_past_model_retries_give_up() -> None:
    driver = started()
    for n in (1, 2, 3):
        error = {"message": f"Reconnecting... {n}/3", "codexErrorInfo": {"responseStreamDisconnected": {}}}
        driver.feed({"method": "error", "params": {"error": error, "willRetry": True, "threadId": THREAD}})
    assert driver.give_up_reason is not None and "model_retries = 2" in driver.give_up_reason


def test_app_server_items_take_codex_execs_shapes() -> None:
    change = PATCH_STARTED["params"]["item"] | {"status": "completed"}  # type: ignore[operator]
    assert exec_shape(change) == {
        "type": "file_change",
        "changes": [{"path": f"{CWD}/NOTES.md", "kind": "add"}],
        "status": "completed",
    }
    mcp = {"type": "mcpToolCall", "id": "c", "server": "peerd", "tool": "task_status", "status": "inProgress",
           "arguments": {"taskId": "t"}, "result": {"content": [{"type": "text", "text": "ok"}],
           "structuredContent": None}, "error": None}  # fmt: skip
    assert exec_shape(mcp) == {
        "type": "mcp_tool_call",
        "server": "peerd",
        "tool": "task_status",
        "arguments": {"taskId": "t"},
        "result": {"content": [{"type": "text", "text": "ok"}], "structured_content": None},
        "error": None,
        "status": "in_progress",
    }
    assert exec_shape({"type": "userMessage", "id": "u", "content": []}) is None


def test_the_launch_asks_and_keeps_peerds_tools_and_token_out_of_argv(tmp_path: Path) -> None:
    confined = Confinement(cwd=tmp_path, worktree=tmp_path, worktree_writable=True)
    tool_env = {"PEERD_SOCKET": "/run/peerd.sock", "PEERD_RUN_TOKEN": "secret-token-value",
                "PEERD_MCP_URL": "http://127.0.0.1:7/mcp"}  # fmt: skip
    args = ["-c", "model_provider=mock", "--disable", "plugins", "--strict-config", "--skip-git-repo-check",
            CODEX_NO_SANDBOX, "--config=analytics.enabled=false"]  # fmt: skip
    for confinement, sandbox in ((None, "workspace-write"), (confined, "danger-full-access")):
        spec = RunSpec("t1", "r1", "go", tmp_path, "gpt-5.5", "approval-required", "default", "s-1",
                       tmp_path / "state", tool_env, confinement)  # fmt: skip
        scratch = scratch_dir(spec)
        asking = duplex_launch("codex", spec, ProviderConfig(args=args), bind_tools(spec, scratch), scratch)
        assert asking is not None
        launch, driver = asking
        assert launch.argv[:2] == ["codex", "app-server"] and launch.stdin is None
        assert CODEX_NO_SANDBOX not in launch.argv and "--skip-git-repo-check" not in launch.argv
        kept = [
            "-c",
            "model_provider=mock",
            "--disable",
            "plugins",
            "--strict-config",
            "--config=analytics.enabled=false",
        ]
        assert launch.argv[4:] == kept
        assert not any("secret-token-value" in arg for arg in launch.argv)
        assert launch.env == {TOKEN_ENV: "secret-token-value"}
        server = tomllib.loads("v = " + launch.argv[3].partition("=")[2])["v"]
        assert launch.argv[3].startswith("mcp_servers.peerd=")
        assert server["default_tools_approval_mode"] == "approve" and server["required"] is True
        assert server["bearer_token_env_var"] == TOKEN_ENV
        assert any("--skip-git-repo-check" in n and CODEX_NO_SANDBOX in n for n in launch.notices)
        assert isinstance(driver, CodexAppServerDriver)
        driver.opening()
        [_, resume] = sent(driver.feed(INIT_OK))
        assert resume["params"] == {"cwd": str(tmp_path), "approvalPolicy": "untrusted", "sandbox": sandbox,
                                    "model": "gpt-5.5", "threadId": "s-1", "excludeTurns": True}  # fmt: skip


def test_app_server_args_keep_only_what_app_server_takes() -> None:
    assert app_server_args(["-c", "a=1", "-m", "x", "--enable", "f", "--oss", "--disable"]) == (
        ["-c", "a=1", "--enable", "f"],
        ["-m", "x", "--oss", "--disable"],
    )
