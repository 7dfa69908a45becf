"""The CLI's client for the local daemon: HTTP/1.1 over the Unix socket, typed errors back.

Standard library only (`_socket`, socket.py's C core, and `json`) and synchronous, one connection per call
(`Connection: close`): a command makes a few calls, and importing an HTTP stack costs more than
they do (aiohttp ~0.5 s, `http.client` ~25 ms against a 120 ms start-up budget). Code that runs
inside an event loop (the tests' in-process daemons, the benches, `peerd doctor`) uses the asyncio
twin `peerd.api.localclient.LocalClient`; both shape requests and read answers with the functions
of `peerd/clientwire.py`, which says the rules they share.
"""

from __future__ import annotations

import _socket  # socket.py's C core: socket.py itself (enums, selectors) costs ~3 ms more
import contextlib
import json
from pathlib import Path
from typing import Any

from peerd.clientwire import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    DaemonConnectionError,
    decode_answer,
    query_string,
    with_environment,
)
from peerd.errors import DaemonNotRunning, PeerdError

_RECV_BYTES = 65536


def request_bytes(
    method: str, path: str, *, body: dict[str, Any] | None, params: dict[str, Any] | None
) -> bytes:
    """One HTTP/1.1 request. `path` is already encoded: it is sent as is, never re-quoted."""
    query = query_string(params)
    target = f"{path}?{query}" if query else path
    if any(ch in target for ch in " \r\n"):
        raise PeerdError(f"The request path {target!r} is not encoded; this is a bug in the CLI.")
    payload = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {target} HTTP/1.1", "Host: peerd", "Connection: close", "Accept: application/json"]
    if body is not None:
        head.append("Content-Type: application/json")
    if body is not None or method != "GET":
        head.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + payload


class ResponseReader:
    """Sans-IO: bytes of one HTTP/1.1 response in (`feed`, then `end` at EOF), status and body out."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status: int | None = None
        self._length: int | None = None
        self._chunked = False
        self._body_at = 0

    def feed(self, data: bytes) -> bool:
        """Take more bytes; True once the whole response is here (its Content-Length read)."""
        self._buf += data
        if self.status is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            self._head(bytes(self._buf[:end]).decode("latin-1"))
            self._body_at = end + 4
        return self._length is not None and len(self._buf) - self._body_at >= self._length

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise PeerdError("The daemon's socket answered something that is not HTTP.")
        self.status = int(parts[1])
        for line in lines:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length" and value.strip().isdigit():
                self._length = int(value.strip())
            elif name == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True
        if self._chunked:
            self._length = None

    def end(self) -> tuple[int, bytes]:
        """The connection closed: (status, body), or DaemonConnectionError when it was cut short."""
        if self.status is None:
            raise DaemonConnectionError("The daemon closed the connection before it answered.")
        body = bytes(self._buf[self._body_at :])
        if self._chunked:
            body = _dechunk(body)
        elif self._length is not None:
            if len(body) < self._length:
                raise DaemonConnectionError("The daemon closed the connection in the middle of its answer.")
            body = body[: self._length]
        return self.status, body


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    at = 0
    while True:
        eol = data.find(b"\r\n", at)
        if eol < 0:
            raise DaemonConnectionError("The daemon closed the connection in the middle of its answer.")
        size = int(data[at:eol].split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            return bytes(out)
        start = eol + 2
        if len(data) < start + size:
            raise DaemonConnectionError("The daemon closed the connection in the middle of its answer.")
        out += data[start : start + size]
        at = start + size + 2


class LocalClient:
    """Calls to the daemon at `socket_path`, one connection each. Use as is or in a `with`."""

    def __init__(
        self,
        socket_path: Path,
        *,
        environment_id: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
    ) -> None:
        self.socket_path = socket_path
        self.environment_id = environment_id
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        body, params = with_environment(method, body, params, self.environment_id)
        request = request_bytes(method, path, body=body, params=params)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._connect(sock)
            status, raw = self._exchange(sock, request)
        finally:
            sock.close()
        return decode_answer(status, raw)

    def _connect(self, sock: _socket.socket) -> None:
        sock.settimeout(self.connect_timeout)
        try:
            sock.connect(str(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            raise DaemonNotRunning.at(self.socket_path) from None
        except TimeoutError:
            raise DaemonConnectionError(
                f"The daemon at {self.socket_path} did not accept the connection within "
                f"{self.connect_timeout:g} s; it may be overloaded or stuck (see its log)."
            ) from None
        except OSError as exc:
            raise DaemonConnectionError(
                f"Cannot connect to {self.socket_path}: {exc.strerror or exc}."
            ) from None

    def _exchange(self, sock: _socket.socket, request: bytes) -> tuple[int, bytes]:
        sock.settimeout(self.read_timeout)
        reader = ResponseReader()
        try:
            # A daemon that refused the request may have answered and closed: read what it said.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(request)
            while True:
                data = sock.recv(_RECV_BYTES)
                if not data or reader.feed(data):
                    return reader.end()
        except TimeoutError:
            raise DaemonConnectionError(
                f"The daemon did not answer within {self.read_timeout:g} s; it may be overloaded or "
                "stuck (see its log), or try again."
            ) from None
        except ConnectionResetError:
            return reader.end()
