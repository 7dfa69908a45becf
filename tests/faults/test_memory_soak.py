"""Memory per delegation (issue 26 case 11), `make faults` only: a laptop and a box as real `peerd
serve` subprocesses, linked on loopback, SOAK_COUNT delegations one after another with the scripted
provider. After SOAK_WARM of them, each daemon's resident memory (VmRSS, /proc) must be flat: the
least-squares slope over the rest under SLOPE_KB per delegation (the leak was ~14 kB, linear on
both daemons), and its open descriptors too. Memory, not time: no timed assertion."""

from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path

import pytest

from tests.faults.harness import FULL, REPORT, Outcome, Row, World, child_script, linked_world, parent_script

SOAK_COUNT = int(os.environ.get("PEERD_SOAK_DELEGATIONS", "300"))
SOAK_WARM = SOAK_COUNT // 3
SLOPE_KB = 4.0  # kB per delegation after the warm-up; measured 0.8-2.5 fixed, 6.3-7.1 before (issue: ~14)
FD_SLACK = 8

pytestmark = pytest.mark.skipif(not FULL, reason="the memory soak runs in `make faults` (PEERD_FAULTS=full)")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def fds(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def slope(points: list[tuple[int, int]]) -> float:
    """Least squares: kB per delegation."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


async def delegation(w: World, n: int) -> None:
    prompt = parent_script(child_script(n), w.box_id, f"soak-{n}", wake_wait_s=0.0)
    launched = await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": prompt})
    thread = launched["threadId"]
    while True:  # until the wake run (run 2) ended: the task's result is home
        latest = (await w.call("laptop", "GET", f"/v1/threads/{thread}"))["latestRun"]
        if latest["number"] >= 2 and latest["status"] in ("completed", "failed", "interrupted", "cancelled"):
            assert latest["status"] == "completed", latest
            return
        await w.call(
            "laptop", "GET", f"/v1/threads/{thread}/wait", params={"run": latest["id"], "timeout": 5}
        )


@pytest.mark.timeout(120 + 6 * SOAK_COUNT)  # a delegation takes about a second on a loaded machine
async def test_memory_is_flat_per_delegation_after_warm_up(tmp_path: Path) -> None:
    row = Row(f"memory soak, {SOAK_COUNT} delegations")
    REPORT.append(row)
    async with linked_world(tmp_path) as w:
        pids = {side: w.side(side).proc.pid for side in ("laptop", "box")}  # type: ignore[union-attr]
        seen: dict[str, list[tuple[int, int]]] = {side: [] for side in pids}
        fds_at_warm: dict[str, int] = {}
        for n in range(SOAK_COUNT):
            await delegation(w, n)
            if n == SOAK_WARM:
                fds_at_warm = {side: fds(pid) for side, pid in pids.items()}
            if n >= SOAK_WARM and n % 5 == 0:
                for side, pid in pids.items():
                    seen[side].append((n, rss_kb(pid)))
        out = Outcome(settled=True)
        for side, pid in pids.items():
            grew = slope(seen[side])
            first, last = seen[side][0][1], seen[side][-1][1]
            fd_now = fds(pid)
            out.notes.append(
                f"{side}: RSS {first} -> {last} kB after warm-up, slope {grew:.2f} kB per delegation; "
                f"fds {fds_at_warm[side]} -> {fd_now}"
            )
            if grew > SLOPE_KB or fd_now > fds_at_warm[side] + FD_SLACK:
                out.stuck += 1  # the table's "stuck": memory that never settles
        row.add(out)
    await asyncio.sleep(0)
    assert row.clean, "\n".join(row.notes)
