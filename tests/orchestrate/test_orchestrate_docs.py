"""The user guide's complete scripted example (docs/user/orchestrate.md), run exactly as written in
a shell against a real daemon: only scripted coders, the default reviewer included, to an
approved, integrated branch."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import GIT_ENV, git, running_daemon

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)

DOC = Path(__file__).resolve().parents[2] / "docs" / "user" / "orchestrate.md"
MARKER = "<!-- the scripted example: tests/orchestrate/test_orchestrate_docs.py runs this block -->"


def example() -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(MARKER) + r"\n~~~sh\n(.*?)\n~~~\n", text, re.DOTALL)
    assert found, f"the scripted example block is missing from {DOC}"
    return found.group(1)


async def test_the_guides_scripted_example_runs_to_an_approved_integrated_branch(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with running_daemon(tmp_path / "home") as daemon:
        env = {
            **os.environ,
            **GIT_ENV,
            "PEERD_HOME": str(daemon.paths.home),
            # `peerd` as installed; no real coder CLI is needed (nor looked for) by this example
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        done = await asyncio.to_thread(
            subprocess.run, ["bash", "-e", "-c", example()], cwd=work, env=env,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Orchestration orc_" in out and ": completed" in out
    assert "01-fix-add: integrated" in out and "verdict approve" in out
    assert "peerd's scripted reviewer" in out  # the reviewer's choice, explained
    assert "full check: passed" in out
    assert "+    return a + b" in done.stdout  # the example's own `git diff main "$branch"`
    repo = work / "demo"
    assert "return a - b" in (repo / "calc.py").read_text()  # the checkout as it was
    assert git(repo, "status", "--porcelain") == ""
