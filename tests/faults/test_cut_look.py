"""Issue 26, case 8 end to end: the laptop's poll is cut (as by a kill -9 of the laptop: its
connection is reset) at the exact moment the box is looking at the child that just ended. A fault
hook holds the box's look inside its window (the read of the settled run's reply, in this
process: both daemons run in the test's loop), the route resets every connection, and the hook is
released. The laptop's next poll (after its backoff, cursor none: what a restarted laptop sends
too) must get the result; before the fix the task stayed `running` chunk after chunk.
The rule itself is tests/tasks/test_feed_cut_look.py; the real kill is the kill matrix's
"laptop, child ended" phase (tests/faults/test_kill_matrix.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from peerd.tasks import feedstore
from tests.faults.harness import REPORT, Outcome, Row, child_script, parent_script, rows, table, until
from tests.faults.inproc import linked_pair
from tests.realcli import signal_dir
from tests.support.eventually import eventually
from tests.support.follower import Gate, poll_in_flight

CHUNK_S = 4.0
DELIVERED_WITHIN_S = 5 * CHUNK_S  # the first backoff (2 s + jitter) and a poll; stuck: never


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_poll_cut_while_the_box_looks_at_the_ended_child_delivers_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = Row("poll cut mid-look (case 8)")
    REPORT.append(row)
    gate = Gate()
    monkeypatch.setattr(feedstore, "last_reply", gate.wrap(feedstore.last_reply))
    out = Outcome()
    with signal_dir() as signals:
        hold = signals / "hold"
        async with linked_pair(tmp_path, watch_chunk_s=CHUNK_S, proxied=True) as p:
            assert p.proxy is not None
            prompt = parent_script(child_script(1, hold=hold), p.box_id, "cut-look-1")
            body = {"projectId": p.here, "prompt": prompt}
            parent = (await p.lc.call("POST", "/v1/threads", body=body))["threadId"]

            def task() -> dict[str, object] | None:
                found = rows(
                    p.db("laptop"), "SELECT status, result FROM tasks WHERE parent_thread_id = ?", (parent,)
                )
                return dict(found[0]) if found else None

            async def running() -> bool:
                t = task()
                return t is not None and t["status"] == "running"

            await eventually(running, what="the box's child running", within=30)
            await eventually(
                lambda: poll_in_flight(p.laptop, p.box_id), what="the follower's poll on the wire"
            )
            hold.write_text("go")  # the child ends on the box; its look blocks in the hook
            await asyncio.wait_for(gate.entered.wait(), 30)
            await p.proxy.refuse()  # the laptop's connection is reset: the box's handler is cancelled
            await asyncio.wait_for(gate.cut.wait(), 10)
            gate.release.set()
            await p.proxy.forward()
            loop = asyncio.get_running_loop()
            began = loop.time()

            async def delivered() -> bool:
                t = task()
                return t is not None and t["status"] != "running"

            if await until(delivered, timeout=DELIVERED_WITHIN_S, step=0.1):
                t = task()
                assert t is not None
                out.settled, out.settle_s = True, loop.time() - began
                if t["status"] != "completed" or not str(t["result"]).startswith("CHILD 1"):
                    out.lost_results = 1
            else:
                out.stuck = 1
                out.notes.append(f"no result {DELIVERED_WITHIN_S:g} s after the route returned")
    row.add(out)
    assert row.clean, "\n".join(table(REPORT))
