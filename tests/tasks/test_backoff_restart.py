"""Issue 26, case 9, across a real restart: the laptop's wall clock stepped back after its
follower stored a backoff. Two daemons in this loop (the durability suite's `m`): the box is down,
a task's launch backs off and the backoff is stored; the laptop stops; its stored row is made what
a step back of 600 s leaves (the next try 600 s later than the wall clock now says, the delay
unchanged); the box and the laptop start. The restarted follower waits at most the delay
(`tasks/store.py:backoff_wait`), not until the stored wall time: the launch reaches the box long
before it (read from the box's thread, not timed here)."""

from __future__ import annotations

import contextlib
import sqlite3
import time

import pytest

from peerd.paths import Paths
from peerd.tasks import store as task_store
from tests.helpers import script, wait_terminal
from tests.support.delegation import delegate, runs_script, tasks_of
from tests.support.eventually import eventually
from tests.support.machines import Machines, task_ended

STEP_S = 600.0


@pytest.mark.slow
async def test_a_restart_after_the_wall_clock_stepped_back_waits_the_delay_not_the_step(m: Machines) -> None:
    await m.stop("box")
    step = delegate(
        task=script({"reply": "BACK"}),
        target={"environmentId": m.box_id, "projectId": m.there["id"]},
        clientRequestId="clock-1",
    )
    parent, run = await m.parent(runs_script([step]))
    await wait_terminal(m.lc, parent, run)
    [task] = await tasks_of(m.lc, parent)

    async def backed_off() -> bool:
        return await task_store.backoff(m.laptop.db, m.box_id) != (0, 0.0)

    await eventually(backed_off, what="the laptop's stored backoff for the link", within=20)
    await m.stop("laptop")
    with contextlib.closing(sqlite3.connect(Paths(m.home("laptop")).db)) as db:
        db.execute("UPDATE link_backoff SET next_at = next_at + ? WHERE env_id = ?", (STEP_S, m.box_id))
        db.commit()
        [(stepped_next_at, delay)] = db.execute(
            "SELECT next_at, delay_s FROM link_backoff WHERE env_id = ?", (m.box_id,)
        ).fetchall()
    assert delay is not None and 0 < delay < 60, "the delay is stored beside the wall time"
    await m.start("box")
    await m.start("laptop")
    done = await task_ended(m.lc, parent, task["taskId"])
    assert (done["status"], done["result"]) == ("completed", "BACK")
    [there] = await m.box_threads()
    assert there["createdAt"] < stepped_next_at - STEP_S / 2, "the restart waited the delay, not the step"
    assert done["endedAt"] >= done["createdAt"]
    assert time.time() < stepped_next_at
