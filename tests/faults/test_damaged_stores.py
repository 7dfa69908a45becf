"""Each damaged or foreign store, under a real `peerd serve`: refused at start with exit 2 and one
sentence naming the file and the way out; never started over, never replaced."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peerd.cli.common import EXIT_USAGE
from peerd.paths import Paths
from tests.faults.damage import DAMAGES, SAID, checkpointed
from tests.faults.harness import REPORT, Outcome, Row, table
from tests.helpers import client_for, make_repo, running_daemon, wait_terminal

pytestmark = pytest.mark.slow  # two daemons


async def used_home(tmp: Path) -> Path:
    home = tmp / "used"
    async with running_daemon(home, listen=None), client_for(home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(make_repo(tmp / "repo"))})
        launched = await c.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": "hi"})
        await wait_terminal(c, launched["threadId"], launched["runId"])
    checkpointed(home)
    return home


def serve(home: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen", "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return done, time.monotonic() - began


async def test_every_damaged_store_is_refused_by_peerd_serve(tmp_path: Path) -> None:
    row = Row(f"damaged stores ({len(DAMAGES)} kinds)")
    REPORT.append(row)
    used = await used_home(tmp_path)
    for name, damage in DAMAGES.items():
        home = tmp_path / name
        shutil.copytree(used, home, symlinks=True)
        damage(home)
        db = Paths(home).db
        before = db.read_bytes() if db.exists() else None
        done, took = await asyncio.to_thread(serve, home)
        out = Outcome(settled=True)
        lines = done.stderr.strip().splitlines()
        refused = (
            done.returncode == EXIT_USAGE
            and len(lines) == 1
            and lines[0].startswith(f"error: {db} {SAID[name]}")
            and "Traceback" not in done.stderr
        )
        unchanged = (db.read_bytes() if db.exists() else None) == before
        if not (refused and unchanged):
            out.lost_results = 1  # a start over a damaged store loses everything it held
            out.notes.append(f"{name}: exit {done.returncode}, unchanged {unchanged}: {done.stderr[-300:]!r}")
        else:
            out.notes.append(f"{name}: refused in {took:.1f} s, exit 2")
        row.add(out)
    assert row.clean, "\n".join(table(REPORT))
