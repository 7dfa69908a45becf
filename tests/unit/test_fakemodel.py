"""Unit tests of tests/fakemodel.py, the scripted fake model server for the real-CLI tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakemodel import NO_SCRIPT_TEXT, FakeModel, fill_schema

MCP = {"tool_call": {"server": "peerd", "tool": "delegate_task", "arguments": {"text": "ask {last_user}"}}}
SCRIPTS: dict[str, dict[str, Any]] = {
    "mcp": {
        "steps": [
            MCP,
            {"text": "FINAL <{tool_result}>"},
            MCP,
            {"text": "AGAIN <{tool_result}> for <{last_user}>"},
        ],
        "fallback_text": "SIDE",
    },
    "tool_last": {"steps": [MCP], "fallback_text": "SIDE"},
    "edit": {
        "steps": [
            {
                "per_dialect": {
                    "anthropic": {
                        "tool_call": {"name": "Write", "arguments": {"file_path": "/w/a", "content": "x"}}
                    },
                    "responses": {
                        "tool_call": {"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}
                    },
                    "default": {"text": "no edit here"},
                }
            }
        ],
        "fallback_text": "SIDE",
    },
    "hang": {"steps": [{"hang": True}]},
    "hang_once": {"steps": [{"hang": True, "times": 1}, {"text": "past the hang"}]},
    "error": {"steps": [{"error": {"status": 400, "message": "scripted failure"}}]},
    "error_once": {
        "steps": [{"error": {"status": 500, "message": "boom"}, "times": 1}, {"text": "recovered"}]
    },
}

ANTHROPIC_TOOLS = [
    {"name": "Write", "input_schema": {}},
    {"name": "mcp__peerd__delegate_task", "input_schema": {}},
]
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {}},
    {"type": "custom", "name": "apply_patch", "format": {}},
    {
        "type": "namespace",
        "name": "mcp__peerd",
        "tools": [{"type": "function", "name": "delegate_task", "parameters": {}}],
    },
]
GEMINI_TOOLS = [{"functionDeclarations": [{"name": "write_file"}, {"name": "mcp_peerd_delegate_task"}]}]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModel]:
    with FakeModel(SCRIPTS, log_path=tmp_path / "requests.jsonl") as model:
        yield model


def post(fake: FakeModel, path: str, body: Any, *, timeout: float = 5) -> tuple[int, str, bytes]:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(fake.base_url + path, data=data, method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - our own http:// URL
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers.get("Content-Type", ""), err.read()


def sse(payload: bytes) -> list[tuple[str | None, Any]]:
    events = []
    for chunk in payload.decode().split("\n\n"):
        if not chunk.strip():
            continue
        event, data = None, None
        for line in chunk.splitlines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                raw = line[len("data: ") :]
                data = raw if raw == "[DONE]" else json.loads(raw)
        events.append((event, data))
    return events


# -- request builders ------------------------------------------------------------------------


def anthropic(
    prompt: str, *turns: dict[str, Any], tools: list[dict[str, Any]] | None = None, stream: bool = True
) -> dict[str, Any]:
    first = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>\nctx\n</system-reminder>"},
            {"type": "text", "text": prompt},
        ],
    }
    return {
        "model": "claude-x",
        "stream": stream,
        "tools": ANTHROPIC_TOOLS if tools is None else tools,
        "messages": [first, *turns],
    }


def a_tool_use(name: str = "mcp__peerd__delegate_task") -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": name, "input": {}}]}


def a_tool_result(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}


def responses(
    prompt: str, *items: dict[str, Any], tools: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    def user(text: str) -> dict[str, Any]:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    return {
        "model": "fake-model",
        "stream": True,
        "tools": CODEX_TOOLS if tools is None else tools,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be good"}]},
            user("<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"),
            user(prompt),
            *items,
        ],
    }


def gemini(prompt: str, *contents: dict[str, Any], **extra: Any) -> dict[str, Any]:
    first = {
        "role": "user",
        "parts": [{"text": "<session_context>\nctx\n</session_context>"}, {"text": prompt}],
    }
    return {"contents": [first, *contents], "tools": GEMINI_TOOLS, **extra}


def responses_final(payload: bytes) -> dict[str, Any]:
    events = sse(payload)
    assert events[0][0] == "response.created"
    assert events[-1][0] == "response.completed"
    assert events[-1][1]["response"]["usage"]["total_tokens"] == 15
    (item,) = [d["item"] for e, d in events if e == "response.output_item.done"]
    return item


# -- Anthropic -------------------------------------------------------------------------------


def test_anthropic_stream_calls_the_mcp_tool_then_quotes_its_result(fake: FakeModel) -> None:
    status, ctype, payload = post(fake, "/v1/messages?beta=true", anthropic("[[fake:mcp]] please go"))
    assert status == 200
    assert ctype == "text/event-stream"
    events = sse(payload)
    assert [e for e, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["model"] == "claude-x"
    block = events[1][1]["content_block"]
    assert block["type"] == "tool_use"
    assert block["name"] == "mcp__peerd__delegate_task"
    assert json.loads(events[2][1]["delta"]["partial_json"]) == {"text": "ask [[fake:mcp]] please go"}
    assert events[4][1]["delta"]["stop_reason"] == "tool_use"

    body = anthropic(
        "[[fake:mcp]] go", a_tool_use(), a_tool_result([{"type": "text", "text": '{"result":"echo: hi"}'}])
    )
    events = sse(post(fake, "/v1/messages", body)[2])
    assert events[2][1]["delta"] == {"type": "text_delta", "text": 'FINAL <{"result":"echo: hi"}>'}
    assert events[4][1]["delta"]["stop_reason"] == "end_turn"
    assert [(r["script"], r["step"]) for r in fake.requests] == [("mcp", 0), ("mcp", 1)]
    assert fake.requests[0]["path"] == "/v1/messages"


def test_anthropic_non_stream_and_count_tokens(fake: FakeModel) -> None:
    body = anthropic("[[fake:mcp]] go", a_tool_use(), a_tool_result("plain result"), stream=False)
    status, ctype, payload = post(fake, "/v1/messages", body)
    assert (status, ctype) == (200, "application/json")
    message = json.loads(payload)
    assert message["content"] == [{"type": "text", "text": "FINAL <plain result>"}]
    assert message["stop_reason"] == "end_turn"
    assert message["model"] == "claude-x"
    status, _, payload = post(fake, "/v1/messages/count_tokens", {"messages": []})
    assert (status, json.loads(payload)) == (200, {"input_tokens": 10})


def test_resumed_session_continues_at_the_next_step(fake: FakeModel) -> None:
    history = [
        a_tool_use(),
        a_tool_result("r1"),
        {"role": "assistant", "content": [{"type": "text", "text": "FINAL"}]},
    ]
    resumed = anthropic("[[fake:mcp]] go", *history, {"role": "user", "content": "follow up"}, stream=False)
    message = json.loads(post(fake, "/v1/messages", resumed)[2])
    assert message["content"][0]["name"] == "mcp__peerd__delegate_task"
    assert message["content"][0]["input"] == {"text": "ask follow up"}
    assert fake.requests[-1]["step"] == 2


def test_synthetic_interrupt_turns_are_not_model_turns(fake: FakeModel) -> None:
    fake.scripts["count"] = {"steps": [{"text": "step zero"}, {"text": "step one"}]}

    def claude_after(assistant_text: str) -> str:
        body = anthropic(
            "[[fake:count]] go",
            {"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]},
            {"role": "assistant", "content": [{"type": "text", "text": assistant_text}]},
            {"role": "user", "content": "again"},
            stream=False,
        )
        return str(json.loads(post(fake, "/v1/messages", body)[2])["content"][0]["text"])

    def gemini_after(model_text: str) -> str:
        body = gemini(
            "[[fake:count]] go",
            {"role": "model", "parts": [{"text": model_text}]},
            {"role": "user", "parts": [{"text": "again"}]},
        )
        reply = json.loads(post(fake, "/v1beta/models/g:generateContent", body)[2])
        return str(reply["candidates"][0]["content"]["parts"][0]["text"])

    assert claude_after("No response requested.") == "step zero"
    assert claude_after("a real answer") == "step one"
    assert gemini_after("[The previous response was interrupted before it completed.]") == "step zero"
    assert gemini_after("a real answer") == "step one"


def test_past_the_end_repeats_a_final_text_else_fallback(fake: FakeModel) -> None:
    turns = [a_tool_use(), a_tool_result("r")] * 3
    long = anthropic("[[fake:mcp]] go", *turns, {"role": "user", "content": "more"}, stream=False)
    assert json.loads(post(fake, "/v1/messages", long)[2])["content"][0]["text"] == "AGAIN <r> for <more>"
    after_tool = anthropic("[[fake:tool_last]] go", a_tool_use(), a_tool_result("r"), stream=False)
    assert json.loads(post(fake, "/v1/messages", after_tool)[2])["content"][0]["text"] == "SIDE"


def test_side_request_without_the_tool_gets_the_fallback_text(fake: FakeModel) -> None:
    side = anthropic("[[fake:mcp]] go", tools=[{"name": "Read"}], stream=False)
    assert json.loads(post(fake, "/v1/messages", side)[2])["content"][0]["text"] == "SIDE"
    assert fake.requests[-1]["answer"] == {"kind": "text", "text": "SIDE"}


def test_script_selection(tmp_path: Path) -> None:
    scripts = {"a": {"steps": [{"text": "A"}]}, "b": {"steps": [{"text": "B"}]}}
    with FakeModel(scripts, default="a") as fake:

        def ask(prompt: str, *turns: dict[str, Any]) -> str:
            body = anthropic(prompt, *turns, stream=False)
            return str(json.loads(post(fake, "/v1/messages", body)[2])["content"][0]["text"])

        assert ask("no marker") == "A"
        assert ask("[[fake:b]] x") == "B"
        # The first marker in history order wins, even if a later user message names another one.
        assert (
            ask(
                "[[fake:b]] x",
                {"role": "assistant", "content": "B"},
                {"role": "user", "content": "[[fake:a]]"},
            )
            == "B"
        )
        assert "unknown script 'zzz'" in ask("[[fake:zzz]]")
    with FakeModel(scripts) as fake:
        body = anthropic("no marker", stream=False)
        assert json.loads(post(fake, "/v1/messages", body)[2])["content"][0]["text"] == NO_SCRIPT_TEXT


def test_verbatim_tool_names_and_per_dialect_steps(fake: FakeModel) -> None:
    message = json.loads(post(fake, "/v1/messages", anthropic("[[fake:edit]]", stream=False))[2])
    assert message["content"][0]["name"] == "Write"
    assert message["content"][0]["input"] == {"file_path": "/w/a", "content": "x"}
    no_write = anthropic("[[fake:edit]]", tools=[{"name": "Read"}], stream=False)
    assert json.loads(post(fake, "/v1/messages", no_write)[2])["content"][0]["text"] == "SIDE"
    item = responses_final(post(fake, "/v1/responses", responses("[[fake:edit]]"))[2])
    assert item["type"] == "custom_tool_call"
    assert (item["name"], item["input"]) == ("apply_patch", "*** Begin Patch")
    reply = json.loads(post(fake, "/v1beta/models/g:generateContent", gemini("[[fake:edit]]"))[2])
    assert reply["candidates"][0]["content"]["parts"] == [{"text": "no edit here"}]


# -- OpenAI Responses ------------------------------------------------------------------------


def test_responses_calls_a_namespaced_mcp_tool_and_reads_its_output(fake: FakeModel) -> None:
    status, ctype, payload = post(fake, "/v1/responses", responses("[[fake:mcp]] hi"))
    assert (status, ctype) == (200, "text/event-stream")
    item = responses_final(payload)
    assert item["type"] == "function_call"
    assert (item["namespace"], item["name"]) == ("mcp__peerd", "delegate_task")
    assert json.loads(item["arguments"]) == {"text": "ask [[fake:mcp]] hi"}

    call = {"type": "function_call", "call_id": "c1", "namespace": "mcp__peerd", "name": "delegate_task"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "Wall time: 0\nOutput:\necho: hi"}
    item = responses_final(post(fake, "/v1/responses", responses("[[fake:mcp]] hi", call, output))[2])
    assert item["type"] == "message"
    assert item["role"] == "assistant"
    assert item["content"][0] == {
        "type": "output_text",
        "text": "FINAL <Wall time: 0\nOutput:\necho: hi>",
        "annotations": [],
    }
    assert fake.requests[-1]["step"] == 1


def test_responses_tool_search_flow(fake: FakeModel) -> None:
    fake.scripts["ts"] = {
        "steps": [
            {"tool_call": {"name": "tool_search", "arguments": {"query": "delegate"}}},
            MCP,
            {"text": "done"},
        ]
    }
    offered = [{"type": "function", "name": "exec_command"}, {"type": "tool_search", "execution": "client"}]
    item = responses_final(post(fake, "/v1/responses", responses("[[fake:ts]]", tools=offered))[2])
    assert item["type"] == "tool_search_call"
    assert (item["execution"], item["arguments"]) == ("client", {"query": "delegate"})
    search = {"type": "tool_search_call", "call_id": "s1", "execution": "client", "arguments": {}}
    found = {"type": "tool_search_output", "call_id": "s1", "tools": [CODEX_TOOLS[2]]}
    item = responses_final(
        post(fake, "/v1/responses", responses("[[fake:ts]]", search, found, tools=offered))[2]
    )
    assert (item["type"], item["namespace"], item["name"]) == ("function_call", "mcp__peerd", "delegate_task")


def test_responses_non_stream(fake: FakeModel) -> None:
    body = {**responses("[[fake:mcp]]"), "stream": False}
    reply = json.loads(post(fake, "/v1/responses", body)[2])
    assert reply["status"] == "completed"
    assert reply["output"][0]["type"] == "function_call"


# -- Chat Completions ------------------------------------------------------------------------


def test_chat_completions_plain_and_streamed(fake: FakeModel) -> None:
    tools = [{"type": "function", "function": {"name": "mcp__peerd__delegate_task"}}]
    body = {"model": "m", "tools": tools, "messages": [{"role": "user", "content": "[[fake:mcp]] hi"}]}
    reply = json.loads(post(fake, "/v1/chat/completions", body)[2])
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "mcp__peerd__delegate_task"
    assert json.loads(call["function"]["arguments"]) == {"text": "ask [[fake:mcp]] hi"}

    body["messages"] += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "echo: hi"}]
    events = sse(post(fake, "/v1/chat/completions", {**body, "stream": True})[2])
    assert events[0][1]["choices"][0]["delta"]["content"] == "FINAL <echo: hi>"
    assert events[1][1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == (None, "[DONE]")


# -- Gemini ----------------------------------------------------------------------------------


def test_gemini_stream_function_call_then_text(fake: FakeModel) -> None:
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    status, ctype, payload = post(fake, path, gemini("[[fake:mcp]] hi"))
    assert (status, ctype) == (200, "text/event-stream")
    ((event, data),) = sse(payload)
    assert event is None
    candidate = data["candidates"][0]
    assert candidate["content"]["role"] == "model"
    assert candidate["content"]["parts"] == [
        {"functionCall": {"name": "mcp_peerd_delegate_task", "args": {"text": "ask [[fake:mcp]] hi"}}}
    ]
    assert data["usageMetadata"]["totalTokenCount"] == 17  # 10 prompt + 5 candidates + 2 thoughts

    call = {"role": "model", "parts": [{"functionCall": {"name": "mcp_peerd_delegate_task", "args": {}}}]}
    response = {"output": "<untrusted_context>\necho: hi\n</untrusted_context>"}
    result = {
        "role": "user",
        "parts": [{"functionResponse": {"name": "mcp_peerd_delegate_task", "response": response}}],
    }
    ((_, data),) = sse(post(fake, path, gemini("[[fake:mcp]] hi", call, result))[2])
    assert data["candidates"][0]["content"]["parts"] == [
        {"text": "FINAL <<untrusted_context>\necho: hi\n</untrusted_context>>"}
    ]
    assert fake.requests[-1]["path"] == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"


def test_gemini_json_mode_answers_by_schema_and_never_hangs(fake: FakeModel) -> None:
    schema = {
        "type": "object",
        "properties": {
            "complexity_reasoning": {"type": "string"},
            "complexity_score": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "required": ["complexity_reasoning", "complexity_score"],
    }
    config = {"responseMimeType": "application/json", "responseJsonSchema": schema}
    body = gemini("[[fake:hang]] route me", generationConfig=config)
    reply = json.loads(post(fake, "/v1beta/models/gemini-3.5-flash-lite:generateContent", body, timeout=2)[2])
    value = json.loads(reply["candidates"][0]["content"]["parts"][0]["text"])
    assert isinstance(value["complexity_reasoning"], str)
    assert value["complexity_score"] == 1
    assert fake.requests[-1]["answer"]["kind"] == "json"

    upper = {"type": "OBJECT", "properties": {"next_speaker": {"type": "STRING", "enum": ["model", "user"]}}}
    body = gemini("x", generationConfig={"responseMimeType": "application/json", "responseSchema": upper})
    reply = json.loads(post(fake, "/v1beta/models/g:generateContent", body)[2])
    assert json.loads(reply["candidates"][0]["content"]["parts"][0]["text"]) == {"next_speaker": "user"}
    status, _, payload = post(fake, "/v1beta/models/g:countTokens", {"contents": []})
    assert (status, json.loads(payload)) == (200, {"totalTokens": 10})


def test_fill_schema() -> None:
    assert fill_schema({"type": "array", "items": {"type": "number"}, "minItems": 2}) == [1.0, 1.0]
    assert fill_schema({"type": ["null", "boolean"]}) is False
    assert fill_schema({"anyOf": [{"type": "null"}, {"const": 7}]}) == 7
    assert fill_schema({"properties": {"a": {"type": "string"}}}) == {"a": "FAKE-MODEL: a"}


# -- errors ----------------------------------------------------------------------------------


def test_error_steps_use_each_dialects_error_body(fake: FakeModel) -> None:
    status, _, payload = post(fake, "/v1/messages", anthropic("[[fake:error]]"))
    assert status == 400
    assert json.loads(payload) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "scripted failure"},
    }
    status, _, payload = post(fake, "/v1/responses", responses("[[fake:error]]"))
    assert status == 400
    assert json.loads(payload)["error"] == {
        "message": "scripted failure",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    status, _, payload = post(fake, "/v1beta/models/g:streamGenerateContent", gemini("[[fake:error]]"))
    assert status == 400
    assert json.loads(payload) == {
        "error": {"code": 400, "message": "scripted failure", "status": "INVALID_ARGUMENT"}
    }


def test_error_with_times_is_dropped_after_being_served(fake: FakeModel) -> None:
    assert post(fake, "/v1/messages", anthropic("[[fake:error_once]]"))[0] == 500
    status, _, payload = post(fake, "/v1/messages", anthropic("[[fake:error_once]]", stream=False))
    assert status == 200
    assert json.loads(payload)["content"][0]["text"] == "recovered"


def test_unknown_path_is_404_and_everything_is_logged(fake: FakeModel, tmp_path: Path) -> None:
    status, _, payload = post(fake, "/v1/models?x=1", {})
    assert status == 404
    assert "no route" in json.loads(payload)["error"]["message"]
    post(fake, "/v1/messages", anthropic("[[fake:mcp]]"))
    logged = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [(r["path"], r["dialect"], r["script"], r["step"]) for r in logged] == [
        ("/v1/models", None, None, None),
        ("/v1/messages", "anthropic", "mcp", 0),
    ]
    assert logged[1]["body"]["model"] == "claude-x"
    assert logged == fake.requests


# -- hang ------------------------------------------------------------------------------------


def raw_request(fake: FakeModel, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", fake.port), timeout=5)
    head = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


def test_hang_holds_until_the_client_disconnects_without_blocking_others(fake: FakeModel) -> None:
    with raw_request(fake, anthropic("[[fake:hang]]")) as sock:
        assert fake.wait_held(1, timeout=5)
        # Other requests are still served while one is held.
        assert post(fake, "/v1/messages", anthropic("[[fake:mcp]]"))[0] == 200
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        assert fake.held == 1
    assert fake.wait_released(timeout=5)


def test_stop_releases_held_requests_quickly() -> None:
    fake = FakeModel(SCRIPTS).start()
    outcome: list[object] = []

    def client() -> None:
        try:
            outcome.append(post(fake, "/v1/messages", anthropic("[[fake:hang]]"), timeout=10))
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            outcome.append(err)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert fake.wait_held(1, timeout=5)
    finally:
        started = time.monotonic()
        fake.stop()
        stopped_in = time.monotonic() - started
        thread.join(timeout=5)
    assert stopped_in < 2
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], Exception)  # the connection closed without an answer
    assert fake.held == 0


def test_hang_with_times_lets_a_resumed_session_past_it(fake: FakeModel) -> None:
    with raw_request(fake, anthropic("[[fake:hang_once]]")):
        assert fake.wait_held(1, timeout=5)
    assert fake.wait_released(timeout=5)
    resumed = anthropic("[[fake:hang_once]]", {"role": "user", "content": "again"}, stream=False)
    assert json.loads(post(fake, "/v1/messages", resumed)[2])["content"][0]["text"] == "past the hang"


# -- standalone ------------------------------------------------------------------------------


def test_standalone_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(
        json.dumps({"scripts": {"only": {"steps": [{"text": "standalone"}]}}, "default": "only"})
    )
    port_file, log = tmp_path / "port", tmp_path / "log.jsonl"
    script = Path(__file__).resolve().parents[1] / "fakemodel.py"
    cmd = [
        sys.executable,
        str(script),
        "--scripts",
        str(scripts),
        "--port-file",
        str(port_file),
        "--log",
        str(log),
    ]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            assert int(port_file.read_text()) == port
            fake = FakeModel({})
            fake.port = port  # only for base_url
            reply = json.loads(post(fake, "/v1/messages", anthropic("hi", stream=False))[2])
            assert reply["content"][0]["text"] == "standalone"
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    assert json.loads(log.read_text().splitlines()[0])["script"] == "only"
