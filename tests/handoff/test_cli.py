"""`peerd thread move` from the command line: the dry run's table, the move waited for, and
`thread show` with the lineage both ways."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tests.support.handoff import linked, worked_thread


async def peerd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=120)


async def test_thread_move_from_the_cli(tmp_path: Path) -> None:
    async with linked(tmp_path) as pair:
        here = (await worked_thread(pair))["threadId"]
        home = pair.laptop.paths.home
        dry = await peerd(home, "thread", "move", here, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "box" in dry.stdout and "yes" in dry.stdout
        moved = await peerd(home, "thread", "move", here, "--to", "box", "--message", "go on", "--json")
        assert moved.returncode == 0, moved.stderr
        move = json.loads(moved.stdout)["move"]
        assert move["state"] == "moved"
        there = move["movedTo"]["threadId"]
        shown = await peerd(home, "thread", "show", here)
        assert f"thread {there} on {pair.box_id}" in shown.stdout and "moved" in shown.stdout
        shown_there = await peerd(home, "thread", "show", there, "--env", "box")
        assert f"thread {here} on {pair.laptop_id} (claimed by laptop)" in shown_there.stdout
        refused = await peerd(home, "thread", "send", here, "more")
        assert refused.returncode != 0 and "thread_moved" in refused.stderr
        usage = await peerd(home, "thread", "move", here)
        assert usage.returncode == 2 and "--to ENV" in usage.stderr
