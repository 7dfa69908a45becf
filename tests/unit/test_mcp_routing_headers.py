"""`peerd mcp` gives each 2026-07-28 request the routing headers its revision asks of an HTTP
client, taken from the message itself; other messages get none (their version comes from the
handshake)."""

from __future__ import annotations

import base64

from peerd.mcp_proxy import routing_headers

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def test_a_modern_request_carries_its_version_method_and_name() -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "thread_read", "_meta": META},
    }
    assert routing_headers(message) == {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "thread_read",
    }


def test_a_task_method_is_named_by_its_task() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "tk_1", "_meta": META}}
    assert routing_headers(message)["Mcp-Name"] == "tk_1"


def test_a_name_outside_plain_ascii_is_sent_base64() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "é ", "_meta": META}}
    encoded = routing_headers(message)["Mcp-Name"]
    assert encoded == "=?base64?" + base64.b64encode("é ".encode()).decode() + "?="


def test_handshake_era_messages_and_responses_get_none() -> None:
    assert routing_headers({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) == {}
    assert routing_headers({"jsonrpc": "2.0", "id": 1, "result": {}}) == {}
    assert routing_headers({"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"_meta": {}}}) == {}
    assert routing_headers(None) == {}
