"""Issue 26, case 9 end to end: the laptop's wall clock steps back 600 s while its follower backs
off from a box it cannot reach; the box's child ends meanwhile and the route comes back. Both
daemons run in the test's loop, so the step is `time.time` (the wall clock every store write and,
before the fix, every backoff read) returning 600 s less from then on; `time.monotonic` (asyncio's
clock, and now the follower's) goes on.

Measured: how soon after the route returned the result is delivered (before the fix: the backoff
decided before the step was judged against the stepped clock, > 420 s). Also checked: no task or
run ends before it began; the step here does not reach clocks bound at import (`clock=time.time`
defaults, the tasks' and runs' timestamps), so that rule's own test is tests/tasks/test_clock_steps.py.
A subprocess's whole wall clock is stepped with tests/faults/clockshift (test_link_clock.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.faults.harness import REPORT, Outcome, Row, child_script, parent_script, rows, table, until
from tests.faults.inproc import linked_pair
from tests.realcli import signal_dir
from tests.support.eventually import eventually
from tests.support.follower import poll_in_flight

CHUNK_S = 4.0
STEP_S = 600.0
DELIVERED_WITHIN_S = 30.0  # the backoff then (a few seconds) and a poll; stepped: > 420 s


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_wall_clock_stepped_back_during_a_backoff_delays_no_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = Row(f"wall clock back {STEP_S:g} s in a backoff")
    REPORT.append(row)
    out = Outcome()
    real_time = time.time
    with signal_dir() as signals:
        hold = signals / "hold"
        async with linked_pair(tmp_path, watch_chunk_s=CHUNK_S, proxied=True) as p:
            assert p.proxy is not None
            prompt = parent_script(child_script(1, hold=hold), p.box_id, "clock-step-1")
            body = {"projectId": p.here, "prompt": prompt}
            parent = (await p.lc.call("POST", "/v1/threads", body=body))["threadId"]

            def task() -> dict[str, object] | None:
                found = rows(
                    p.db("laptop"),
                    "SELECT status, result, created_at, ended_at FROM tasks WHERE parent_thread_id = ?",
                    (parent,),
                )
                return dict(found[0]) if found else None

            async def running() -> bool:
                t = task()
                return t is not None and t["status"] == "running"

            async def backing_off() -> bool:
                found = rows(
                    p.db("laptop"), "SELECT attempts FROM link_backoff WHERE env_id = ?", (p.box_id,)
                )
                return bool(found) and int(found[0]["attempts"]) >= 1

            await eventually(running, what="the box's child running", within=30)
            await eventually(
                lambda: poll_in_flight(p.laptop, p.box_id), what="the follower's poll on the wire"
            )
            await p.proxy.refuse()
            await eventually(backing_off, what="the follower backing off", within=30, every=0.02)
            monkeypatch.setattr(time, "time", lambda: real_time() - STEP_S)  # the step, mid-backoff
            hold.write_text("go")  # the child ends on the box during the outage
            await p.proxy.forward()
            loop = asyncio.get_running_loop()
            began = loop.time()

            async def delivered() -> bool:
                t = task()
                return t is not None and t["status"] != "running"

            if not await until(delivered, timeout=DELIVERED_WITHIN_S, step=0.1):
                out.stuck = 1
                out.notes.append(f"no result {DELIVERED_WITHIN_S:g} s after the route returned")
            else:
                out.settled, out.settle_s = True, loop.time() - began
                t = task()
                assert t is not None
                if t["status"] != "completed" or not str(t["result"]).startswith("CHILD 1"):
                    out.lost_results = 1
                if float(str(t["ended_at"])) < float(str(t["created_at"])):
                    out.notes.append("the task ended before it was created")
                    out.stuck = 1
                for side in ("laptop", "box"):
                    early = rows(
                        p.db(side),
                        "SELECT id FROM runs WHERE ended_at IS NOT NULL"
                        " AND ended_at < coalesce(started_at, created_at)",
                    )
                    if early:
                        out.notes.append(f"{len(early)} run(s) on the {side} ended before they began")
                        out.stuck = 1
    row.add(out)
    assert row.clean, "\n".join(table(REPORT))
