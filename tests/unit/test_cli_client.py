"""The CLI's standard-library client: requests and answers as bytes (sans-IO), then real Unix
sockets served by small threads for what a misbehaving or absent daemon does."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from peerd.cli.client import LocalClient, ResponseReader, request_bytes
from peerd.clientwire import (
    DaemonConnectionError,
    decode_answer,
    query_string,
    with_environment,
)
from peerd.errors import DaemonNotRunning, PeerdError, ThreadNotFound


def test_query_values_are_percent_encoded_and_none_left_out() -> None:
    query = query_string({"cursor": None, "projectId": "a/b?c=d&e%f g", "all": True, "n": 3, "off": False})
    assert query == "projectId=a%2Fb%3Fc%3Dd%26e%25f%20g&all=true&n=3&off=false"


def test_env_goes_into_the_query_of_a_get_and_the_body_otherwise() -> None:
    assert with_environment("GET", None, {"a": 1}, "env_x") == (None, {"environmentId": "env_x", "a": 1})
    assert with_environment("POST", {"a": 1}, None, "env_x") == ({"environmentId": "env_x", "a": 1}, None)
    assert with_environment("DELETE", None, None, None) == (None, None)


def test_a_request_keeps_the_encoded_path_and_sends_json() -> None:
    raw = request_bytes("POST", "/v1/projects/a%2Fb", body={"x": "é"}, params={"q": "1 2"})
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/projects/a%2Fb?q=1%202 HTTP/1.1"
    assert "Connection: close" in lines and "Content-Type: application/json" in lines
    assert f"Content-Length: {len(body)}" in lines
    assert json.loads(body) == {"x": "é"}
    get = request_bytes("GET", "/v1/status", body=None, params=None).decode()
    assert get.startswith("GET /v1/status HTTP/1.1\r\n") and "Content-Length" not in get
    assert "Content-Length: 0" in request_bytes("POST", "/v1/pair/x/cancel", body=None, params=None).decode()


def test_an_unencoded_path_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(PeerdError, match="not encoded"):
        request_bytes("GET", "/v1/threads/a b", body=None, params=None)


def test_answers_decode_to_json_or_typed_errors() -> None:
    assert decode_answer(200, b'{"a": 1}') == {"a": 1}
    assert decode_answer(200, b"") is None
    with pytest.raises(ThreadNotFound) as found:
        decode_answer(404, b'{"code": "thread_not_found", "message": "No thread thr_x."}')
    assert found.value.message == "No thread thr_x."
    with pytest.raises(PeerdError, match="not JSON \\(HTTP 502\\)"):
        decode_answer(502, b"<html>bad gateway</html>")
    with pytest.raises(PeerdError, match="answered HTTP 500"):
        decode_answer(500, b'["no code"]')


def response(body: bytes, *, status: str = "200 OK", chunked: bool = False) -> bytes:
    if chunked:
        parts = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:3], body[3:]) if p)
        return f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + parts + b"0\r\n\r\n"
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_the_reader_takes_bytes_in_any_pieces() -> None:
    raw = response(b'{"ok": true}')
    reader = ResponseReader()
    done = [reader.feed(raw[i : i + 5]) for i in range(0, len(raw), 5)]
    assert done[-1] and not any(done[:-1])
    assert reader.end() == (200, b'{"ok": true}')
    chunked = ResponseReader()
    assert not chunked.feed(response(b'{"ok": true}', chunked=True))
    assert chunked.end() == (200, b'{"ok": true}')


def test_an_answer_cut_short_is_a_connection_error() -> None:
    for raw in (b"", b"HTTP/1.1 200 OK\r\nContent-Le", response(b'{"ok": true}')[:-3]):
        reader = ResponseReader()
        reader.feed(raw)
        with pytest.raises(DaemonConnectionError):
            reader.end()
    with pytest.raises(PeerdError, match="not HTTP"):
        ResponseReader().feed(b"SSH-2.0-OpenSSH\r\n\r\n")


@contextlib.contextmanager
def serving(path: Path, answer: Callable[[socket.socket], None]) -> Iterator[list[bytes]]:
    """A Unix socket at `path` whose one connection `answer` handles; yields what was received."""
    received: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            received.append(conn.recv(65536))
            answer(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        thread.join(10)
        server.close()


def test_a_call_over_a_real_socket(tmp_path: Path) -> None:
    sock = tmp_path / "d.sock"
    with serving(sock, lambda c: c.sendall(response(b'{"envId": "env_1"}'))) as received:
        assert LocalClient(sock, environment_id="env_b").call("GET", "/v1/status") == {"envId": "env_1"}
    assert received[0].startswith(b"GET /v1/status?environmentId=env_b HTTP/1.1\r\n")


def test_no_daemon_is_daemon_not_running(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on (a crashed daemon's)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    for path in (tmp_path / "missing.sock", stale, tmp_path / "stale.sock" / "under-a-file.sock"):
        with pytest.raises(DaemonNotRunning) as err:
            LocalClient(path).call("GET", "/v1/status")
        assert err.value.socket_path == path


def test_a_daemon_that_hangs_up_or_says_nothing_is_a_connection_error(tmp_path: Path) -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"
    with (
        serving(tmp_path / "a.sock", lambda c: c.sendall(cut)),
        pytest.raises(DaemonConnectionError, match="middle of its answer"),
    ):
        LocalClient(tmp_path / "a.sock").call("GET", "/v1/status")
    release = threading.Event()
    with serving(tmp_path / "b.sock", lambda c: release.wait(10)):
        with pytest.raises(DaemonConnectionError, match=r"did not answer within 0\.2 s"):
            LocalClient(tmp_path / "b.sock", read_timeout=0.2).call("GET", "/v1/status")
        release.set()
