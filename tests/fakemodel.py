"""A scripted fake model server, so tests can run the real coding CLIs (Claude Code, Codex CLI,
Gemini CLI) fully offline. Standard library only.

One loopback port speaks four dialects:

- Anthropic Messages: ``POST /v1/messages`` (SSE when ``stream`` is true, else one JSON message) and
  ``POST /v1/messages/count_tokens``.
- OpenAI Responses: ``POST /v1/responses`` (SSE when ``stream`` is true, else one JSON response).
- OpenAI Chat Completions: ``POST /v1/chat/completions`` (plain or streamed).
- Gemini: ``POST /v1beta/models/<m>:streamGenerateContent`` (SSE), ``:generateContent`` (JSON) and
  ``:countTokens``.

Which script answers is chosen by a marker ``[[fake:NAME]]`` in the user messages of the request
(the first marker found, in history order), else the ``default`` script. Which step of it answers
is derived from the request alone: the number of model turns already in the history. Each
answer is one model turn (one tool call or one text), so a resumed session continues at the next
step, and retries or side requests cannot knock a script out of step.

Script: ``{"steps": [STEP, ...], "fallback_text": "..."}``. Steps:

- ``{"text": "..."}``; ``{tool_result}`` and ``{last_user}`` are replaced (in tool arguments too),
  ``{tool_result.NAME}`` by the string field NAME of the JSON in the last tool result (a task id,
  say), ``{var:NAME}`` by ``FakeModel.variables[NAME]``, and ``{cwd}`` by the agent's working
  directory as the CLI told the model (for tools that want absolute paths).
- ``{"tool_call": {"server": "peerd", "tool": "delegate_task", "arguments": {...}}}``: an MCP tool,
  resolved against the tools offered in this request (``mcp__peerd__delegate_task``, Codex namespace
  ``mcp__peerd`` + ``delegate_task``, ``mcp_peerd_delegate_task``).
- ``{"tool_call": {"name": "Write", "arguments": {...}}}``: a tool by its verbatim name (Claude
  ``Write``/``Bash``/``ToolSearch``, Codex ``exec_command``, ``apply_patch`` (a freeform tool: its
  ``arguments.input`` string is sent as the patch), ``tool_search``; Gemini ``write_file``, ...).
  Either kind of tool call answers ``fallback_text`` when no such tool was offered (a side request).
  Tools loaded by a Codex client-side tool search (``tool_search_output``) count as offered.
- ``{"per_dialect": {"anthropic": STEP, "responses": STEP, "chat": STEP, "gemini": STEP,
  "default": STEP}}``.
- ``{"hang": true}``: hold the request until the client goes away or the server stops.
- ``{"error": {"status": 400, "message": "..."}}``: that HTTP status with the dialect's error body.
- ``hang`` and ``error`` steps take an optional ``"times": N``: after being served N times the step
  is dropped from the script (so a session resumed after an interrupt gets past it).

Past the last step: the last step again if it is a text step, else ``fallback_text``.

Model turns that a CLI writes itself after an interrupt (Claude "No response requested.", Gemini
"[The previous response was interrupted before it completed.]") are not counted, so on every CLI a
session resumed after an interrupt asks for the interrupted step again; give that ``hang`` step
``"times": 1`` to get past it.

Gemini JSON-mode requests (``generationConfig.responseMimeType == "application/json"``: the
``auto`` model router and other side calls) are always answered at once with an object shaped by
the request's ``responseJsonSchema``/``responseSchema``, whatever the script says.

Every request is appended to ``requests`` (and to ``log_path`` as a JSON line):
``{"method", "path", "dialect", "script", "step", "body", "answer"}``; ``answer`` says what was sent
(``{"kind": "text"|"tool"|"error"|"hang"|"json", ...}``). ``held`` / ``wait_held()`` tell a test
when a request is being held by a ``hang`` step (e.g. before it signals the CLI).

Standalone (prints the port, runs until SIGINT/SIGTERM)::

    python tests/fakemodel.py --scripts FILE.json [--default NAME] [--port-file F] [--log F]

FILE.json is either ``{"NAME": SCRIPT, ...}`` or ``{"scripts": {...}, "default": "NAME"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import select
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MARKER_RE = re.compile(r"\[\[fake:([A-Za-z0-9_.:\-]+)\]\]")
NO_SCRIPT_TEXT = "FAKE-MODEL: no script"
END_OF_SCRIPT_TEXT = "FAKE-MODEL: end of script"
USAGE_IN, USAGE_OUT = 10, 5
# Of each request's input, tokens read from the provider's prompt cache; of its output, the model's
# reasoning ("thinking") tokens. Non-zero so tests see where each CLI reports them.
USAGE_CACHED, USAGE_REASONING = 3, 2

# Texts the CLIs put into the history themselves: after an interrupt, Claude Code adds an assistant
# "No response requested." and Gemini CLI a model "[The previous response was interrupted ...]" turn
# (Codex adds only a <turn_aborted> user message). They are not model turns, so a resumed session
# continues at the interrupted step on every CLI.
SYNTHETIC_MODEL_TEXTS = frozenset(
    {"No response requested.", "[The previous response was interrupted before it completed.]"}
)
# Context blocks the CLIs send as user text; they are never the user's own words.
CONTEXT_PREFIXES = (
    "<system-reminder>",  # Claude
    "<environment_context>",  # Codex
    "<turn_aborted>",  # Codex
    "<user_instructions>",  # Codex
    "# AGENTS.md",  # Codex
    "<session_context>",  # Gemini
    "[Request interrupted by user",  # Claude
)

_GEMINI_PATH_RE = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):([A-Za-z]+)$")

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_GEMINI_ERROR_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------------------------
# Reading requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool the client offered in a request."""

    name: str
    namespace: str | None = None
    kind: str = "function"  # "function" | "custom" (Codex freeform) | "tool_search" (Codex)


def _stringify(value: Any) -> str:
    """Text of a tool result: strings as they are, text blocks joined, anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [
            _stringify(v.get("text")) if isinstance(v, dict) and "text" in v else _stringify(v) for v in value
        ]
        return "\n".join(t for t in texts if t)
    if isinstance(value, dict):
        if set(value) <= {"output", "error"} and len(value) == 1:  # Gemini {"output": ...}
            return _stringify(next(iter(value.values())))
        if set(value) == {"content"}:
            return _stringify(value["content"])
    return json.dumps(value, ensure_ascii=False)


def _text_parts(content: Any, text_types: tuple[str, ...]) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    out = []
    for block in content:
        if isinstance(block, str):
            out.append(block)
        elif (
            isinstance(block, dict) and block.get("type") in text_types and isinstance(block.get("text"), str)
        ):
            out.append(block["text"])
    return out


def _is_context(text: str) -> bool:
    return text.lstrip().startswith(CONTEXT_PREFIXES)


def _user_text(content: Any, text_types: tuple[str, ...]) -> str:
    """The user's own text in a message's content, without the CLIs' context blocks."""
    return "\n".join(t for t in _text_parts(content, text_types) if not _is_context(t))


class _Dialect:
    """What a dialect needs to read from a request. Subclasses fill it in."""

    name = ""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def user_texts(self) -> list[str]:
        """Texts of the user messages (not tool results), in history order."""
        raise NotImplementedError

    def cwd(self) -> str:
        """The agent's working directory, as the CLI told the model (Claude: "Primary working
        directory: ...", Codex: <cwd>...</cwd>, Gemini: the first "Workspace Directories" entry)."""
        text = json.dumps(self.body)
        for pattern in CWD_PATTERNS:
            if match := re.search(pattern, text):
                return match.group(1)
        return ""

    def model_turns(self) -> int:
        raise NotImplementedError

    def last_tool_result(self) -> str:
        raise NotImplementedError

    def tools(self) -> list[Tool]:
        raise NotImplementedError

    def last_user(self) -> str:
        texts = self.user_texts()
        return texts[-1] if texts else ""


class _Anthropic(_Dialect):
    name = "anthropic"

    def _messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages")
        return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []

    def user_texts(self) -> list[str]:
        out = []
        for m in self._messages():
            if m.get("role") != "user":
                continue
            text = _user_text(m.get("content"), ("text",))
            if text:
                out.append(text)
        return out

    def model_turns(self) -> int:
        return sum(
            1
            for m in self._messages()
            if m.get("role") == "assistant"
            and "".join(_text_parts(m.get("content"), ("text",))) not in SYNTHETIC_MODEL_TEXTS
        )

    def last_tool_result(self) -> str:
        for m in reversed(self._messages()):
            content = m.get("content")
            if m.get("role") != "user" or not isinstance(content, list):
                continue
            for block in reversed(content):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    return _stringify(block.get("content"))
        return ""

    def tools(self) -> list[Tool]:
        tools = self.body.get("tools")
        if not isinstance(tools, list):
            return []
        # After a ToolSearch, Claude lists the loaded tool with defer_loading:true; it is callable.
        return [Tool(t["name"]) for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]


class _Responses(_Dialect):
    name = "responses"
    TURN_ITEMS = ("function_call", "custom_tool_call", "tool_search_call", "local_shell_call")
    OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")

    def _items(self) -> list[dict[str, Any]]:
        items = self.body.get("input")
        if isinstance(items, str):
            return [{"type": "message", "role": "user", "content": items}]
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def user_texts(self) -> list[str]:
        out = []
        for item in self._items():
            if item.get("type", "message") == "message" and item.get("role") == "user":
                text = _user_text(item.get("content"), ("input_text", "text"))
                if text:
                    out.append(text)
        return out

    def model_turns(self) -> int:
        n = 0
        for item in self._items():
            kind = item.get("type", "message")
            if kind in self.TURN_ITEMS or (kind == "message" and item.get("role") == "assistant"):
                n += 1
        return n

    def last_tool_result(self) -> str:
        for item in reversed(self._items()):
            if item.get("type") in self.OUTPUT_ITEMS:
                return _stringify(item.get("output"))
        return ""

    def tools(self) -> list[Tool]:
        tools = self.body.get("tools")
        out = _responses_tools(tools if isinstance(tools, list) else [])
        for item in self._items():  # tools found by a client-side tool search come back in the input
            if item.get("type") == "tool_search_output" and isinstance(item.get("tools"), list):
                out.extend(_responses_tools(item["tools"]))
        return out


def _responses_tools(tools: list[Any]) -> list[Tool]:
    out: list[Tool] = []
    for t in tools:
        if not isinstance(t, dict):
            continue
        kind = t.get("type")
        if kind == "namespace" and isinstance(t.get("tools"), list):
            out.extend(
                Tool(sub["name"], t.get("name"), sub.get("type", "function"))
                for sub in t["tools"]
                if isinstance(sub, dict) and isinstance(sub.get("name"), str)
            )
        elif kind == "tool_search":
            out.append(Tool("tool_search", None, "tool_search"))
        elif kind in ("function", "custom") and isinstance(t.get("name"), str):
            out.append(Tool(t["name"], None, kind))
    return out


class _Chat(_Dialect):
    name = "chat"

    def _messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages")
        return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []

    def user_texts(self) -> list[str]:
        out = []
        for m in self._messages():
            if m.get("role") == "user":
                text = _user_text(m.get("content"), ("text",))
                if text:
                    out.append(text)
        return out

    def model_turns(self) -> int:
        return sum(1 for m in self._messages() if m.get("role") == "assistant")

    def last_tool_result(self) -> str:
        for m in reversed(self._messages()):
            if m.get("role") == "tool":
                return _stringify(m.get("content"))
        return ""

    def tools(self) -> list[Tool]:
        tools = self.body.get("tools")
        out = []
        for t in tools if isinstance(tools, list) else []:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                out.append(Tool(fn["name"]))
        return out


class _Gemini(_Dialect):
    name = "gemini"

    def _contents(self) -> list[dict[str, Any]]:
        contents = self.body.get("contents")
        return [c for c in contents if isinstance(c, dict)] if isinstance(contents, list) else []

    @staticmethod
    def _parts(content: dict[str, Any]) -> list[dict[str, Any]]:
        parts = content.get("parts")
        return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []

    def user_texts(self) -> list[str]:
        out = []
        for c in self._contents():
            if c.get("role", "user") != "user":
                continue
            parts = self._parts(c)
            if any("functionResponse" in p for p in parts):
                continue
            texts = [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]
            text = "\n".join(t for t in texts if not _is_context(t))
            if text:
                out.append(text)
        return out

    def model_turns(self) -> int:
        n = 0
        for c in self._contents():
            if c.get("role") != "model":
                continue
            texts = [p.get("text") for p in self._parts(c)]
            synthetic = all(isinstance(t, str) for t in texts) and "".join(texts) in SYNTHETIC_MODEL_TEXTS
            n += 0 if synthetic else 1
        return n

    def last_tool_result(self) -> str:
        for c in reversed(self._contents()):
            for p in reversed(self._parts(c)):
                fr = p.get("functionResponse")
                if isinstance(fr, dict):
                    return _stringify(fr.get("response"))
        return ""

    def tools(self) -> list[Tool]:
        tools = self.body.get("tools")
        out = []
        for t in tools if isinstance(tools, list) else []:
            decls = t.get("functionDeclarations") if isinstance(t, dict) else None
            for d in decls if isinstance(decls, list) else []:
                if isinstance(d, dict) and isinstance(d.get("name"), str):
                    out.append(Tool(d["name"]))
        return out

    def json_schema(self) -> dict[str, Any] | None:
        """The response schema when this is a JSON-mode request (router and other side calls)."""
        config = self.body.get("generationConfig")
        if not isinstance(config, dict) or config.get("responseMimeType") != "application/json":
            return None
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        return schema if isinstance(schema, dict) else {}


def fill_schema(schema: Any, name: str = "") -> Any:
    """A plausible value for a JSON schema (also Gemini's upper-case ``responseSchema`` types)."""
    if not isinstance(schema, dict):
        return "fake"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        # Gemini's next-speaker check offers ["user", "model"]: "model" would loop the CLI.
        return "user" if "user" in enum else enum[0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [
                o for o in options if not (isinstance(o, dict) and str(o.get("type")).lower() == "null")
            ]
            return fill_schema((non_null or options)[0], name)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), "string")
    kind = str(kind).lower() if kind else ("object" if "properties" in schema else "string")
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else list(props)
        return {k: fill_schema(props.get(k, {}), k) for k in required}
    if kind == "array":
        count = schema.get("minItems") or 0
        return [fill_schema(schema.get("items", {}), name) for _ in range(int(count))]
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        value = low if isinstance(low, (int, float)) else 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    return f"FAKE-MODEL: {name}" if name else "FAKE-MODEL"


# --------------------------------------------------------------------------------------------
# Choosing the answer
# --------------------------------------------------------------------------------------------


@dataclass
class _Answer:
    kind: str  # "text" | "tool" | "hang" | "error" | "json"
    text: str = ""
    tool: Tool | None = None
    arguments: Any = None
    status: int = 200
    error_type: str | None = None
    value: Any = None

    def summary(self) -> dict[str, Any]:
        """What was answered, for the request log."""
        if self.kind == "tool":
            assert self.tool is not None
            name = f"{self.tool.namespace}.{self.tool.name}" if self.tool.namespace else self.tool.name
            return {"kind": "tool", "tool": name, "arguments": self.arguments}
        if self.kind == "error":
            return {"kind": "error", "status": self.status, "message": self.text}
        if self.kind == "json":
            return {"kind": "json", "value": self.value}
        if self.kind == "hang":
            return {"kind": "hang"}
        return {"kind": "text", "text": self.text}


CWD_PATTERNS = (
    r"Primary working directory: ([^\s\\]+)",
    r"<cwd>([^<]+)</cwd>",
    r"Workspace Directories:\*\*(?:\\n|\s)*- ([^\s\\]+)",
)
FIELD_RE = re.compile(r"\{tool_result\.([A-Za-z_][A-Za-z0-9_]*)\}")


def field_of(text: str, name: str) -> str:
    """A string field of the JSON inside a tool result, however the CLI wrapped or escaped it
    (Codex prefixes "Wall time ... Output:", Claude may pass the JSON as an escaped string)."""
    match = re.search(r'\\*"' + re.escape(name) + r'\\*"\s*:\s*\\*"([^"\\]*)', text)
    return match.group(1) if match else ""


def _fill(value: Any, subs: dict[str, str]) -> Any:
    if isinstance(value, str):
        tool_result = subs.get("{tool_result}", "")
        value = FIELD_RE.sub(lambda m: field_of(tool_result, m.group(1)), value)
        for key, sub in subs.items():
            value = value.replace(key, sub)
        return value
    if isinstance(value, list):
        return [_fill(v, subs) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, subs) for k, v in value.items()}
    return value


def _resolve_tool(spec: dict[str, Any], offered: list[Tool]) -> Tool | None:
    name = spec.get("name")
    if isinstance(name, str):
        for t in offered:
            if t.name == name and t.namespace is None:
                return t
        for t in offered:
            if t.name == name or (t.namespace and f"{t.namespace}.{t.name}" == name):
                return t
        return None
    tool, server = spec.get("tool"), spec.get("server", "")
    if not isinstance(tool, str) or not isinstance(server, str):
        return None
    exact = (f"mcp__{server}__{tool}", f"mcp_{server}_{tool}")
    for t in offered:  # the usual spellings first
        if (t.namespace is None and t.name in exact) or (
            t.namespace in (f"mcp__{server}", server) and t.name == tool
        ):
            return t
    for t in offered:
        if t.namespace is not None and server in t.namespace and t.name.endswith(tool):
            return t
        if t.namespace is None and t.name.endswith(tool) and server in t.name[: -len(tool)]:
            return t
    return None


def _step_kind(step: Any) -> str:
    if isinstance(step, dict):
        for kind in ("text", "tool_call", "hang", "error", "per_dialect"):
            if kind in step:
                return kind
    return "invalid"


# --------------------------------------------------------------------------------------------
# Writing responses
# --------------------------------------------------------------------------------------------


def _sse(events: list[tuple[str | None, Any]]) -> bytes:
    chunks = []
    for event, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        chunks.append((f"event: {event}\n" if event else "") + f"data: {payload}\n\n")
    return "".join(chunks).encode()


def _error_body(dialect: str, status: int, message: str, error_type: str | None) -> dict[str, Any]:
    if dialect == "anthropic":
        kind = error_type or _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if dialect == "gemini":
        return {
            "error": {
                "code": status,
                "message": message,
                "status": _GEMINI_ERROR_STATUS.get(status, "UNKNOWN"),
            }
        }
    kind = error_type or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _render_anthropic(answer: _Answer, body: dict[str, Any]) -> tuple[str, bytes]:
    model = body.get("model", "fake-model")
    msg_id = _new_id("msg_fake_")
    if answer.kind == "tool":
        assert answer.tool is not None
        args = answer.arguments if isinstance(answer.arguments, dict) else {}
        block: dict[str, Any] = {"type": "tool_use", "id": _new_id("toolu_fake_"), "name": answer.tool.name}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
        full_block = {**block, "input": args}
        block["input"] = {}
        stop = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": answer.text}
        full_block = {"type": "text", "text": answer.text}
        stop = "end_turn"
    # Anthropic's input_tokens excludes cache reads, which are their own count.
    usage = {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT, "cache_read_input_tokens": USAGE_CACHED}
    message = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [full_block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return "application/json", json.dumps(message).encode()
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": USAGE_IN, "output_tokens": 1},
    }
    return "text/event-stream", _sse(
        [
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": USAGE_OUT, "cache_read_input_tokens": USAGE_CACHED},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )


def _render_responses(answer: _Answer, body: dict[str, Any]) -> tuple[str, bytes]:
    resp_id = _new_id("resp_fake_")
    item: dict[str, Any]
    if answer.kind == "tool":
        assert answer.tool is not None
        tool, args, call_id = answer.tool, answer.arguments, _new_id("call_fake_")
        if tool.kind == "custom":
            text = args.get("input", "") if isinstance(args, dict) else args
            item = {"type": "custom_tool_call", "id": _new_id("ctc_fake_"), "call_id": call_id}
            item.update(
                name=tool.name, input=text if isinstance(text, str) else json.dumps(text), status="completed"
            )
        elif tool.kind == "tool_search":
            item = {"type": "tool_search_call", "id": _new_id("ts_fake_"), "call_id": call_id}
            item.update(
                execution="client", arguments=args if isinstance(args, dict) else {}, status="completed"
            )
        else:
            item = {"type": "function_call", "id": _new_id("fc_fake_"), "call_id": call_id, "name": tool.name}
            if tool.namespace:
                item["namespace"] = tool.namespace
            item["arguments"] = (
                args if isinstance(args, str) else json.dumps(args if args is not None else {})
            )
            item["status"] = "completed"
    else:
        item = {
            "type": "message",
            "id": _new_id("msg_fake_"),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer.text, "annotations": []}],
        }
    usage = {
        "input_tokens": USAGE_IN,
        "input_tokens_details": {"cached_tokens": USAGE_CACHED},  # part of input_tokens
        "output_tokens": USAGE_OUT,
        "output_tokens_details": {"reasoning_tokens": USAGE_REASONING},  # part of output_tokens
        "total_tokens": USAGE_IN + USAGE_OUT,
    }
    base = {"id": resp_id, "object": "response", "created_at": int(time.time()), "model": body.get("model")}
    done = {**base, "status": "completed", "output": [item], "usage": usage}
    if not body.get("stream"):
        return "application/json", json.dumps(done).encode()
    events: list[tuple[str | None, Any]] = [
        (
            "response.created",
            {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}},
        ),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
    ]
    if item["type"] == "message":
        delta = {"type": "response.output_text.delta", "item_id": item["id"], "output_index": 0}
        events.append(("response.output_text.delta", {**delta, "content_index": 0, "delta": answer.text}))
    events += [
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]
    return "text/event-stream", _sse(events)


def _render_chat(answer: _Answer, body: dict[str, Any]) -> tuple[str, bytes]:
    base = {
        "id": _new_id("chatcmpl-fake"),
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
    }
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if answer.kind == "tool":
        assert answer.tool is not None
        args = answer.arguments if isinstance(answer.arguments, str) else json.dumps(answer.arguments or {})
        call = {
            "id": _new_id("call_fake_"),
            "type": "function",
            "function": {"name": answer.tool.name, "arguments": args},
        }
        message["tool_calls"] = [call]
        finish = "tool_calls"
    else:
        message["content"] = answer.text
        finish = "stop"
    usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT, "total_tokens": USAGE_IN + USAGE_OUT}
    if not body.get("stream"):
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return "application/json", json.dumps(
            {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        ).encode()
    delta = dict(message)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": 0, **c} for c in delta["tool_calls"]]
    chunk = {**base, "object": "chat.completion.chunk"}
    return "text/event-stream", _sse(
        [
            (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            (
                None,
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage},
            ),
            (None, "[DONE]"),
        ]
    )


def _render_gemini(answer: _Answer, body: dict[str, Any], model: str, stream: bool) -> tuple[str, bytes]:
    if answer.kind == "tool":
        assert answer.tool is not None
        args = answer.arguments if isinstance(answer.arguments, dict) else {}
        parts: list[dict[str, Any]] = [{"functionCall": {"name": answer.tool.name, "args": args}}]
    elif answer.kind == "json":
        parts = [{"text": json.dumps(answer.value)}]
    else:
        parts = [{"text": answer.text}]
    reply = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {
            "promptTokenCount": USAGE_IN,
            "candidatesTokenCount": USAGE_OUT,
            "cachedContentTokenCount": USAGE_CACHED,  # part of promptTokenCount
            "thoughtsTokenCount": USAGE_REASONING,  # not part of candidatesTokenCount
            "totalTokenCount": USAGE_IN + USAGE_OUT + USAGE_REASONING,
        },
        "modelVersion": model,
        "responseId": _new_id("fake-"),
    }
    if stream:
        return "text/event-stream", _sse([(None, reply)])
    return "application/json", json.dumps(reply).encode()


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    fake: FakeModel


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.fake._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw:
            return None
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            import gzip  # noqa: PLC0415 - rare

            raw = gzip.decompress(raw)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
            path = self.path.split("?", 1)[0]
            self.server.fake._handle(self, self.command, path, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def send_bytes(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def send_json(self, status: int, value: Any) -> None:
        self.send_bytes(status, "application/json", json.dumps(value).encode())


class FakeModel:
    """A scripted model server on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self, scripts: dict[str, dict[str, Any]], *, default: str | None = None, log_path: Path | None = None
    ) -> None:
        self.scripts = scripts
        self.default = default
        # Values a test learns only once servers run (an environment id, say): `{var:NAME}`.
        self.variables: dict[str, str] = {}
        self.log_path = Path(log_path) if log_path else None
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._served: dict[tuple[str, int], int] = {}
        self._held = 0
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeModel:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:  # held requests see _stopping within one poll and let go
            self._lock.wait_for(lambda: self._held == 0, timeout=2)
            conns = list(self._connections)
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for conn in conns:  # idle keep-alive connections would otherwise keep their threads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inspection -------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """How many requests are being held by a ``hang`` step right now."""
        with self._lock:
            return self._held

    def wait_held(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until at least ``count`` requests are being held by a ``hang`` step."""
        with self._lock:
            return self._lock.wait_for(lambda: self._held >= count, timeout=timeout)

    def wait_released(self, timeout: float = 10.0) -> bool:
        """Wait until no request is held any more (every client that hung gave up)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._held == 0, timeout=timeout)

    # -- internals --------------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")

    def _script_name(self, dialect: _Dialect) -> str | None:
        for text in dialect.user_texts():
            match = MARKER_RE.search(text)
            if match:
                return match.group(1)
        return self.default

    def _choose(self, dialect: _Dialect) -> tuple[str | None, int, _Answer]:
        """Pick the script and step for a request and turn it into an answer."""
        script_name = self._script_name(dialect)
        step_index = dialect.model_turns()
        script = self.scripts.get(script_name) if script_name else None
        if script is None:
            text = NO_SCRIPT_TEXT if script_name is None else f"FAKE-MODEL: unknown script {script_name!r}"
            return script_name, step_index, _Answer("text", text=text)
        fallback = str(script.get("fallback_text", END_OF_SCRIPT_TEXT))
        raw_steps = script.get("steps") or []
        with self._lock:  # steps with "times" drop out once served that often
            steps = [
                (i, s)
                for i, s in enumerate(raw_steps)
                if not (
                    isinstance(s, dict)
                    and "times" in s
                    and self._served.get((script_name, i), 0) >= s["times"]
                )
            ]
        resolved = [(i, self._per_dialect(s, dialect.name)) for i, s in steps]
        if step_index < len(resolved):
            raw_index, step = resolved[step_index]
        elif resolved and _step_kind(resolved[-1][1]) == "text":
            raw_index, step = resolved[-1]
        else:
            return script_name, step_index, _Answer("text", text=fallback)
        with self._lock:
            key = (script_name, raw_index)
            self._served[key] = self._served.get(key, 0) + 1
        return script_name, step_index, self._answer(step, dialect, fallback, dict(self.variables))

    @staticmethod
    def _per_dialect(step: Any, dialect: str) -> Any:
        while _step_kind(step) == "per_dialect":
            options = step["per_dialect"]
            step = options.get(dialect, options.get("default")) if isinstance(options, dict) else None
        return step

    @staticmethod
    def _answer(step: Any, dialect: _Dialect, fallback: str, variables: dict[str, str]) -> _Answer:
        kind = _step_kind(step)
        subs = {
            "{tool_result}": dialect.last_tool_result(),
            "{last_user}": dialect.last_user(),
            "{cwd}": dialect.cwd(),
        }
        subs.update({f"{{var:{name}}}": value for name, value in variables.items()})
        if kind == "text":
            return _Answer("text", text=_fill(str(step["text"]), subs))
        if kind == "hang":
            return _Answer("hang")
        if kind == "error":
            err = step["error"] if isinstance(step["error"], dict) else {}
            return _Answer(
                "error",
                text=str(err.get("message", "FAKE-MODEL: scripted error")),
                status=int(err.get("status", 400)),
                error_type=err.get("type"),
            )
        if kind == "tool_call":
            spec = step["tool_call"] if isinstance(step["tool_call"], dict) else {}
            tool = _resolve_tool(spec, dialect.tools())
            if tool is None:
                return _Answer("text", text=fallback)
            return _Answer("tool", tool=tool, arguments=_fill(spec.get("arguments", {}), subs))
        return _Answer("text", text=fallback)  # a per_dialect step without this dialect, or junk

    def _handle(self, handler: _Handler, method: str, path: str, body: Any) -> None:
        entry: dict[str, Any] = {
            "method": method,
            "path": path,
            "dialect": None,
            "script": None,
            "step": None,
        }
        entry.update(body=body, answer=None)
        data = body if isinstance(body, dict) else {}
        dialect: _Dialect | None = None
        gemini_model, gemini_method = "", ""
        if method == "POST" and path == "/v1/messages/count_tokens":
            entry["dialect"] = "anthropic"
            self._log(entry)
            handler.send_json(200, {"input_tokens": USAGE_IN})
            return
        if method == "POST" and path == "/v1/messages":
            dialect = _Anthropic(data)
        elif method == "POST" and path == "/v1/responses":
            dialect = _Responses(data)
        elif method == "POST" and path == "/v1/chat/completions":
            dialect = _Chat(data)
        elif method == "POST" and (m := _GEMINI_PATH_RE.match(path)):
            gemini_model, gemini_method = m.group(1), m.group(2)
            if gemini_method == "countTokens":
                entry["dialect"] = "gemini"
                self._log(entry)
                handler.send_json(200, {"totalTokens": USAGE_IN})
                return
            if gemini_method in ("generateContent", "streamGenerateContent"):
                dialect = _Gemini(data)
        if dialect is None:
            self._log(entry)
            handler.send_json(
                404, {"error": {"message": f"fake model: no route for {method} {path}", "code": 404}}
            )
            return

        entry["dialect"] = dialect.name
        schema = dialect.json_schema() if isinstance(dialect, _Gemini) else None
        if schema is not None:  # Gemini router / side calls: always answer, never hang
            entry["script"], entry["step"] = self._script_name(dialect), dialect.model_turns()
            answer = _Answer("json", value=fill_schema(schema))
        else:
            entry["script"], entry["step"], answer = self._choose(dialect)
        entry["answer"] = answer.summary()
        self._log(entry)

        if answer.kind == "hang":
            self._hold(handler)
            return
        if answer.kind == "error":
            handler.send_json(
                answer.status, _error_body(dialect.name, answer.status, answer.text, answer.error_type)
            )
            return
        if isinstance(dialect, _Anthropic):
            content_type, payload = _render_anthropic(answer, data)
        elif isinstance(dialect, _Responses):
            content_type, payload = _render_responses(answer, data)
        elif isinstance(dialect, _Chat):
            content_type, payload = _render_chat(answer, data)
        else:
            stream = gemini_method == "streamGenerateContent"
            content_type, payload = _render_gemini(answer, data, gemini_model, stream)
        handler.send_bytes(200, content_type, payload)

    def _hold(self, handler: _Handler) -> None:
        """Answer nothing until the client hangs up or the server stops."""
        conn = handler.connection
        handler.close_connection = True
        with self._lock:
            self._held += 1
            self._lock.notify_all()
        try:
            while not self._stopping.wait(0.05):
                readable, _, _ = select.select([conn], [], [], 0)
                if readable:
                    try:
                        if not conn.recv(1, socket.MSG_PEEK):
                            return  # the client closed the connection
                    except OSError:
                        return
        finally:
            with self._lock:
                self._held -= 1
                self._lock.notify_all()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the scripted fake model server.")
    parser.add_argument("--scripts", type=Path, required=True, help="JSON file with the scripts")
    parser.add_argument("--default", help="script used when a request has no [[fake:NAME]] marker")
    parser.add_argument("--port-file", type=Path, help="write the port here once listening")
    parser.add_argument("--log", type=Path, help="append every request as a JSON line here")
    args = parser.parse_args(argv)
    loaded = json.loads(args.scripts.read_text())
    if isinstance(loaded.get("scripts"), dict):
        scripts, default = loaded["scripts"], loaded.get("default")
    else:
        scripts, default = loaded, None
    fake = FakeModel(scripts, default=args.default or default, log_path=args.log).start()
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(str(fake.port))
        tmp.replace(args.port_file)
    print(fake.port, flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    fake.stop()


if __name__ == "__main__":
    main()
