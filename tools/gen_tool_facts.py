"""Write the agent tools' count and size into the docs that state them, from the catalogue itself.

    python tools/gen_tool_facts.py           rewrite the marked spans
    python tools/gen_tool_facts.py --check   exit 1 if a marked span differs from the catalogue now

A span is marked `<!-- tools:facts -->...<!-- /tools:facts -->` and says how many tools the MCP
server offers and how large its `tools/list` answer is (the JSON-RPC message, compact, as the SDK
sends it). `make docs` runs it; `tests/unit/test_mcp_examples.py` runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mcp import types

from peerd.api.mcp_server import tool_list

ROOT = Path(__file__).resolve().parent.parent
FILES = (ROOT / "docs" / "user" / "agents.md",)
SPAN = re.compile(r"(<!-- tools:facts -->)(.*?)(<!-- /tools:facts -->)", re.S)
WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)


def facts() -> str:
    tools = tool_list()
    result = json.loads(types.ListToolsResult(tools=tools).model_dump_json(by_alias=True, exclude_none=True))
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}, separators=(",", ":"))
    count = WORDS[len(tools)] if len(tools) < len(WORDS) else str(len(tools))
    return f"about {len(answer) / 1000:.1f} KB for all {count} tools"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = facts()
    stale = []
    for path in FILES:
        old = path.read_text()
        if not SPAN.search(old):
            sys.stderr.write(f"{path.relative_to(ROOT)}: no <!-- tools:facts --> span\n")
            return 1
        new = SPAN.sub(lambda m: m.group(1) + text + m.group(3), old)
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        sys.stderr.write(f"{names}: the tools' facts are stale ({text}); run `make docs`\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
