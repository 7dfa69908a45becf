"""`make demo` stays true: the two-machine demo runs end to end with the scripted agents, and with
each real CLI from a clone below /tmp."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realcli import CLI_DIR, cli_binary

pytestmark = pytest.mark.slow  # the demo

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


# --- the demo with each real CLI, from a clone below /tmp (issue 27, case 3) -----------------------


@pytest.fixture(scope="module")
def clone_in_tmp() -> Iterator[Path]:
    """This repository's committed files, cloned below /tmp (where people try things, and where a
    confined run has a private /tmp of its own), with the pinned CLIs reached through a symlink in
    the clone's `.cache`: so the CLIs, the demo's homes and the config's files all lie below /tmp."""
    root = Path(tempfile.mkdtemp(prefix="peerd-clone-", dir="/tmp"))  # the point
    clone = root / "peerd"
    try:
        cloned = subprocess.run(
            ["git", "-c", "advice.detachedHead=false", "clone", "-q", str(REPO), str(clone)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert cloned.returncode == 0, cloned.stderr
        (clone / ".cache").mkdir()
        for name in ("codex", "claude"):
            cli_binary(name)  # installed, or the test fails saying how
        (clone / ".cache" / "coder-clis").symlink_to(CLI_DIR.resolve())
        yield clone
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_the_demo_runs_with_a_real_cli_from_a_clone_below_tmp(
    clone_in_tmp: Path, provider: str
) -> None:
    """The CLI's binary, the files its config names and its HOME all lie below /tmp: peerd maps them
    into the runs' sandboxes. Nothing of the test session's own settings: PEERD_SANDBOX_READABLE
    (tests/conftest.py sets it to this repository) would hide the bug, so every PEERD_ variable is
    dropped, and the clone's own peerd runs (PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
    env.update(DEMO_PROVIDER=provider, PYTHONPATH=str(clone_in_tmp))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(clone_in_tmp / "examples" / "demo.py")],
        cwd=clone_in_tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert f"peerd demo in {clone_in_tmp / '.cache'}/peerd-demo-" in out and f"(agents: {provider})" in out
    for step in (
        f"The laptop's {provider} calls peerd's delegate_task",
        "on box: thr_",
        "Both daemons exited with code 0",
    ):
        assert step in out, step
