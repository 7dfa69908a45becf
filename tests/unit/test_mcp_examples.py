"""The MCP snippets users copy (examples/mcp/) carry the settings each CLI needs for peerd's tools."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mcp"


def test_codex_waits_for_peerds_server_before_its_first_request() -> None:
    server = tomllib.loads((EXAMPLES / "codex-config.toml").read_text())["mcp_servers"]["peerd"]
    assert server["command"] == "peerd" and server["args"] == ["mcp"]
    assert server["required"] is True


def test_claude_always_loads_peerds_tools() -> None:
    server = json.loads((EXAMPLES / "claude-code.mcp.json").read_text())["mcpServers"]["peerd"]
    assert server["alwaysLoad"] is True and server["args"] == ["mcp"]
