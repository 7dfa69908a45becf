"""Issue 32: a wait on a pull request survives kill -9 of the box that holds it and of the laptop
that follows it, and wakes each side once. Real `peerd serve` subprocesses (a laptop and a box
linked on loopback) and a stub `gh` on their PATH (tests/support/stubgh.py): the laptop's parent
delegates to the box a coder that waits for its pull request's checks; both daemons are killed
-9 while the wait is watching, CI fails while they are down, and after the restarts the box's
child is woken once with the failing checks, its task ends with that wake's reply, and the
laptop's parent is woken once with it. Both stores hold nothing the sweep would fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.harness import READ_AND_REPORT, delegate, linked_world, rows, runs_script, until
from tests.faults.invariant import assert_invariant
from tests.support.eventually import eventually
from tests.support.stubgh import StubGh, failing, pending

pytestmark = pytest.mark.slow  # two daemons, started twice


async def test_a_box_wait_survives_kill_9_of_both_sides_and_wakes_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gh = StubGh.install(tmp_path / "bin", monkeypatch)  # on the PATH both `peerd serve` inherit
    gh.play(pending())
    config = tmp_path / "config.toml"
    config.write_text("[waits]\npoll_seconds = 0.1\n")
    monkeypatch.setenv("PEERD_CONFIG", str(config))
    async with linked_world(tmp_path / "w") as w:
        child = runs_script(
            [{"tool": {"name": "wait_for_github", "arguments": {"pr": "7", "until": "checks"}, "check": True}},
             {"reply": "waiting on CI"}],
            [{"reply": "FIXED AFTER CI"}],
        )  # fmt: skip
        go = delegate(task=child, target={"environmentId": w.box_id}, clientRequestId="wait-1")
        prompt = runs_script([go, {"reply": "sent"}], READ_AND_REPORT)
        parent = (
            await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": prompt})
        )["threadId"]

        def box_wait() -> list[object]:
            return rows(w.box.db, "SELECT * FROM waits WHERE status = 'watching' AND polls >= 1")

        await eventually(box_wait, what="the box watching its child's pull request", within=60)
        w.box.kill9()
        w.laptop.kill9()
        gh.play(failing())  # CI failed while both were down
        await w.box.restart()
        await w.laptop.restart()

        def task_row() -> dict[str, object]:
            (task,) = rows(w.laptop.db, "SELECT * FROM tasks WHERE parent_thread_id = ?", (parent,))
            return dict(task)

        assert await until(lambda: _ended(task_row()), timeout=60), task_row()
        task = task_row()
        assert (task["status"], task["result"]) == ("completed", "FIXED AFTER CI")
        (wait,) = rows(w.box.db, "SELECT * FROM waits")
        assert wait["status"] == "delivered" and wait["outcome"] == "failed"
        child_runs = rows(
            w.box.db, "SELECT origin FROM runs WHERE thread_id = ? ORDER BY number", (wait["thread_id"],)
        )
        assert [r["origin"] for r in child_runs] == ["user", "wake"]  # the box's child woken once

        async def parent_woken() -> bool:
            runs = rows(w.laptop.db, "SELECT status FROM runs WHERE thread_id = ? ORDER BY number", (parent,))
            return len(runs) == 2 and runs[1]["status"] == "completed"

        assert await until(parent_woken, timeout=60)
        parent_runs = rows(
            w.laptop.db, "SELECT origin FROM runs WHERE thread_id = ? ORDER BY number", (parent,)
        )
        assert [r["origin"] for r in parent_runs] == ["user", "wake"]  # the laptop's parent woken once
        assert_invariant(w.box.db)
        assert_invariant(w.laptop.db)


async def _ended(task: dict[str, object]) -> bool:
    return task["status"] not in ("pending", "running")
