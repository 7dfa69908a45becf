"""Claude Code's stdio permission protocol, the pure driver: real line shapes of claude-code 2.1.332
(recorded against the fake model, long fields trimmed), no process."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from peerd.config import ProviderConfig
from peerd.providers.claude_asks import OnDisk, worktree_reader
from peerd.providers.claude_stdio import ClaudeStdioDriver, duplex_launch
from peerd.providers.cli import bind_tools, scratch_dir
from peerd.providers.duplex import AskPerson, EndInput, Send
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk
from peerd.runtime.provider import ItemProduced, RunFinished, RunSpec, SessionStarted, UsageReported

CWD = "/tmp/h11/work"
SESSION = "b38317b6-bbf3-483e-8efe-9b91cd11351c"

INIT = {"type": "system", "subtype": "init", "cwd": CWD, "session_id": SESSION, "permissionMode": "default"}
BASH_USE = {
    "type": "assistant",
    "message": {
        "id": "msg_fake_c9b6",
        "type": "message",
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_fake_86ce",
                "name": "Bash",
                "input": {"command": "echo hi > ran.txt; echo done", "description": "make a file"},
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 1},
    },
    "parent_tool_use_id": None,
    "session_id": SESSION,
}
BASH_ASK = {
    "type": "control_request",
    "request_id": "777e22d6-798f-44d4-a84c-032565738d38",
    "request": {
        "subtype": "can_use_tool",
        "tool_name": "Bash",
        "display_name": "Bash",
        "input": {"command": "echo hi > ran.txt; echo done", "description": "make a file"},
        "description": "make a file",
        "permission_suggestions": [
            {
                "type": "addRules",
                "rules": [{"toolName": "Bash", "ruleContent": "echo hi *"}],
                "behavior": "allow",
                "destination": "localSettings",
            }
        ],
        "blocked_path": f"{CWD}/ran.txt",
        "tool_use_id": "toolu_fake_86ce",
    },
}
BASH_DENIED = {
    "type": "user",
    "message": {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "content": "not today",
                "is_error": True,
                "tool_use_id": "toolu_fake_86ce",
            }
        ],
    },
    "parent_tool_use_id": None,
    "session_id": SESSION,
    "tool_use_result": "Error: not today",
}
WRITE_ASK = {
    "type": "control_request",
    "request_id": "e0ed3c6c-e3d3-47a3-a1bc-c97499c88cd1",
    "request": {
        "subtype": "can_use_tool",
        "tool_name": "Write",
        "display_name": "Write",
        "input": {"file_path": f"{CWD}/existing.txt", "content": "one\nTHREE\n"},
        "description": "existing.txt",
        "permission_suggestions": [{"type": "setMode", "mode": "acceptEdits", "destination": "session"}],
        "tool_use_id": "toolu_fake_97dc",
    },
}
EDIT_ASK = {
    "type": "control_request",
    "request_id": "d2e2bde1-8ccf-4872-84b6-b96b1b4482d6",
    "request": {
        "subtype": "can_use_tool",
        "tool_name": "Edit",
        "display_name": "Edit",
        "input": {
            "file_path": f"{CWD}/existing.txt",
            "old_string": "one",
            "new_string": "uno",
            "replace_all": False,
        },
        "description": "existing.txt",
        "tool_use_id": "toolu_fake_2913",
    },
}
CANCEL = {"type": "control_cancel_request", "request_id": "777e22d6-798f-44d4-a84c-032565738d38"}
INTERRUPT_ACK = {
    "type": "control_response",
    "response": {"subtype": "success", "request_id": "peerd-interrupt-1", "response": {"still_queued": []}},
}


def result(**extra: Any) -> dict[str, Any]:
    line = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "FINAL done",
        "session_id": SESSION,
        "total_cost_usd": 0.0005,
        "duration_ms": 460,
        "usage": {"input_tokens": 40, "cache_read_input_tokens": 12, "output_tokens": 20},
        "permission_denials": [],
        "num_turns": 2,
    }
    line.update(extra)
    return line


def disk(files: dict[str, str]) -> Any:
    def read(path: str) -> OnDisk:
        return OnDisk("file", files[path]) if path in files else OnDisk("missing")

    return read


def driver(files: dict[str, str] | None = None) -> ClaudeStdioDriver:
    return ClaudeStdioDriver("[[fake:s]] do it", CWD, disk(files or {}))


def asked(outputs: Any) -> ApprovalAsk:
    (out,) = outputs
    assert isinstance(out, AskPerson)
    return out.ask


def sent(outputs: Any) -> dict[str, Any]:
    (out,) = outputs
    assert isinstance(out, Send)
    return dict(out.message)


def test_the_prompt_is_the_first_user_message() -> None:
    assert sent(driver().opening()) == {
        "type": "user",
        "session_id": "",
        "message": {"role": "user", "content": [{"type": "text", "text": "[[fake:s]] do it"}]},
        "parent_tool_use_id": None,
    }


def test_a_command_is_asked_with_its_command_line_and_cwd_not_the_models_description() -> None:
    ask = asked(driver().feed(BASH_ASK))
    assert ask.key == BASH_ASK["request_id"]
    assert (ask.kind, ask.tool) == ("command", "Bash")
    assert ask.detail == {"command": "echo hi > ran.txt; echo done", "cwd": CWD}
    assert ask.summary == f"run `echo hi > ran.txt; echo done` in {CWD}"
    assert "make a file" not in ask.summary


def test_allow_answers_with_the_exact_input_that_was_asked() -> None:
    d = driver()
    d.feed(BASH_ASK)
    assert sent(d.answered(BASH_ASK["request_id"], ApprovalAnswer(True))) == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": BASH_ASK["request_id"],
            "response": {"behavior": "allow", "updatedInput": BASH_ASK["request"]["input"]},
        },
    }


def test_deny_answers_with_the_message_the_model_reads() -> None:
    d = driver()
    d.feed(BASH_ASK)
    response = sent(d.answered(BASH_ASK["request_id"], ApprovalAnswer(False, "not today")))["response"]
    assert response["response"] == {"behavior": "deny", "message": "not today"}
    empty = driver()
    empty.feed(BASH_ASK)
    response = sent(empty.answered(BASH_ASK["request_id"], ApprovalAnswer(False, "  ")))["response"]
    assert response["response"]["behavior"] == "deny" and response["response"]["message"].strip()


def test_a_question_is_answered_once_and_a_repeated_request_is_not_asked_twice() -> None:
    d = driver()
    assert d.feed(BASH_ASK)
    assert d.feed(BASH_ASK) == []
    assert d.answered(BASH_ASK["request_id"], ApprovalAnswer(True))
    assert d.answered(BASH_ASK["request_id"], ApprovalAnswer(True)) == []
    assert d.answered("unknown", ApprovalAnswer(True)) == []


def test_a_write_is_diffed_against_the_file_on_disk() -> None:
    ask = asked(driver({f"{CWD}/existing.txt": "one\ntwo\n"}).feed(WRITE_ASK))
    assert (ask.kind, ask.tool, ask.summary) == ("file_change", "Write", "change existing.txt")
    (change,) = ask.detail["changes"]
    assert change["path"] == f"{CWD}/existing.txt" and change["kind"] == "update"
    assert change["diff"].splitlines() == [
        "--- a/existing.txt",
        "+++ b/existing.txt",
        "@@ -1,2 +1,2 @@",
        " one",
        "-two",
        "+THREE",
    ]


def test_a_write_of_a_new_file_is_an_add_with_all_its_lines() -> None:
    (change,) = asked(driver().feed(WRITE_ASK)).detail["changes"]
    assert change["kind"] == "add"
    assert change["diff"].splitlines()[2:] == ["@@ -0,0 +1,2 @@", "+one", "+THREE"]


def test_an_edit_is_applied_to_the_file_for_its_diff() -> None:
    (change,) = asked(driver({f"{CWD}/existing.txt": "one\ntwo\n"}).feed(EDIT_ASK)).detail["changes"]
    assert change["kind"] == "update"
    assert change["diff"].splitlines()[2:] == ["@@ -1,2 +1,2 @@", "-one", "+uno", " two"]


def test_an_edit_of_a_file_not_shown_diffs_its_strings() -> None:
    (change,) = asked(driver().feed(EDIT_ASK)).detail["changes"]
    assert change["diff"].splitlines()[2:] == ["@@ -1 +1 @@", "-one", "+uno"]


def test_multiedit_applies_each_edit_in_order() -> None:
    request = {
        "subtype": "can_use_tool",
        "tool_name": "MultiEdit",
        "input": {
            "file_path": f"{CWD}/a.py",
            "edits": [
                {"old_string": "x", "new_string": "y", "replace_all": True},
                {"old_string": "y = 1", "new_string": "z = 1"},
            ],
        },
        "tool_use_id": "toolu_m",
    }
    ask = asked(
        driver({f"{CWD}/a.py": "x = 1\nx = 2\n"}).feed(
            {"type": "control_request", "request_id": "r", "request": request}
        )
    )
    assert ask.detail["changes"][0]["diff"].splitlines()[2:] == [
        "@@ -1,2 +1,2 @@",
        "-x = 1",
        "-x = 2",
        "+z = 1",
        "+y = 2",
    ]


def test_other_mcp_tools_and_other_tools_are_asked_with_their_exact_input() -> None:
    mcp = {"subtype": "can_use_tool", "tool_name": "mcp__github__create_issue", "input": {"title": "t"}}
    ask = asked(driver().feed({"type": "control_request", "request_id": "r1", "request": mcp}))
    assert (ask.kind, ask.detail) == (
        "mcp_tool",
        {"server": "github", "tool": "create_issue", "arguments": {"title": "t"}},
    )
    assert ask.summary == 'call github.create_issue with {"title": "t"}'
    web = {"subtype": "can_use_tool", "tool_name": "WebFetch", "input": {"url": "https://x.test/\x1b[2J"}}
    ask = asked(driver().feed({"type": "control_request", "request_id": "r2", "request": web}))
    assert (ask.kind, ask.detail) == ("tool", {"input": {"url": "https://x.test/\x1b[2J"}})
    assert "\x1b" not in ask.summary and ask.summary.startswith("use WebFetch with ")


def test_other_control_requests_get_an_error_instead_of_a_wait() -> None:
    message = sent(
        driver().feed(
            {"type": "control_request", "request_id": "h1", "request": {"subtype": "hook_callback"}}
        )
    )
    assert message["response"]["subtype"] == "error" and message["response"]["request_id"] == "h1"


def test_the_stream_is_parsed_as_on_the_headless_path_and_stdin_ends_at_the_result() -> None:
    d = driver()
    assert d.feed(INIT) == [SessionStarted(SESSION)]
    assert [type(o) for o in d.feed(BASH_USE)] == [UsageReported]
    d.feed(BASH_ASK)
    d.answered(BASH_ASK["request_id"], ApprovalAnswer(True))
    done = {**BASH_DENIED}
    done["message"] = {
        "role": "user",
        "content": [{"type": "tool_result", "content": "done", "tool_use_id": "toolu_fake_86ce"}],
    }
    (item,) = d.feed(done)
    assert isinstance(item, ItemProduced) and item.kind == "command" and item.data["output"] == "done"
    outputs = d.feed(result())
    assert ItemProduced("assistant_message", "FINAL done") in outputs
    assert isinstance(outputs[-1], EndInput)
    assert not any(isinstance(o, EndInput) for o in d.feed(result()))  # stdin is closed once
    assert d.finish(exit_code=0, stderr_tail="", interrupted=False) == RunFinished("completed", exit_code=0)


def test_a_denied_call_is_reported_with_who_denied_it_and_why() -> None:
    d = driver()
    d.feed(BASH_ASK)
    d.answered(BASH_ASK["request_id"], ApprovalAnswer(False, "not today"))
    (item,) = [o for o in [*d.feed(BASH_USE), *d.feed(BASH_DENIED)] if isinstance(o, ItemProduced)]
    assert item.data["status"] == "failed" and "not today" in item.text
    denials = [
        {"tool_name": "Bash", "tool_use_id": "toolu_fake_86ce", "tool_input": {}},
        {"tool_name": "Write", "tool_use_id": "other"},
    ]
    d.feed(result(permission_denials=denials))
    finished = d.finish(exit_code=0, stderr_tail="", interrupted=False)
    assert finished.status == "failed"
    assert finished.error == (
        "2 of Claude Code's tool call(s) were denied: Bash (not today), Write (by Claude Code's settings). "
        "The reply may be incomplete."
    )


def test_interrupt_uses_the_protocol_and_a_cancelled_question_is_not_answered() -> None:
    d = driver()
    d.feed(BASH_ASK)
    message = sent(d.interrupting())
    assert message == {
        "type": "control_request",
        "request_id": "peerd-interrupt-1",
        "request": {"subtype": "interrupt"},
    }
    assert d.feed(CANCEL) == [] and d.feed(INTERRUPT_ACK) == []
    assert d.answered(BASH_ASK["request_id"], ApprovalAnswer(True)) == []
    errors = ["[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=tool_use"]
    assert isinstance(
        d.feed(result(subtype="error_during_execution", is_error=True, errors=errors))[-1], EndInput
    )
    assert d.interrupting() == []  # the turn is over: nothing to interrupt on stdin
    assert d.finish(exit_code=1, stderr_tail="", interrupted=True).status == "interrupted"


def test_the_worktree_reader_reads_only_regular_files_inside_the_worktree(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("inside\n")
    (root / "sub" / "b.txt").write_text("nested\n")
    (root / "..dots").write_text("dots\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    (tmp_path / "away").mkdir()
    (tmp_path / "away" / "c.txt").write_text("away\n")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    (root / "linkdir").symlink_to(tmp_path / "away")
    (root / "big.txt").write_text("x" * 100)
    (root / "bin.dat").write_bytes(b"\xff\xfe\x00")
    os.mkfifo(root / "fifo")  # opening it for reading would block
    read = worktree_reader(root, limit=50)
    assert read(str(root / "a.txt")) == OnDisk("file", "inside\n")
    assert read("a.txt") == OnDisk("file", "inside\n")
    assert read(str(root / "sub" / "b.txt")) == OnDisk("file", "nested\n")
    assert read(str(root / "sub" / ".." / "a.txt")) == OnDisk("file", "inside\n")
    assert read(str(root / "..dots")) == OnDisk("file", "dots\n")
    assert read(str(root / "new.txt")) == OnDisk("missing")
    assert read(str(root / "newdir" / "new.txt")) == OnDisk("missing")
    hidden = [
        tmp_path / "secret.txt",
        root / ".." / "secret.txt",
        tmp_path / "nope",
        root / "link.txt",
        root / "linkdir" / "c.txt",
        root / "big.txt",
        root / "bin.dat",
        root / "fifo",
        root / "sub",
        root,
    ]
    for path in hidden:
        assert read(str(path)) == OnDisk("hidden"), path


def test_a_write_outside_the_worktree_does_not_show_or_tell_what_is_there(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("the secret\n")
    d = ClaudeStdioDriver("p", str(root), worktree_reader(root))
    request = {
        "subtype": "can_use_tool",
        "tool_name": "Write",
        "input": {"file_path": str(tmp_path / "secret.txt"), "content": "new\n"},
    }
    (change,) = asked(d.feed({"type": "control_request", "request_id": "r", "request": request})).detail[
        "changes"
    ]
    assert "the secret" not in change["diff"] and "+new" in change["diff"] and change["kind"] == "update"
    assert "not shown" in change["diff"]


def test_the_asking_launch_attaches_peerds_tools_as_the_headless_one(tmp_path: Path) -> None:
    token = "secret-token-value"
    tool_env = {
        "PEERD_RUN_TOKEN": token,
        "PEERD_SOCKET": str(tmp_path / "s"),
        "PEERD_MCP_URL": "http://127.0.0.1:9/mcp",
    }
    spec = RunSpec(
        "t1",
        "r1",
        "the task",
        tmp_path,
        None,
        "approval-required",
        "default",
        None,
        tmp_path / "state",
        tool_env,
    )
    scratch = scratch_dir(spec)
    config = ProviderConfig(model="claude-sonnet-5", model_retries=2, args=["--max-turns", "9"])
    launch, _ = duplex_launch("claude", spec, config, bind_tools(spec, scratch), scratch)
    argv = launch.argv
    assert argv[:7] == [
        "claude",
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    assert argv[argv.index("--permission-mode") + 1] == "default"
    assert argv[argv.index("--permission-prompt-tool") + 1] == "stdio"
    assert argv[argv.index("--model") + 1] == "claude-sonnet-5"
    assert argv[argv.index("--allowedTools") + 1] == "mcp__peerd__*" and "--strict-mcp-config" in argv
    assert "--session-id" in argv and argv[-2:] == ["--max-turns", "9"]
    assert launch.stdin is None and launch.env == {
        "CLAUDE_CODE_MAX_RETRIES": "2",
        "CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR": "1",
    }
    assert all(token not in arg for arg in argv)
    path = Path(argv[argv.index("--mcp-config") + 1])
    assert path.stat().st_mode & 0o077 == 0
    assert json.loads(path.read_text())["mcpServers"]["peerd"]["headers"] == {
        "Authorization": f"Bearer {token}"
    }
    resumed = dataclasses.replace(spec, resume_session="sess-1")
    launch, _ = duplex_launch("claude", resumed, ProviderConfig(), None, scratch)
    assert launch.argv[launch.argv.index("--resume") + 1] == "sess-1" and "--session-id" not in launch.argv
    assert "--mcp-config" not in launch.argv


def test_a_read_outside_the_worktree_is_asked_as_a_tool_with_its_input() -> None:
    """Recorded: `Read /etc/hostname` (outside the working directory) is asked; inside it is not."""
    request = {
        "subtype": "can_use_tool",
        "tool_name": "Read",
        "display_name": "Read",
        "input": {"file_path": "/etc/hostname"},
        "description": "/etc/hostname",
        "permission_suggestions": [
            {
                "type": "addRules",
                "rules": [{"toolName": "Read", "ruleContent": "//etc/**"}],
                "behavior": "allow",
            }
        ],
        "tool_use_id": "toolu_fake_fff2",
    }
    ask = asked(driver().feed({"type": "control_request", "request_id": "r9", "request": request}))
    assert (ask.kind, ask.tool, ask.detail) == ("tool", "Read", {"input": {"file_path": "/etc/hostname"}})
    assert ask.summary == 'use Read with {"file_path": "/etc/hostname"}'
