"""A tiny stdio MCP server for tests that run the real coding CLIs against tests/fakemodel.py.

One tool, ``echo(text) -> "echo: <text>"`` (rename it with ``--tool NAME``, e.g. ``--tool delegate_task``
to stand in for peerd's own server). Every call is appended as one JSON line
``{"tool": ..., "arguments": {...}}`` to the file named by ``$ECHO_MCP_LOG`` (if set), so a test can
count the calls the CLI really made.

    python tests/echo_mcp.py [--tool NAME]
"""

from __future__ import annotations

import argparse
import json
import os

from mcp.server.mcpserver import MCPServer


def build(tool_name: str = "echo") -> MCPServer:
    server = MCPServer("echo")

    def echo(text: str) -> str:
        """Echo the text back, prefixed with 'echo: '."""
        log = os.environ.get("ECHO_MCP_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": tool_name, "arguments": {"text": text}}) + "\n")
        return f"echo: {text}"

    server.tool(name=tool_name, description="Echo the text back, prefixed with 'echo: '.")(echo)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tool", default="echo", help="name of the one tool (default: echo)")
    args = parser.parse_args()
    build(args.tool).run("stdio")


if __name__ == "__main__":
    main()
