"""The coder-CLI stream parsers: JSON lines of Codex, Claude Code and Gemini -> provider events.

Lines marked "observed" are copied from real runs (docs/research real-cli-harness.md §6); the others
are built from the CLIs' types as described in coder-clis.md §2.5, §3.5, §4.5 and §6.
"""

# Recorded JSON lines are kept verbatim, one per line, so they can be compared with real output.
# ruff: noqa: E501

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from peerd.providers.claude_events import ClaudeEvents
from peerd.providers.codex_events import CodexEvents
from peerd.providers.gemini_events import GeminiEvents
from peerd.providers.stream_common import tail_of_stderr
from peerd.runtime.provider import ItemProduced, RunFinished, SessionStarted, UsageReported

Parser = CodexEvents | ClaudeEvents | GeminiEvents
Event = SessionStarted | ItemProduced


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.strip().splitlines()]


def feed_all(parser: Parser, stream: Iterable[Mapping[str, Any]]) -> list[Event]:
    """The sessions and items (usage has its own tests: tests/unit/test_usage.py)."""
    return [event for line in stream for event in parser.feed(line) if not isinstance(event, UsageReported)]


def kinds(events: Iterable[Event]) -> list[str]:
    return [e.kind if isinstance(e, ItemProduced) else "session" for e in events]


# --- streams --------------------------------------------------------------------------------------

CODEX_OBSERVED = lines("""
{"type":"thread.started","thread_id":"01a22906-889e-73c3-8ea8-24535c927c29"}
{"type":"turn.started"}
{"type":"item.started","item":{"id":"item_0","type":"mcp_tool_call","server":"echo","tool":"echo","arguments":{"text":"hello from the fake model"},"result":null,"error":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_0","type":"mcp_tool_call","server":"echo","tool":"echo","arguments":{"text":"hello from the fake model"},"result":{"content":[{"type":"text","text":"echo: hello from the fake model"}],"structured_content":{"result":"echo: hello from the fake model"}},"error":null,"status":"completed"}}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"FAKE-MODEL-FINAL: the tool said <Wall time: 0.0049 seconds\\nOutput:\\n{\\"result\\":\\"echo: hello from the fake model\\"}>"}}
{"type":"turn.completed","usage":{"input_tokens":20,"cached_input_tokens":0,"cache_write_input_tokens":0,"output_tokens":10,"reasoning_output_tokens":0}}
""")  # observed

CODEX_OK = lines("""
{"type":"thread.started","thread_id":"th-1"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for `fake-model` not found, using defaults"}}
{"type":"item.completed","item":{"id":"item_1","type":"reasoning","text":"thinking about tests"}}
{"type":"item.started","item":{"id":"item_3","type":"command_execution","command":"bash -lc 'pytest -q'","aggregated_output":"","exit_code":null,"status":"in_progress"}}
{"type":"item.updated","item":{"id":"item_3","type":"command_execution","command":"bash -lc 'pytest -q'","aggregated_output":"3 pa","exit_code":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_3","type":"command_execution","command":"bash -lc 'pytest -q'","aggregated_output":"3 passed\\n","exit_code":0,"status":"completed"}}
{"type":"item.completed","item":{"id":"item_4","type":"file_change","changes":[{"path":"/wt/src/app.py","kind":"update"},{"path":"/wt/new.py","kind":"add"}],"status":"completed"}}
{"type":"error","message":"Reconnecting... 1/5 (stream disconnected before completion)"}
{"type":"item.started","item":{"id":"item_5","type":"todo_list","items":[{"text":"fix bug","completed":false}]}}
{"type":"item.completed","item":{"id":"item_5","type":"todo_list","items":[{"text":"fix bug","completed":true},{"text":"test","completed":false}]}}
{"type":"item.completed","item":{"id":"item_6","type":"web_search","query":"pytest docs"}}
{"type":"item.completed","item":{"id":"item_7","type":"agent_message","text":"Tests pass."}}
{"type":"item.completed","item":{"id":"item_8","type":"agent_message","text":"FINAL fixed the bug"}}
{"type":"turn.completed","usage":{"input_tokens":20,"cached_input_tokens":0,"output_tokens":10}}
""")

CODEX_OK_EVENTS: list[Event] = [
    SessionStarted("th-1"),
    ItemProduced("notice", "Model metadata for `fake-model` not found, using defaults"),
    ItemProduced(
        "command",
        "bash -lc 'pytest -q'",
        {
            "command": "bash -lc 'pytest -q'",
            "exit_code": 0,
            "output": "3 passed\n",
            "output_truncated": False,
            "status": "completed",
        },
    ),
    ItemProduced(
        "file_change",
        "/wt/src/app.py, /wt/new.py",
        {
            "changes": [{"path": "/wt/src/app.py", "kind": "update"}, {"path": "/wt/new.py", "kind": "add"}],
            "status": "completed",
        },
    ),
    ItemProduced(
        "tool_call",
        "todo list: 1/2 done",
        {
            "tool": "todo_list",
            "items": [{"text": "fix bug", "completed": True}, {"text": "test", "completed": False}],
        },
    ),
    ItemProduced("tool_call", "web_search: pytest docs", {"tool": "web_search", "query": "pytest docs"}),
    ItemProduced("assistant_message", "Tests pass."),
    ItemProduced("assistant_message", "FINAL fixed the bug"),
]

CLAUDE_OBSERVED: list[dict[str, Any]] = [  # observed, long fields trimmed as in the research notes
    {
        "type": "system",
        "subtype": "init",
        "session_id": "772d0e12-aa",
        "tools": ["Task", "Bash", "mcp__echo__echo"],
        "mcp_servers": [{"name": "echo", "status": "connected", "source": "dynamic"}],
        "model": "claude-opus-5-5",
        "permissionMode": "default",
        "claude_code_version": "2.1.332",
    },
    {
        "type": "assistant",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "mcp__echo__echo", "input": {"text": "hello"}}
            ],
            "stop_reason": None,
        },
        "parent_tool_use_id": None,
        "session_id": "772d0e12-aa",
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {"tool_use_id": "toolu_2", "type": "tool_result", "content": '{"result":"echo: hello"}'}
            ],
        },
        "parent_tool_use_id": None,
        "tool_use_result": {"structuredContent": {"result": "echo: hello"}},
        "session_id": "772d0e12-aa",
    },
    {
        "type": "assistant",
        "message": {"id": "msg_3", "content": [{"type": "text", "text": "FINAL echo said hello"}]},
        "parent_tool_use_id": None,
        "session_id": "772d0e12-aa",
    },
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 2,
        "result": "FINAL echo said hello",
        "stop_reason": "end_turn",
        "terminal_reason": "completed",
        "total_cost_usd": 0.00028,
        "permission_denials": [],
        "session_id": "772d0e12-aa",
    },
]


def claude_assistant(*blocks: dict[str, Any], parent: str | None = None, **extra: Any) -> dict[str, Any]:
    message = {"id": "msg_x", "role": "assistant", "content": list(blocks)}
    return {
        "type": "assistant",
        "message": message,
        "parent_tool_use_id": parent,
        "session_id": "s1",
        **extra,
    }


def claude_result(
    tool_use_id: str, content: Any, *, is_error: bool = False, parent: str | None = None
) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error}
    return {"type": "user", "message": {"role": "user", "content": [block]}, "parent_tool_use_id": parent}


def tool_use(tool_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


CLAUDE_INIT = {"type": "system", "subtype": "init", "session_id": "s1", "permissionMode": "acceptEdits"}
CLAUDE_SUCCESS = {"type": "result", "subtype": "success", "is_error": False, "permission_denials": []}

CLAUDE_OK: list[dict[str, Any]] = [
    CLAUDE_INIT,
    claude_assistant(text("Let me run the tests.")),
    claude_assistant(tool_use("t1", "Bash", command="pytest -q")),
    claude_result("t1", "3 passed"),
    claude_assistant(tool_use("t2", "Edit", file_path="/w/a.py", old_string="x", new_string="y")),
    claude_result("t2", [{"type": "text", "text": "The file /w/a.py has been updated."}]),
    claude_assistant(tool_use("t3", "mcp__peerd__delegate_task", title="review")),
    claude_result("t3", [{"type": "text", "text": '{"task_id":"T1"}'}]),
    {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 529, "error": "overloaded"},
    claude_assistant(tool_use("t4", "Read", file_path="/w/b.py")),
    claude_assistant(tool_use("sub1", "Bash", command="ls"), parent="t5"),  # a sub-agent's work
    claude_result("sub1", "a.py", parent="t5"),
    claude_result("t4", "print(1)"),
    claude_assistant(text("FINAL all green")),
    CLAUDE_SUCCESS | {"result": "FINAL all green"},
]

CLAUDE_OK_EVENTS: list[Event] = [
    SessionStarted("s1"),
    ItemProduced("assistant_message", "Let me run the tests."),
    ItemProduced(
        "command",
        "pytest -q",
        {
            "command": "pytest -q",
            "exit_code": None,
            "output": "3 passed",
            "output_truncated": False,
            "status": "completed",
            "error": None,
        },
    ),
    ItemProduced(
        "file_change",
        "/w/a.py",
        {
            "tool": "Edit",
            "changes": [{"path": "/w/a.py", "kind": "edit"}],
            "status": "completed",
            "error": None,
        },
    ),
    ItemProduced(
        "tool_call",
        "peerd.delegate_task",
        {
            "server": "peerd",
            "tool": "delegate_task",
            "arguments": {"title": "review"},
            "result": '{"task_id":"T1"}',
            "error": None,
            "status": "completed",
        },
    ),
    ItemProduced(
        "tool_call",
        "Read",
        {
            "server": None,
            "tool": "Read",
            "arguments": {"file_path": "/w/b.py"},
            "result": "print(1)",
            "error": None,
            "status": "completed",
        },
    ),
    ItemProduced("assistant_message", "FINAL all green"),
]

GEMINI_OBSERVED = lines("""
{"type":"init","timestamp":"2026-11-29T20:37:07.891Z","session_id":"526be870-bf0c-4e26-88ab-d8ef2d4d4853","model":"gemini-2.5-flash"}
{"type":"message","role":"user","content":"Call the echo tool with text 'hello', then report what it returned."}
{"type":"tool_use","tool_name":"mcp_echo_echo","tool_id":"mcp_echo_echo__mcp_echo_echo_1795984627934_0","parameters":{"text":"hello from the fake model"}}
{"type":"tool_result","tool_id":"mcp_echo_echo__mcp_echo_echo_1795984627934_0","status":"success","output":"echo: hello from the fake model"}
{"type":"message","role":"assistant","content":"FAKE-MODEL-FINAL: the tool said <<untrusted_context>\\necho: hello from the fake model\\n</untrusted_context>>","delta":true}
{"type":"result","status":"success","stats":{"total_tokens":30,"input_tokens":20,"output_tokens":10,"duration_ms":138,"tool_calls":1}}
""")  # observed

GEMINI_OK = lines("""
{"type":"init","timestamp":"t","session_id":"g-1","model":"gemini-2.5-flash"}
{"type":"message","timestamp":"t","role":"user","content":"fix it"}
{"type":"message","timestamp":"t","role":"assistant","content":"I will ","delta":true}
{"type":"message","timestamp":"t","role":"assistant","content":"run the tests.","delta":true}
{"type":"tool_use","timestamp":"t","tool_name":"run_shell_command","tool_id":"sh_1","parameters":{"command":"pytest -q"}}
{"type":"tool_result","timestamp":"t","tool_id":"sh_1","status":"success","output":"3 passed"}
{"type":"tool_use","timestamp":"t","tool_name":"replace","tool_id":"ed_1","parameters":{"file_path":"/w/a.py","old_string":"x","new_string":"y"}}
{"type":"tool_result","timestamp":"t","tool_id":"ed_1","status":"success"}
{"type":"tool_use","timestamp":"t","tool_name":"mcp_peerd_delegate_task","tool_id":"mcp_1","parameters":{"title":"review"}}
{"type":"tool_result","timestamp":"t","tool_id":"mcp_1","status":"success","output":"T1"}
{"type":"error","timestamp":"t","severity":"warning","message":"Loop detected, stopping execution"}
{"type":"message","timestamp":"t","role":"assistant","content":"FINAL ","delta":true}
{"type":"message","timestamp":"t","role":"assistant","content":"all green","delta":true}
{"type":"result","timestamp":"t","status":"success","stats":{"total_tokens":30,"tool_calls":3}}
""")

GEMINI_OK_EVENTS: list[Event] = [
    SessionStarted("g-1"),
    ItemProduced("assistant_message", "I will run the tests."),
    ItemProduced(
        "command",
        "pytest -q",
        {
            "command": "pytest -q",
            "exit_code": None,
            "output": "3 passed",
            "output_truncated": False,
            "status": "completed",
            "error": None,
        },
    ),
    ItemProduced(
        "file_change",
        "/w/a.py",
        {
            "tool": "replace",
            "changes": [{"path": "/w/a.py", "kind": "edit"}],
            "status": "completed",
            "error": None,
        },
    ),
    ItemProduced(
        "tool_call",
        "peerd.delegate_task",
        {
            "server": "peerd",
            "tool": "delegate_task",
            "arguments": {"title": "review"},
            "result": "T1",
            "error": None,
            "status": "completed",
        },
    ),
    ItemProduced("notice", "Loop detected, stopping execution", {"severity": "warning"}),
    ItemProduced("assistant_message", "FINAL all green"),
]


# --- ok streams -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "stream", "expected", "reply"),
    [
        (CodexEvents, CODEX_OK, CODEX_OK_EVENTS, "FINAL fixed the bug"),
        (ClaudeEvents, CLAUDE_OK, CLAUDE_OK_EVENTS, "FINAL all green"),
        (GeminiEvents, GEMINI_OK, GEMINI_OK_EVENTS, "FINAL all green"),
    ],
    ids=["codex", "claude", "gemini"],
)
def test_an_ok_stream_maps_every_item_kind_and_completes(
    make: Callable[[], Parser], stream: list[dict[str, Any]], expected: list[Event], reply: str
) -> None:
    parser = make()
    assert feed_all(parser, stream) == expected
    assert parser.reply == reply
    assert parser.finish(exit_code=0, stderr_tail="", interrupted=False) == RunFinished(
        "completed", exit_code=0
    )


@pytest.mark.parametrize(
    ("make", "stream", "session", "expected_kinds", "reply"),
    [
        (
            CodexEvents,
            CODEX_OBSERVED,
            "01a22906-889e-73c3-8ea8-24535c927c29",
            ["session", "tool_call", "assistant_message"],
            'FAKE-MODEL-FINAL: the tool said <Wall time: 0.0049 seconds\nOutput:\n{"result":"echo: hello from the fake model"}>',
        ),
        (
            ClaudeEvents,
            CLAUDE_OBSERVED,
            "772d0e12-aa",
            ["session", "tool_call", "assistant_message"],
            "FINAL echo said hello",
        ),
        (
            GeminiEvents,
            GEMINI_OBSERVED,
            "526be870-bf0c-4e26-88ab-d8ef2d4d4853",
            ["session", "tool_call", "assistant_message"],
            "FAKE-MODEL-FINAL: the tool said <<untrusted_context>\necho: hello from the fake model\n</untrusted_context>>",
        ),
    ],
    ids=["codex", "claude", "gemini"],
)
def test_observed_streams(
    make: Callable[[], Parser],
    stream: list[dict[str, Any]],
    session: str,
    expected_kinds: list[str],
    reply: str,
) -> None:
    parser = make()
    events = feed_all(parser, stream)
    assert kinds(events) == expected_kinds
    assert events[0] == SessionStarted(session)
    tool = events[1]
    assert isinstance(tool, ItemProduced) and tool.text == "echo.echo"
    assert "echo: hello" in str(tool.data["result"]) and tool.data["status"] == "completed"
    assert events[-1] == ItemProduced("assistant_message", reply)
    assert parser.reply == reply
    assert parser.finish(exit_code=0, stderr_tail="", interrupted=False).status == "completed"


# --- final reply ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_text", "result", "expected_texts"),
    [
        ("Done: see above.", "FINAL the real reply", ["Done: see above.", "FINAL the real reply"]),
        ("FINAL same", "FINAL same", ["FINAL same"]),
        (None, "FINAL only in result", ["FINAL only in result"]),
    ],
)
def test_claude_reply_is_the_result_and_is_the_last_assistant_item(
    last_text: str | None, result: str, expected_texts: list[str]
) -> None:
    parser = ClaudeEvents()
    stream = [CLAUDE_INIT, claude_assistant(tool_use("t1", "Bash", command="ls")), claude_result("t1", "a")]
    if last_text is not None:
        stream += [claude_assistant(text(last_text)), claude_assistant(text(last_text))]  # a repeat
    events = feed_all(parser, [*stream, CLAUDE_SUCCESS | {"result": result}])
    texts = [e.text for e in events if isinstance(e, ItemProduced) and e.kind == "assistant_message"]
    assert texts == expected_texts
    assert parser.reply == result


def test_claude_reply_before_a_result_is_the_last_assistant_text() -> None:
    parser = ClaudeEvents()
    feed_all(parser, [CLAUDE_INIT, claude_assistant(text("partial answer"))])
    assert parser.reply == "partial answer"


def test_gemini_reply_is_the_text_after_the_last_tool_result() -> None:
    parser = GeminiEvents()
    stream = lines("""
{"type":"message","role":"assistant","content":"before ","delta":true}
{"type":"tool_use","tool_name":"read_file","tool_id":"r1","parameters":{"file_path":"/w/a.py"}}
{"type":"message","role":"assistant","content":"between","delta":true}
{"type":"tool_result","tool_id":"r1","status":"success","output":"x = 1"}
{"type":"message","role":"assistant","content":"FINAL ","delta":true}
{"type":"message","role":"assistant","content":"x is 1","delta":true}
""")
    events = feed_all(parser, stream)
    assert parser.reply == "FINAL x is 1", "the reply is known before the result line"
    events += parser.feed({"type": "result", "status": "success"})
    assert [e.text for e in events if isinstance(e, ItemProduced)] == [
        "before ",
        "between",
        "read_file",
        "FINAL x is 1",
    ]
    assert parser.reply == "FINAL x is 1"


def test_codex_reply_is_the_last_agent_message_of_the_turn() -> None:
    parser = CodexEvents()
    feed_all(parser, CODEX_OK[:-1])
    assert parser.reply == "FINAL fixed the bug"
    parser.feed({"type": "turn.started"})
    assert parser.reply is None, "a new turn has no reply yet"


# --- session ids ----------------------------------------------------------------------------------


def test_claude_reports_each_distinct_session_id_once() -> None:
    parser = ClaudeEvents()
    init_b = CLAUDE_INIT | {"session_id": "s2"}
    events = feed_all(parser, [CLAUDE_INIT, claude_assistant(text("hi")), CLAUDE_INIT, init_b, init_b])
    assert [e for e in events if isinstance(e, SessionStarted)] == [
        SessionStarted("s1"),
        SessionStarted("s2"),
    ]


def test_claude_takes_the_session_id_from_any_line_when_there_is_no_init() -> None:
    parser = ClaudeEvents()
    bare = [{"type": "system", "subtype": "ui_invalidate", "session_id": "s9"}, claude_assistant(text("hi"))]
    assert feed_all(parser, bare)[0] == SessionStarted("s9")


# --- outcomes -------------------------------------------------------------------------------------

CODEX_FAIL = lines("""
{"type":"thread.started","thread_id":"th-1"}
{"type":"turn.started"}
{"type":"error","message":"Reconnecting... 2/5 (stream disconnected before completion)"}
{"type":"turn.failed","error":{"message":"stream disconnected before completion: connection refused"}}
""")
CODEX_NOISE = (
    "Reading additional input from stdin...\n"
    'WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries under temporary dir "/tmp"\n'
    "Error: Not inside a trusted directory and --skip-git-repo-check was not specified.\n\n"
)
CLAUDE_DENIED: list[dict[str, Any]] = [
    CLAUDE_INIT,
    claude_assistant(tool_use("t1", "Bash", command="rm -rf build")),
    claude_result(
        "t1", "Claude requested permissions to use Bash, but you haven't granted it yet.", is_error=True
    ),
    claude_assistant(text("FINAL I could not run it")),
    CLAUDE_SUCCESS
    | {
        "result": "FINAL I could not run it",
        "permission_denials": [
            {"tool_name": "Bash", "tool_use_id": "t1", "tool_input": {"command": "rm -rf build"}},
            {"tool_name": "Write", "tool_use_id": "t2", "tool_input": {}},
            {"tool_name": "Bash", "tool_use_id": "t3", "tool_input": {}},
        ],
    },
]
CLAUDE_MAX_TURNS: list[dict[str, Any]] = [
    CLAUDE_INIT,
    {
        "type": "result",
        "subtype": "error_max_turns",
        "is_error": True,
        "num_turns": 5,
        "stop_reason": None,
        "errors": ["Reached maximum number of turns (5)"],
        "permission_denials": [],
    },
]
GEMINI_CONFIRM = lines("""
{"type":"init","session_id":"g-1","model":"m"}
{"type":"tool_use","tool_name":"run_shell_command","tool_id":"sh_1","parameters":{"command":"rm -rf build"}}
{"type":"tool_result","tool_id":"sh_1","status":"error","error":{"type":"tool_error","message":"Tool execution for \\"Shell\\" requires user confirmation, which is not supported in non-interactive mode."}}
{"type":"message","role":"assistant","content":"FINAL I was not allowed to run it","delta":true}
{"type":"result","status":"success","stats":{}}
""")
GEMINI_FAIL = lines("""
{"type":"init","session_id":"g-1","model":"m"}
{"type":"result","status":"error","error":{"type":"FatalCancellationError","message":"Operation cancelled."},"stats":{}}
""")

OUTCOMES: list[tuple[str, Callable[[], Parser], list[dict[str, Any]], int, str, bool, RunFinished]] = [
    ("codex ok, non-fatal error", CodexEvents, CODEX_OK, 0, "", False, RunFinished("completed", exit_code=0)),
    (
        "codex turn failed",
        CodexEvents,
        CODEX_FAIL,
        1,
        CODEX_NOISE,
        False,
        RunFinished("failed", "stream disconnected before completion: connection refused", 1),
    ),
    (
        "codex turn failed without message",
        CodexEvents,
        [*CODEX_FAIL[:-1], {"type": "turn.failed", "error": {}}],
        1,
        "",
        False,
        RunFinished("failed", "Reconnecting... 2/5 (stream disconnected before completion)", 1),
    ),
    (
        "codex crash, noise stripped",
        CodexEvents,
        [],
        1,
        CODEX_NOISE,
        False,
        RunFinished(
            "failed", "Error: Not inside a trusted directory and --skip-git-repo-check was not specified.", 1
        ),
    ),
    (
        "codex crash, no stderr",
        CodexEvents,
        [],
        1,
        "Reading additional input from stdin...\n",
        False,
        RunFinished("failed", "Codex exited with code 1 (fatal error)", 1),
    ),
    (
        "codex success, non-zero exit",
        CodexEvents,
        CODEX_OBSERVED,
        3,
        "boom\n",
        False,
        RunFinished("failed", "Codex reported success but exited with code 3: boom", 3),
    ),
    (
        "codex interrupted",
        CodexEvents,
        CODEX_OK[:5],
        130,
        "",
        True,
        RunFinished("interrupted", exit_code=130),
    ),
    (
        "codex completed before the interrupt",
        CodexEvents,
        CODEX_OK,
        130,
        "",
        True,
        RunFinished("completed", exit_code=130),
    ),
    (
        "codex stream ends without a turn event",
        CodexEvents,
        CODEX_OK[:2],
        0,
        "",
        False,
        RunFinished("failed", "Codex exited with code 0 without reporting the end of its turn", 0),
    ),
    (
        "claude permission denials",
        ClaudeEvents,
        CLAUDE_DENIED,
        0,
        "",
        False,
        RunFinished(
            "failed",
            "Claude Code denied 3 tool call(s) this run's access level does not allow: Bash, Write. "
            "The reply may be incomplete.",
            0,
        ),
    ),
    (
        "claude max turns",
        ClaudeEvents,
        CLAUDE_MAX_TURNS,
        1,
        "",
        False,
        RunFinished(
            "failed",
            "Claude Code reached its turn limit (error_max_turns): Reached maximum number of turns (5)",
            1,
        ),
    ),
    (
        "claude api error result",
        ClaudeEvents,
        [CLAUDE_INIT, CLAUDE_SUCCESS | {"is_error": True, "result": "API Error: 401 invalid x-api-key"}],
        1,
        "",
        False,
        RunFinished("failed", "API Error: 401 invalid x-api-key", 1),
    ),
    (
        "claude bad recipe, stderr only",
        ClaudeEvents,
        [],
        1,
        "Error: When using --print, --output-format=stream-json requires --verbose\n",
        False,
        RunFinished("failed", "Error: When using --print, --output-format=stream-json requires --verbose", 1),
    ),
    (
        "claude interrupted with an error result",
        ClaudeEvents,
        [*CLAUDE_OK[:4], {"type": "result", "subtype": "error_during_execution", "is_error": True}],
        0,
        "",
        True,
        RunFinished("interrupted", exit_code=0),
    ),
    (
        "claude killed by SIGTERM",
        ClaudeEvents,
        CLAUDE_OK[:4],
        143,
        "",
        False,
        RunFinished("failed", "Claude Code exited with code 143 (terminated)", 143),
    ),
    (
        "gemini tool needs confirmation",
        GeminiEvents,
        GEMINI_CONFIRM,
        0,
        "",
        False,
        RunFinished("completed", exit_code=0),
    ),
    (
        "gemini result error",
        GeminiEvents,
        GEMINI_FAIL,
        130,
        "",
        False,
        RunFinished("failed", "Operation cancelled.", 130),
    ),
    (
        "gemini untrusted workspace",
        GeminiEvents,
        [],
        55,
        "",
        False,
        RunFinished("failed", "Gemini CLI exited with code 55 (untrusted workspace)", 55),
    ),
    (
        "gemini auth, stderr",
        GeminiEvents,
        [],
        41,
        "[WARNING] x\nInvalid auth method selected.\n",
        False,
        RunFinished("failed", "[WARNING] x\nInvalid auth method selected.", 41),
    ),
    (
        "gemini killed by a signal",
        GeminiEvents,
        GEMINI_OK[:4],
        -15,
        "",
        False,
        RunFinished("failed", "Gemini CLI was ended by signal 15", -15),
    ),
    (
        "gemini interrupted",
        GeminiEvents,
        GEMINI_OK[:4],
        -15,
        "",
        True,
        RunFinished("interrupted", exit_code=-15),
    ),
]


@pytest.mark.parametrize(
    ("make", "stream", "exit_code", "stderr", "interrupted", "expected"),
    [case[1:] for case in OUTCOMES],
    ids=[case[0] for case in OUTCOMES],
)
def test_finish_outcome(
    make: Callable[[], Parser],
    stream: list[dict[str, Any]],
    exit_code: int,
    stderr: str,
    interrupted: bool,
    expected: RunFinished,
) -> None:
    parser = make()
    feed_all(parser, stream)
    assert parser.finish(exit_code=exit_code, stderr_tail=stderr, interrupted=interrupted) == expected


# --- failed tools and non-fatal errors ------------------------------------------------------------


def test_codex_mcp_call_refused_by_the_approval_policy_is_a_failed_tool_call() -> None:
    approval = "MCP tool call requires approval, but approval policy is never"
    item = {
        "id": "item_0",
        "type": "mcp_tool_call",
        "server": "peerd",
        "tool": "delegate_task",
        "arguments": {"title": "x"},
        "result": None,
        "error": {"message": approval},
        "status": "failed",
    }
    (event,) = CodexEvents().feed({"type": "item.completed", "item": item})
    assert event == ItemProduced(
        "tool_call",
        f"peerd.delegate_task (failed: {approval})",
        {
            "server": "peerd",
            "tool": "delegate_task",
            "arguments": {"title": "x"},
            "result": None,
            "error": approval,
            "status": "failed",
        },
    )


def test_gemini_tool_refused_in_headless_mode_is_a_failed_command_with_the_reason() -> None:
    parser = GeminiEvents()
    events = feed_all(parser, GEMINI_CONFIRM)
    command = events[1]
    assert isinstance(command, ItemProduced) and command.kind == "command"
    assert command.text.startswith(
        'rm -rf build (failed: Tool execution for "Shell" requires user confirmation'
    )
    assert command.data["status"] == "failed" and "requires user confirmation" in command.data["error"]
    assert parser.reply == "FINAL I was not allowed to run it"


def test_claude_denied_tool_is_a_failed_item_and_api_error_text_is_a_notice() -> None:
    parser = ClaudeEvents()
    events = feed_all(parser, CLAUDE_DENIED[:3])
    assert isinstance(events[-1], ItemProduced) and events[-1].data["status"] == "failed"
    assert events[-1].text.startswith("rm -rf build (failed: Claude requested permissions")
    api_error = claude_assistant(text("API Error: 529 overloaded"), error="server_error")
    assert parser.feed(api_error) == [
        ItemProduced("notice", "API Error: 529 overloaded", {"error": "server_error"})
    ]
    assert parser.reply is None, "a synthetic API error message is not a reply"


def test_codex_progress_events_make_no_items() -> None:
    parser = CodexEvents()
    progress = [line for line in CODEX_OK if line["type"] in {"item.started", "item.updated", "error"}]
    assert progress and feed_all(parser, progress) == []


def test_long_command_output_keeps_its_tail() -> None:
    output = "x" * 5000 + "END"
    item = {"type": "command_execution", "command": "cat big", "aggregated_output": output, "exit_code": 1}
    (event,) = CodexEvents().feed({"type": "item.completed", "item": item})
    assert isinstance(event, ItemProduced)
    assert len(event.data["output"]) == 4000 and event.data["output"].endswith("END")
    assert event.data["output_truncated"] is True and event.data["exit_code"] == 1


def test_stderr_reason_keeps_the_first_line_and_the_last_lines_within_the_limit() -> None:
    stderr = "\n".join(f"line {i} " + "y" * 90 for i in range(100))
    reason = tail_of_stderr(stderr)
    assert len(reason) <= 2000 and reason.endswith("line 99 " + "y" * 90)
    assert reason.startswith("line 0 " + "y" * 90 + "\n...\nline ")
    assert tail_of_stderr("z" * 5000) == "z" * 2000
    assert tail_of_stderr("short\nfailure") == "short\nfailure"


def test_a_usage_error_before_a_long_help_text_is_the_reason() -> None:
    """Gemini says what was wrong first, then prints 4 KB of usage: the reason starts with it."""
    usage = "\n".join(f"  --option-{i}  what option {i} does" + " ." * 20 for i in range(80))
    reason = tail_of_stderr("Unknown arguments: frobnicate, f\nUsage: gemini [options]\n" + usage)
    assert reason.startswith("Unknown arguments: frobnicate, f\n...\n") and len(reason) <= 2000


# --- garbage --------------------------------------------------------------------------------------

ODD_VALUES: list[Any] = [None, 1, True, "x", [], {}, [1, "a", None], {"type": 3}]


@pytest.mark.parametrize("make", [CodexEvents, ClaudeEvents, GeminiEvents], ids=["codex", "claude", "gemini"])
def test_unknown_types_are_ignored(make: Callable[[], Parser]) -> None:
    parser = make()
    odd: list[dict[str, Any]] = [
        {},
        {"type": "no.such.event", "x": 1},
        {"type": None},
        {"type": ["a"]},
        {"item": {"type": "agent_message"}},
    ]
    assert feed_all(parser, odd) == []
    assert parser.reply is None


@pytest.mark.parametrize(
    ("make", "stream"),
    [
        (CodexEvents, CODEX_OK + CODEX_FAIL),
        (ClaudeEvents, CLAUDE_OK + CLAUDE_DENIED),
        (GeminiEvents, GEMINI_OK),
    ],
    ids=["codex", "claude", "gemini"],
)
def test_wrong_field_types_never_raise(make: Callable[[], Parser], stream: list[dict[str, Any]]) -> None:
    """Every field of every line (nested ones too) replaced by each odd value: parse and finish survive."""

    def variants(value: Any) -> Iterable[Any]:
        yield from ODD_VALUES
        if isinstance(value, dict):
            for key, inner in value.items():
                for odd in variants(inner):
                    yield value | {key: odd}
        elif isinstance(value, list):
            for index, inner in enumerate(value):
                for odd in variants(inner):
                    yield [*value[:index], odd, *value[index + 1 :]]

    for index, line in enumerate(stream):
        for odd_line in variants(line):
            if not isinstance(odd_line, dict):
                continue
            parser = make()
            feed_all(parser, [*stream[:index], odd_line, *stream[index + 1 :]])
            assert isinstance(parser.reply, str | None)
            parser.finish(exit_code=1, stderr_tail="", interrupted=False)


def test_a_codex_mcp_call_that_answered_an_error_says_why() -> None:
    item = {
        "type": "mcp_tool_call",
        "server": "peerd",
        "tool": "delegate_task",
        "arguments": {},
        "result": {"content": [{"type": "text", "text": "target_required: Pass target.model.\nmore"}]},
        "error": None,
        "status": "failed",
    }
    (event,) = CodexEvents().feed({"type": "item.completed", "item": item})
    assert isinstance(event, ItemProduced)
    assert event.text == "peerd.delegate_task (failed: target_required: Pass target.model.)"


# --- Codex retries bounded by model_retries -------------------------------------------------------

CODEX_RETRYING = [
    {"type": "thread.started", "thread_id": "t-1"},
    {"type": "turn.started"},
    *({"type": "error", "message": f"Reconnecting... {n}/5 (high demand)"} for n in (1, 2, 3, 4, 5)),
]


def test_codex_gives_up_after_model_retries_failed_attempts_in_a_row() -> None:
    parser = CodexEvents(model_retries=2)
    reasons = []
    for line in CODEX_RETRYING:
        parser.feed(line)
        reasons.append(parser.give_up_reason)
    # thread.started, turn.started, then attempts 1 and 2 failed: not yet; attempt 3 failed: give up.
    assert reasons[:4] == [None, None, None, None]
    assert reasons[4] is not None and "failed 3 attempts in a row (model_retries = 2)" in reasons[4]
    assert "Reconnecting... 3/5" in reasons[4]
    done = parser.finish(exit_code=-15, stderr_tail="", interrupted=False)
    assert done == RunFinished("failed", error=reasons[4], exit_code=-15)


def test_codex_progress_between_failures_restarts_the_count() -> None:
    parser = CodexEvents(model_retries=1)
    answer = {"type": "item.completed", "item": {"type": "agent_message", "text": "working on it"}}
    for line in [CODEX_RETRYING[0], CODEX_RETRYING[1], CODEX_RETRYING[2], answer, CODEX_RETRYING[3]]:
        parser.feed(line)
    assert parser.give_up_reason is None
    parser.feed(CODEX_RETRYING[4])
    assert parser.give_up_reason is not None


def test_codex_without_a_bound_never_gives_up() -> None:
    parser = CodexEvents()
    feed_all(parser, CODEX_RETRYING)
    assert parser.give_up_reason is None
