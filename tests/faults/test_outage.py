"""A link that goes away and comes back (tests/faultproxy.py between the laptop and the box):
refused connections, and a black hole (accepted, never answered). The box's child ends during the
outage; measured: how soon the laptop notices, and how soon after the route returns (or after the
first successful exchange with the box) the result is delivered and the parent woken."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.faults.harness import (
    FULL,
    REPORT,
    Outcome,
    Row,
    child_script,
    parent_script,
    rows,
    runs_of,
    table,
    until,
)
from tests.faults.inproc import Pair, linked_pair
from tests.realcli import signal_dir
from tests.support.eventually import eventually
from tests.support.follower import poll_in_flight

CHUNK_S = 4.0  # the laptop follower's long-poll chunk here
OUTAGE_S = 60.0 if FULL else 8.0
DELIVERED_WITHIN_S = 5.0  # after the first successful exchange with the box
RESULT_BOUND_S = 330.0  # the backoff cap (5 min) and a margin: later than this is stuck
VARIANTS = [("refuse", True), ("refuse", False), ("black_hole", False)] if FULL else [("refuse", True)]


async def task_row(p: Pair, parent: str) -> dict[str, object] | None:
    found = rows(p.db("laptop"), "SELECT status, result FROM tasks WHERE parent_thread_id = ?", (parent,))
    return dict(found[0]) if found else None


def failures(p: Pair) -> int:
    found = rows(p.db("laptop"), "SELECT attempts FROM link_backoff WHERE env_id = ?", (p.box_id,))
    return int(found[0]["attempts"]) if found else 0


async def outage(p: Pair, n: int, mode: str, new_work: bool, hold: Path) -> Outcome:
    assert p.proxy is not None
    loop = asyncio.get_running_loop()
    prompt = parent_script(child_script(n, hold=hold), p.box_id, f"outage-{n}")
    parent = (await p.lc.call("POST", "/v1/threads", body={"projectId": p.here, "prompt": prompt}))[
        "threadId"
    ]

    async def child_live() -> bool:
        task = await task_row(p, parent)
        return task is not None and task["status"] == "running"

    await eventually(child_live, what="the box's child running", within=30)
    await eventually(lambda: poll_in_flight(p.laptop, p.box_id), what="the follower's watch on the wire")
    began = loop.time()
    await (p.proxy.refuse() if mode == "refuse" else p.proxy.black_hole())
    hold.write_text("go")  # the child ends on the box during the outage
    out = Outcome()

    async def failed() -> bool:
        return failures(p) > 0

    noticed = await until(failed, timeout=OUTAGE_S, step=0.1)
    noticed_s = loop.time() - began
    out.notes.append(
        f"noticed {noticed_s:.1f} s after it began (chunk {CHUNK_S:g} s)" if noticed else "never noticed"
    )
    await asyncio.sleep(max(0.0, OUTAGE_S - (loop.time() - began)))
    await p.proxy.forward()
    restored = loop.time()
    since, what = restored, "the route returned"
    if new_work:
        await p.forwarded("GET", "/v1/projects")  # a successful exchange with the box
        since, what = loop.time(), "the first successful call"

    async def delivered() -> bool:
        task = await task_row(p, parent)
        return task is not None and task["status"] != "running"

    if not await until(delivered, timeout=RESULT_BOUND_S, step=0.1):
        out.stuck = 1
        out.notes.append(f"no result {RESULT_BOUND_S:g} s after {what}")
        return out
    result_s = loop.time() - since
    task = await task_row(p, parent)
    assert task is not None
    if task["status"] != "completed" or not str(task["result"]).startswith(f"CHILD {n}"):
        out.lost_results = 1
    out.notes.append(
        f"result {result_s:.1f} s after {what} ({loop.time() - restored:.1f} s after the route returned)"
    )

    async def woken() -> bool:
        return any(
            r["origin"] == "wake" and r["status"] == "completed" for r in runs_of(p.db("laptop"), parent)
        )

    if not await until(woken, timeout=30, step=0.1):
        out.lost_wakes = 1
    out.settled, out.settle_s = True, result_s
    if new_work and result_s > DELIVERED_WITHIN_S:
        out.stuck = 1
        out.notes.append(f"slower than {DELIVERED_WITHIN_S:g} s after the first success")
    if mode == "black_hole" and (not noticed or noticed_s > CHUNK_S + 2.0):
        out.stuck = 1
        out.notes.append("the black hole was not noticed within one chunk")
    return out


@pytest.mark.timeout(120 + len(VARIANTS) * (OUTAGE_S + RESULT_BOUND_S))
async def test_outages_refused_and_black_holed(tmp_path: Path) -> None:
    made = []
    with signal_dir() as signals:
        for n, (mode, new_work) in enumerate(VARIANTS, start=1):
            row = Row(
                f"outage {OUTAGE_S:g} s, {mode.replace('_', ' ')}{', new work after' if new_work else ''}"
            )
            REPORT.append(row)
            made.append(row)
            async with linked_pair(tmp_path / f"v{n}", watch_chunk_s=CHUNK_S, proxied=True) as p:
                row.add(await outage(p, n, mode, new_work, signals / f"hold-{n}"))
    assert all(row.clean for row in made), "\n".join(table(REPORT))
