"""Issue 26, case 7: an approval outlives no run. Real `peerd serve` subprocesses, a laptop and a
box linked on loopback: the laptop's parent delegates a child to the box at `approval-required`;
the child asks to run a command, and the box is killed -9 while the question waits.

After the restart the cut run's question is withdrawn before the box serves anything (never left
`pending` to be approved for an interrupted run); the child's continuation asks again, as a new
question, which the laptop sees (its copy of the box's questions no longer holds the old one)
and approves; a decision on the old question is refused; the task completes and the parent is
woken once. In `make test`'s subset (deterministic: the kill comes at a watched state).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd.errors import PeerdError
from tests.faults.harness import (
    READ_AND_REPORT,
    REPORT,
    Outcome,
    Row,
    delegate,
    linked_world,
    rows,
    runs_script,
    table,
    until,
)
from tests.faults.invariant import assert_invariant
from tests.support.eventually import eventually

ASK = {"run": "echo ran >> asked.txt"}


def pending_on_box(db: Path) -> list[str]:
    return [
        r["id"] for r in rows(db, "SELECT id FROM approvals WHERE status = 'pending' ORDER BY created_at")
    ]


def mirrored(db: Path) -> list[str]:
    return [r["id"] for r in rows(db, "SELECT id FROM remote_approvals")]


@pytest.mark.timeout(240)
async def test_a_question_pending_when_the_box_dies_is_withdrawn(tmp_path: Path) -> None:
    row = Row("kill -9 box, question pending")
    REPORT.append(row)
    out = Outcome(phase="question pending")
    async with linked_world(tmp_path) as w:
        child = runs_script([ASK, {"reply": "CHILD 1"}], [ASK, {"reply": "CHILD 1 (continued)"}])
        go = delegate(
            task=child,
            target={"environmentId": w.box_id},
            runtimeMode="approval-required",
            clientRequestId="ask-1",
        )
        prompt = runs_script([go, {"reply": "sent"}], [{"wait": 0.5}, *READ_AND_REPORT], READ_AND_REPORT)
        launched = await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": prompt})
        parent = launched["threadId"]

        async def asked_and_seen() -> bool:
            found = pending_on_box(w.box.db)
            return bool(found) and found[0] in mirrored(w.laptop.db)

        await eventually(asked_and_seen, what="the box's question on the laptop", within=40)
        (first,) = pending_on_box(w.box.db)
        w.box.kill9()
        await w.box.restart()
        (withdrawn,) = rows(w.box.db, "SELECT status, decided_by FROM approvals WHERE id = ?", (first,))
        assert (withdrawn["status"], withdrawn["decided_by"]) == ("cancelled", "run_ended")

        async def asked_again() -> bool:
            found = pending_on_box(w.box.db)
            return bool(found) and found[0] != first and found[0] in mirrored(w.laptop.db)

        await eventually(asked_again, what="the continuation's question on the laptop", within=40)
        assert first not in mirrored(w.laptop.db)  # the laptop learnt the old one is gone
        (second,) = pending_on_box(w.box.db)
        with pytest.raises(PeerdError) as refused:
            async with w.client("box") as c:
                await c.call("POST", f"/v1/approvals/{first}/decision", body={"decision": "approve"})
        assert refused.value.code == "approval_withdrawn"
        await w.call("laptop", "POST", f"/v1/approvals/{second}/decision", body={"decision": "approve"})

        def the_task() -> dict[str, str]:
            (task,) = rows(
                w.laptop.db, "SELECT status, result FROM tasks WHERE parent_thread_id = ?", (parent,)
            )
            return dict(task)

        async def woken() -> bool:
            runs = rows(w.laptop.db, "SELECT status, origin FROM runs WHERE thread_id = ?", (parent,))
            done = all(r["status"] in ("completed", "failed", "cancelled", "interrupted") for r in runs)
            return the_task()["status"] == "completed" and done and any(r["origin"] == "wake" for r in runs)

        if not await until(woken, timeout=60):
            out.stuck = 1
            out.notes.append(f"task {the_task()}")
        task = the_task()
        if not str(task["result"]).startswith("CHILD 1"):
            out.lost_results = 1
        wakes = rows(w.laptop.db, "SELECT id FROM runs WHERE thread_id = ? AND origin = 'wake'", (parent,))
        out.duplicates = max(0, len(wakes) - 1)
        statuses = rows(w.box.db, "SELECT status FROM approvals ORDER BY created_at")
        assert [r["status"] for r in statuses] == ["cancelled", "approved"]
        for side in ("laptop", "box"):
            assert_invariant(w.side(side).db)
        out.settled = True
        row.add(out)
    assert row.clean, "\n".join(table(REPORT))
