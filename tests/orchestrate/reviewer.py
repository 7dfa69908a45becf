"""A custom-command reviewer for orchestration tests: answers the verdicts a test scripted.

Usage: reviewer.py SPEC WORKTREE VERDICTS_JSON STATE_DIR. The spec names the packet ("Packet <id>");
VERDICTS_JSON maps a packet id to the list of answers to give, one per review of that packet (the
last one repeats). Each answer is printed as the reviewer's whole reply, and the prompt it got is kept
as STATE_DIR/<packet>.<n>.prompt for the test to read. Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main() -> int:
    spec, _worktree, verdicts_file, state_dir = (Path(a) for a in sys.argv[1:5])
    text = spec.read_text(encoding="utf-8")
    found = re.search(r"^Packet (\S+)", text, re.MULTILINE)
    packet = found.group(1) if found else "?"
    answers = json.loads(verdicts_file.read_text(encoding="utf-8")).get(packet) or [
        {"verdict": "approve", "evidence": [], "summary": "Looks right."}
    ]
    counter = state_dir / f"{packet}.count"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    (state_dir / f"{packet}.{n + 1}.prompt").write_text(text, encoding="utf-8")  # what it was shown
    answer = answers[min(n, len(answers) - 1)]
    print(answer if isinstance(answer, str) else json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
