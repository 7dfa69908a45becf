"""`make demo` stays true: the two-machine demo runs end to end with the scripted agents."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


async def test_the_demo_runs_end_to_end() -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(REPO / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=170,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    for step in (
        "[box]$ peerd pair --access auto",
        "[laptop]$ peerd environment list",
        "[box]$ peerd client list",
        "on box: thr_",
        "The laptop's daemon is back",
        "no longer accepts this link",
        "Both daemons exited with code 0",
    ):
        assert step in out, step
    assert re.search(r"subagent of +thread thr_", out), "the child's lineage is shown"
