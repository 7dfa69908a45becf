"""The MCP snippets users copy (examples/mcp/) carry the settings each CLI needs for peerd's tools."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

from peerd.agent_tools import CATALOGUE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mcp"


def test_codex_waits_for_peerds_server_before_its_first_request() -> None:
    server = tomllib.loads((EXAMPLES / "codex-config.toml").read_text())["mcp_servers"]["peerd"]
    assert server["command"] == "peerd" and server["args"] == ["mcp"]
    assert server["required"] is True


def test_claude_always_loads_peerds_tools() -> None:
    server = json.loads((EXAMPLES / "claude-code.mcp.json").read_text())["mcpServers"]["peerd"]
    assert server["alwaysLoad"] is True and server["args"] == ["mcp"]


def test_codex_exec_may_call_peerds_tools() -> None:
    """Under `codex exec` nothing can ask before a tool call: without this every call of a peerd
    tool failed "requires approval, but approval policy is never" (issue 29)."""
    server = tomllib.loads((EXAMPLES / "codex-config.toml").read_text())["mcp_servers"]["peerd"]
    assert server["default_tools_approval_mode"] == "approve"


def test_gemini_offers_peerds_tools_to_a_headless_run() -> None:
    """Without `trust`, `gemini -p` offered the model none of peerd's tools (issue 29)."""
    server = json.loads((EXAMPLES / "gemini-settings.json").read_text())["mcpServers"]["peerd"]
    assert server["trust"] is True and server["args"] == ["mcp"]


def test_the_agents_guide_names_every_tool() -> None:
    guide = (EXAMPLES.parents[1] / "docs" / "user" / "agents.md").read_text()
    missing = [spec.name for spec in CATALOGUE if f"`{spec.name}`" not in guide]
    assert not missing, f"docs/user/agents.md does not name {missing}"


def test_the_guide_states_the_tools_count_and_size_the_catalogue_has_now() -> None:
    """The count and size are generated (`make docs`), never typed: a tool added or a schema grown
    makes this fail until the guide says so."""
    path = EXAMPLES.parents[1] / "tools" / "gen_tool_facts.py"
    spec = importlib.util.spec_from_file_location("gen_tool_facts", path)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0
