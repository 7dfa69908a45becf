"""`peerd mcp`: a stdio MCP server an agent CLI launches; a thin bridge to the daemon's own MCP endpoint.

The daemon serves peerd's tools over MCP streamable HTTP at `/mcp` (`peerd.api.mcp_http`). This
process only carries JSON-RPC lines: each line from stdin is POSTed to `/mcp` on the daemon's Unix
socket and the answer is written to stdout as one line; a notification gets no answer. It owns no
state, so agents may start and kill it freely, and it imports only the standard library (no MCP
SDK, no aiohttp, no asyncio): its tools are listed a few tens of milliseconds after it starts.
Requests are carried concurrently (a thread each; a 45 s wait does not hold up a second call),
`initialize` first and alone. stdout is the JSON-RPC channel; diagnostics go to stderr.

Identity: when peerd started the agent, this process's environment carries the run's token
(`PEERD_RUN_TOKEN`, or `PEERD_RUN_TOKEN_FILE` naming a 0600 file, which keeps the token out of the
agent CLI's own argv), and every call acts as that run (sent as `Authorization: Bearer`, on the
socket in `PEERD_SOCKET`). Without one it acts as the socket's owner, for agents peerd did not
start (the owner socket, `PEERD_HOME`'s `peerd.sock`). A token file that is gone means the run
ended: the bridge then never calls the daemon at all, so it cannot fall back to the owner.

Both MCP revisions pass through, negotiated per message as the daemon does: a handshake-era
client (`initialize`, up to 2025-11-25) gets `MCP-Protocol-Version` from the version its
`initialize` agreed; a 2026-07-28 client sends no handshake and carries its version, client info
and capabilities in every request's `params._meta`, and each POST gets the routing headers that
revision asks of an HTTP client (`routing_headers`: `MCP-Protocol-Version` from `_meta`,
`Mcp-Method`, and `Mcp-Name` for the methods that name something), which the daemon checks against
the body.

When the daemon cannot be asked (not running, the run ended, it refused the token), `initialize`
and `server/discover` are answered here, so the agent connects and each tool call says why in a
sentence starting with the stable code (`daemon_unavailable: peerd is not running ...`) as an MCP
tool error.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
from pathlib import Path

from peerd import __version__
from peerd.errors import CapabilityDenied, DaemonNotRunning, ParentNotActive, PeerdError, TimedOut

TYPE_CHECKING = False  # `typing` costs a few ms of this process's start-up; the names are for mypy
if TYPE_CHECKING:
    from typing import IO, Any

SERVER_NAME = "peerd"
INSTRUCTIONS = """\
peerd links the machines coding agents run on. Use delegate_task to hand work to another agent
(another provider or model here, or a linked machine from environment_list); you are woken with
the result in a new turn. Use task_status to check on a task, task_cancel to stop it. After
opening a pull request, wait_for_github waits for its checks or review without spending a turn.
Parameters shared by the tools: environmentId names a linked machine (its id or label from
environment_list; leave it out for this machine); clientRequestId is any string of yours that makes
a retry return the first call's result instead of acting twice; threadId comes from thread_launch."""

# A tool call never waits longer than the daemon's own caps (45 s) plus slack for the socket.
CALL_TIMEOUT_S = 75.0
MCP_PATH = "/mcp"
# What `initialize` answers when the daemon cannot be asked: the newest handshake revision, or the
# client's own when it is one of these.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
# The stateless revisions: no handshake; the envelope rides in every request's `params._meta`.
MODERN_VERSIONS = ("2026-07-28",)
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
# The params key each method names its object by, sent as `Mcp-Name` (2026-07-28's routing
# header; the Tasks extension names its task).
NAME_PARAMS = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
INTERNAL_ERROR = -32603
PARSE_ERROR = -32700


class ProxyConfig:
    """Where the daemon is and who this process acts as (plain class: no dataclasses import)."""

    __slots__ = ("socket", "token", "token_error")

    def __init__(self, socket: Path, token: str | None, token_error: str | None = None) -> None:
        self.socket = socket
        self.token = token
        # Set when this process was bound to a run whose token is gone (the run ended): it must
        # not fall back to acting as the owner.
        self.token_error = token_error

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ProxyConfig:
        env = dict(os.environ) if env is None else env
        socket_path = env.get("PEERD_SOCKET")
        if not socket_path:  # the owner socket of PEERD_HOME (or the default home)
            from peerd.paths import Paths, resolve_home  # noqa: PLC0415  # only here: it imports tempfile

            socket_path = str(Paths(resolve_home(env.get("PEERD_HOME"))).socket)
        token = env.get("PEERD_RUN_TOKEN") or None
        token_file = env.get("PEERD_RUN_TOKEN_FILE")
        if token is None and token_file:
            try:
                from_file = Path(token_file).read_text(encoding="utf-8").strip()
            except OSError:
                from_file = ""
            if not from_file:
                ended = "The run these tools were bound to has ended; they no longer act. Start a new run."
                return cls(socket=Path(socket_path), token=None, token_error=ended)
            token = from_file
        return cls(socket=Path(socket_path), token=token)


def header_value(value: str) -> str:
    """A header-safe form of `value`: as is when it is plain printable ASCII without edge spaces,
    else the revision's `=?base64?...?=` form."""
    if (
        value.isascii()
        and value.isprintable()
        and value == value.strip()
        and not value.startswith("=?base64?")
    ):
        return value
    import base64  # noqa: PLC0415  # rare: names outside plain ASCII

    return f"=?base64?{base64.b64encode(value.encode()).decode('ascii')}?="


def routing_headers(message: object) -> dict[str, str]:
    """The headers a 2026-07-28 request carries over HTTP (none for other messages): its version
    from `params._meta`, its method, and the name it acts on."""
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return {}
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(version, str) or not version.isascii() or not version.isprintable():
        return {}
    method = message["method"]
    headers = {"MCP-Protocol-Version": version, "Mcp-Method": header_value(method)}
    key = NAME_PARAMS.get(method)
    name = params.get(key) if key is not None and isinstance(params, dict) else None
    if isinstance(name, str):
        headers["Mcp-Name"] = header_value(name)
    return headers


class Answer:
    __slots__ = ("body", "kind", "status")

    def __init__(self, status: int, kind: str, body: bytes) -> None:
        self.status, self.kind, self.body = status, kind, body


class BadAnswer(Exception):
    """The daemon's answer was not HTTP this bridge understands."""


def http_post(path: Path, target: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """One HTTP/1.1 POST on a Unix socket, `Connection: close`, the answer read to its end.

    A few lines instead of `http.client`, whose import (email, ssl) would be half of this
    process's start-up; the daemon's answers are plain: a status line, headers, a sized body."""
    lines = [
        f"POST {target} HTTP/1.1",
        "Host: localhost",
        "Connection: close",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return parse_answer(b"".join(chunks))


def parse_answer(raw: bytes) -> Answer:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise BadAnswer("the answer is not HTTP")
    fields = {}
    for header in header_lines:
        name, _, value = header.partition(":")
        fields[name.strip().lower()] = value.strip()
    if fields.get("transfer-encoding", "").lower() == "chunked":
        rest = dechunk(rest)
    elif fields.get("content-length", "").isdigit():
        rest = rest[: int(fields["content-length"])]
    return Answer(int(parts[1]), fields.get("content-type", ""), rest)


def dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    at = 0
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            raise BadAnswer("a chunked answer ended early")
        size = int(data[at:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2 : end + 2 + size])
        at = end + 2 + size + 2


class Refused(Exception):
    """The daemon could not be asked, or refused: a stable code and a sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _sse_messages(body: bytes) -> list[bytes]:
    """The JSON messages of an event stream (the daemon answers JSON; this is for robustness)."""
    messages, data = [], []
    for raw in [*body.splitlines(), b""]:
        if raw.startswith(b"data:"):
            data.append(raw[5:].strip())
        elif not raw.strip() and data:
            messages.append(b"\n".join(data))
            data = []
    return messages


class Bridge:
    """JSON-RPC lines in, the daemon's answers out (see the module docstring)."""

    def __init__(self, config: ProxyConfig, out: IO[bytes]) -> None:
        self.config = config
        self._out = out
        self._write_lock = threading.Lock()
        self._protocol_version: str | None = None

    # -- the wire --------------------------------------------------------------------------------

    def post(self, raw: bytes, message: object = None) -> list[bytes]:
        """POST one message to the daemon's `/mcp`; the messages it answered (none for a notification)."""
        if self.config.token_error is not None:
            raise Refused(ParentNotActive.code, self.config.token_error)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.config.token:
            if not self.config.token.isascii() or not self.config.token.isprintable():
                raise Refused(
                    CapabilityDenied.code, "The run token in this process's environment is malformed."
                )
            headers["Authorization"] = f"Bearer {self.config.token}"
        modern = routing_headers(message)
        if modern:
            headers.update(modern)  # this request's own revision, whatever a handshake said
        elif self._protocol_version:
            headers["MCP-Protocol-Version"] = self._protocol_version
        try:
            answer = http_post(self.config.socket, MCP_PATH, raw, headers, CALL_TIMEOUT_S)
        except TimeoutError:
            raise Refused(TimedOut.code, f"peerd did not answer within {CALL_TIMEOUT_S:.0f} s.") from None
        except (FileNotFoundError, ConnectionRefusedError):
            raise Refused(
                DaemonNotRunning.code,
                f"peerd is not running (nothing answers at {self.config.socket}); start it with `peerd serve`.",
            ) from None
        except (OSError, BadAnswer, ValueError) as exc:
            raise Refused(DaemonNotRunning.code, f"Talking to peerd failed: {exc}.") from None
        status, kind, body = answer.status, answer.kind, answer.body
        if status in (202, 204) or (status < 300 and not body.strip()):
            return []
        if status < 300 and "text/event-stream" in kind:
            return _sse_messages(body)
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("jsonrpc") == "2.0":
            return [_line(data)]  # the MCP server's own answer (an error too), as it gave it
        if isinstance(data, dict) and "code" in data and "message" in data:
            raise Refused(str(data["code"]), str(data["message"]))
        raise Refused(PeerdError.code, f"peerd answered HTTP {status}.")

    # -- one message -----------------------------------------------------------------------------

    def answer(self, raw: bytes, message: object) -> list[bytes]:
        """The lines to write for one line read from stdin (`message`: the line parsed, or None)."""
        if message is None:
            error = {"code": PARSE_ERROR, "message": "Parse error: the line is not JSON."}
            return [_line({"jsonrpc": "2.0", "id": None, "error": error})]
        known = message if isinstance(message, dict) and "method" in message else {}
        try:
            answers = self.post(raw, message)  # a batch or a response too: the server decides
        except Refused as refused:
            return self._local(known, refused)
        if known.get("method") == "initialize":
            self._remember_version(answers)
        return answers

    def _remember_version(self, answers: list[bytes]) -> None:
        for answer in answers:
            try:
                version = json.loads(answer).get("result", {}).get("protocolVersion")
            except (ValueError, AttributeError):
                continue
            if isinstance(version, str):
                self._protocol_version = version

    def _local(self, message: dict[str, Any], refused: Refused) -> list[bytes]:
        """What to answer when the daemon could not be asked (module docstring)."""
        if "id" not in message:
            return []  # a notification (or nothing we could answer)
        method, ident = message.get("method"), message["id"]
        text = f"{refused.code}: {refused.message}"
        if method == "initialize":
            params = message.get("params") or {}
            asked = params.get("protocolVersion") if isinstance(params, dict) else None
            version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
            self._protocol_version = version
            result: dict[str, Any] = {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": __version__},
                "instructions": INSTRUCTIONS,
            }
        elif method == "server/discover":
            result = {
                "supportedVersions": list(MODERN_VERSIONS),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": __version__},
                "instructions": INSTRUCTIONS,
                "resultType": "complete",
            }
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": text}], "isError": True}
            if routing_headers(message):
                result["resultType"] = "complete"
        elif method == "ping":
            result = {}
        else:
            return [
                _line({"jsonrpc": "2.0", "id": ident, "error": {"code": INTERNAL_ERROR, "message": text}})
            ]
        return [_line({"jsonrpc": "2.0", "id": ident, "result": result})]

    # -- the loop --------------------------------------------------------------------------------

    def write(self, lines: list[bytes]) -> None:
        if not lines:
            return
        with self._write_lock:
            for line in lines:
                self._out.write(line.replace(b"\n", b" ") + b"\n")
            self._out.flush()

    def _serve_one(self, raw: bytes, message: object) -> None:
        try:
            self.write(self.answer(raw, message))
        except BrokenPipeError:
            pass  # the agent went away; nothing to tell it
        except Exception as exc:  # never die with a request unanswered
            sys.stderr.write(f"peerd mcp: {type(exc).__name__}: {exc}\n")

    def run(self, lines: IO[bytes]) -> None:
        """Carry every line until stdin closes, then finish the calls in flight."""
        in_flight: list[threading.Thread] = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                message: object = json.loads(raw)
            except ValueError:
                message = None
            if isinstance(message, dict) and message.get("method") == "initialize":
                self._serve_one(raw, message)  # answered before anything after it is read
                continue
            worker = threading.Thread(target=self._serve_one, args=(raw, message), daemon=True)
            worker.start()
            in_flight = [t for t in in_flight if t.is_alive()] + [worker]
        for worker in in_flight:
            worker.join()


def run_stdio(config: ProxyConfig) -> None:
    """`peerd mcp`'s loop on this process's stdin and stdout (returns when stdin closes)."""
    Bridge(config, sys.stdout.buffer).run(sys.stdin.buffer)


def main() -> None:
    """`python -m peerd.mcp_proxy`: the bridge without the CLI around it."""
    with contextlib.suppress(KeyboardInterrupt):
        run_stdio(ProxyConfig.from_env())


if __name__ == "__main__":
    main()
