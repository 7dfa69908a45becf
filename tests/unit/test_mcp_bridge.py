"""The stdio bridge's own small parts: its HTTP reading and what it answers without the daemon."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from peerd.mcp_proxy import BadAnswer, Bridge, ProxyConfig, parse_answer


def test_a_sized_answer_is_cut_at_its_length() -> None:
    answer = parse_answer(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}xx"
    )
    assert (answer.status, answer.kind, answer.body) == (200, "application/json", b"{}")


def test_a_chunked_answer_is_joined() -> None:
    raw = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4;x=y\r\n":1}\r\n0\r\n\r\n'
    assert json.loads(parse_answer(raw).body) == {"a": 1}


@pytest.mark.parametrize("raw", [b"", b"garbage", b"HTTP/1.1 OK\r\n\r\n", b"SSH-2.0-x\r\n\r\n"])
def test_what_is_not_http_is_refused(raw: bytes) -> None:
    with pytest.raises(BadAnswer):
        parse_answer(raw)


def test_a_token_that_would_break_the_header_is_never_sent(tmp_path: Path) -> None:
    config = ProxyConfig(socket=tmp_path / "none.sock", token="abc\r\nX-Evil: 1")
    out = io.BytesIO()
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "project_list"}}
    raw = json.dumps(call).encode()
    Bridge(config, out).write(Bridge(config, out).answer(raw, call))
    answer = json.loads(out.getvalue())
    assert answer["id"] == 7 and answer["result"]["isError"] is True
    assert answer["result"]["content"][0]["text"].startswith("capability_denied: ")


def test_a_line_that_is_not_json_gets_a_parse_error(tmp_path: Path) -> None:
    bridge = Bridge(ProxyConfig(socket=tmp_path / "none.sock", token=None), io.BytesIO())
    [line] = bridge.answer(b"{not json", None)
    assert json.loads(line)["error"]["code"] == -32700
