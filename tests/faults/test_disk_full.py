"""A full disk, for real: the store of one side lies on a small filesystem that the test fills
(tests/faults/smalldisk.py), on the box while its child ends, then on the laptop while the
result arrives. While full, launches there answer 503 `storage_unavailable`; once the space is
back the same daemons finish the work without a restart: nothing stays `running`, the task ends
with its child's reply and the parent is woken once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from peerd.errors import PeerdError
from tests.faults.harness import (
    FULL,
    REPORT,
    TERMINAL_RUN,
    Outcome,
    Row,
    World,
    child_script,
    linked_world,
    parent_script,
    table,
    until,
)
from tests.faults.smalldisk import SmallDisk, available
from tests.realcli import signal_dir
from tests.support.eventually import eventually

FULL_FOR_S = 20.0 if FULL else 3.0
SETTLE_S = 60.0


async def launch_while_full(w: World, side: str) -> str:
    project = w.here if side == "laptop" else w.there
    try:
        await w.call(side, "POST", "/v1/threads", body={"projectId": project, "prompt": "while full"})
    except PeerdError as exc:
        return exc.code
    return "accepted"


async def state(w: World, parent: str) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any] | None]:
    """(the task, the parent's latest run, the child's latest run), through the daemons' APIs (the
    full side's store is not reachable as a file here)."""
    tasks = (await w.call("laptop", "GET", "/v1/tasks", params={"threadId": parent}))["items"]
    task = tasks[0] if tasks else None
    latest = (await w.call("laptop", "GET", f"/v1/threads/{parent}"))["latestRun"]
    child_id = (task or {}).get("remoteChild", {}) or {}
    child = None
    if child_id.get("threadId"):
        child = (await w.call("box", "GET", f"/v1/threads/{child_id['threadId']}"))["latestRun"]
    return task, latest, child


async def full_store(w: World, n: int, side: str, disk: SmallDisk, hold: Path) -> Outcome:
    loop = asyncio.get_running_loop()
    prompt = parent_script(child_script(n, hold=hold), w.box_id, f"full-{n}")
    launched = await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": prompt})
    parent = launched["threadId"]

    async def running() -> bool:
        task, _, child = await state(w, parent)
        return task is not None and task["status"] == "running" and child is not None

    await eventually(running, what="the delegated child running", within=30, every=0.1)
    out = Outcome()
    await asyncio.to_thread(disk.fill)
    hold.write_text("go")  # the child ends now: on a full box, or towards a full laptop
    code = await launch_while_full(w, side)
    out.notes.append(f"a launch on the full {side}: {code}")
    if code != "storage_unavailable":
        out.lost_results += 1
    await asyncio.sleep(FULL_FOR_S)
    disk.free()
    space = loop.time()

    async def settled() -> bool:
        task, latest, child = await state(w, parent)
        return (
            task is not None
            and task["status"] in TERMINAL_RUN
            and child is not None
            and child["status"] in TERMINAL_RUN
            and latest["number"] >= 2
            and latest["status"] == "completed"
        )

    if not await until(settled, timeout=SETTLE_S, step=0.1):
        out.stuck = 1
        out.notes.append(f"not settled {SETTLE_S:g} s after space returned: {await state(w, parent)}")
        return out
    out.settled, out.settle_s = True, loop.time() - space
    task, latest, _ = await state(w, parent)
    assert task is not None
    if task["status"] != "completed" or not str(task["result"]).startswith(f"CHILD {n}"):
        out.lost_results += 1
        out.notes.append(f"task {task['status']}: {task['result']!r}")
    out.duplicates = latest["number"] - 2  # one wake run, nothing cut to continue
    return out


@pytest.mark.timeout(180 + 2 * (FULL_FOR_S + SETTLE_S))
async def test_a_full_disk_on_either_side(tmp_path: Path) -> None:
    why_not = await asyncio.to_thread(available)
    if why_not is not None:
        pytest.skip(why_not)
    made = [Row(f"disk full {FULL_FOR_S:g} s: {side} store") for side in ("box", "laptop")]
    REPORT.extend(made)
    with signal_dir() as signals:
        debug = ("--log-level", "debug")
        async with linked_world(tmp_path, box_extra=debug, laptop_extra=debug) as w:
            for n, (side, row) in enumerate(zip(("box", "laptop"), made, strict=True), start=1):
                plain = w.side(side)
                plain.term()
                assert await plain.exited() == 0
                disk = SmallDisk(plain)
                await disk.restart()
                if side == "box":
                    w.box = disk
                else:
                    w.laptop = disk
                row.add(await full_store(w, n, side, disk, signals / f"hold-{n}"))
    assert all(row.clean for row in made), "\n".join(table(REPORT))
