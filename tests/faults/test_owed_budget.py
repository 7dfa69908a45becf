"""Issue 26, case 6: a task's budget survives a box crash. Real `peerd serve` subprocesses, a
laptop and a box linked on loopback; the laptop's parent delegates a child to the box with a
budget of 50,000 tokens, and the box is killed -9 while the child's run is live.

- **Tripped**: the child's last report had passed the budget (51,200 of 50,000) and the box died
  before the stop landed (the store is left as such a kill leaves it: the run `running`, its usage
  recorded). After the restart the run fails with the budget's reason, is not continued, and the
  task fails.
- **Carried over**: the cut run had spent 30,100; its continuation spends 25,100 more. The
  continuation counts the first run's usage: it is stopped and fails, and so does the task.

Both are in `make test`'s subset (deterministic: the kill comes at a watched state).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness import (
    READ_AND_REPORT,
    REPORT,
    Outcome,
    Row,
    World,
    delegate,
    linked_world,
    rows,
    runs_script,
    table,
    until,
)
from tests.faults.invariant import assert_invariant
from tests.support.eventually import eventually

BUDGET = {"tokens": 50_000}


def spend(tokens: int) -> dict[str, Any]:
    return {"usage": {"input_tokens": tokens - 100, "output_tokens": 100}}


def child(hold: Path) -> str:
    """Run 1 reports 30,100 tokens and waits for `hold`; a continuation reports 25,100 more."""
    return runs_script(
        [spend(30_100), {"wait_for_file": str(hold)}, {"reply": "CHILD"}],
        [spend(25_100), {"reply": "CHILD (continued)"}],
    )


def parent(w: World, hold: Path, key: str) -> str:
    go = delegate(task=child(hold), target={"environmentId": w.box_id}, budget=BUDGET, clientRequestId=key)
    return runs_script([go, {"reply": "sent"}], [{"wait": 0.5}, *READ_AND_REPORT], READ_AND_REPORT)


def record_tokens(db: Path, run_id: str, tokens: int) -> None:
    """What the box's store holds when it died after the report of `tokens` and before the stop."""
    usage = {"inputTokens": tokens - 100, "outputTokens": 100, "totalTokens": tokens, "wallMs": 900}
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE runs SET usage = ? WHERE id = ?", (json.dumps(usage), run_id))
        conn.commit()


async def one(w: World, n: int, *, tripped: bool) -> tuple[Outcome, list[sqlite3.Row], sqlite3.Row]:
    hold = w.tmp / f"hold-{n}"
    launched = await w.call(
        "laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": parent(w, hold, f"budget-{n}")}
    )
    parent_id = launched["threadId"]

    def the_task() -> sqlite3.Row | None:
        found = rows(w.laptop.db, "SELECT * FROM tasks WHERE parent_thread_id = ?", (parent_id,))
        return found[0] if found else None

    async def child_spent() -> bool:
        task = the_task()
        if task is None or not task["child_thread_id"]:
            return False
        live = rows(
            w.box.db,
            "SELECT id FROM runs WHERE thread_id = ? AND status = 'running' AND usage IS NOT NULL",
            (task["child_thread_id"],),
        )
        return bool(live)

    await eventually(child_spent, what="the box's child reporting its usage", within=30)
    task = the_task()
    assert task is not None
    child_thread = task["child_thread_id"]
    (cut,) = rows(w.box.db, "SELECT id FROM runs WHERE thread_id = ? AND status = 'running'", (child_thread,))
    w.box.kill9()
    if tripped:
        record_tokens(w.box.db, cut["id"], 51_200)
    await w.box.restart()

    async def task_ended() -> bool:
        t = the_task()
        return t is not None and t["status"] in ("completed", "failed", "cancelled", "interrupted")

    out = Outcome(phase="child running")
    if not await until(task_ended, timeout=60):
        out.stuck = 1
    box_runs = rows(
        w.box.db,
        "SELECT id, status, origin, reason FROM runs WHERE thread_id = ? ORDER BY number",
        (child_thread,),
    )
    ended = the_task()
    assert ended is not None
    if ended["status"] != "failed" or "budget exceeded" not in str(ended["result"]):
        out.lost_results = 1
        out.notes.append(f"task {ended['status']}: {str(ended['result'])[:100]!r}")

    async def parent_woken() -> bool:
        runs = rows(w.laptop.db, "SELECT status, origin FROM runs WHERE thread_id = ?", (parent_id,))
        done = all(r["status"] in ("completed", "failed", "cancelled", "interrupted") for r in runs)
        return done and any(r["origin"] == "wake" for r in runs)

    if not await until(parent_woken, timeout=30):
        out.lost_wakes = 1
    for side in ("laptop", "box"):
        assert_invariant(w.side(side).db)
    return out, box_runs, ended


@pytest.mark.timeout(240)
async def test_a_task_budget_survives_a_box_crash(tmp_path: Path) -> None:
    row = Row("kill -9 box, budget passed")
    REPORT.append(row)
    async with linked_world(tmp_path) as w:
        # Tripped: the report past the budget landed, the stop did not.
        out, box_runs, task = await one(w, 1, tripped=True)
        row.add(out)
        assert [r["status"] for r in box_runs] == ["failed"], box_runs  # no continuation
        assert "51,200 of 50,000 tokens" in str(box_runs[0]["reason"])
        assert task["status"] == "failed" and "51,200 of 50,000 tokens" in str(task["result"])
        # Carried over: 30,100 before the crash + 25,100 in the continuation.
        out, box_runs, task = await one(w, 2, tripped=False)
        row.add(out)
        assert [(r["origin"], r["status"]) for r in box_runs] == [
            ("user", "interrupted"),
            ("continue", "failed"),
        ]
        assert "55,200 of 50,000 tokens" in str(box_runs[1]["reason"]), box_runs
        assert task["status"] == "failed" and "55,200 of 50,000 tokens" in str(task["result"])
    assert row.clean, "\n".join(table(REPORT))
    await asyncio.sleep(0)
