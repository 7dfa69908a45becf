"""A daemon given a clock the test moves (`Daemon(config, clock=FakeClock())`): the one clock reaches
the parts that wait, so a link's backoff is driven through a real laptop and a real box (TLS, the
store, the follower) without waiting for it.

Rule (issue 26; `tasks/rules.py:LINK_BACKOFF`): a box that does not answer is retried after 2 s,
4 s, 8 s ... at most 5 minutes, plus less than 1 s of jitter, with no attempt limit; what is stored
is the delay; the first answer after the box is back ends the backoff and the task completes.
Here 12 failed tries (about 25 minutes of backoff) take a few seconds."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from peerd.api.listener_rules import ListenerLimits
from peerd.config import Config
from peerd.daemon import Daemon, DaemonConfig
from tests.fakeclock import FakeClock
from tests.helpers import client_for, script, wait_terminal
from tests.support.delegation import delegate, runs_script, tasks_of
from tests.support.eventually import eventually
from tests.support.machines import CHUNK_S, Machines, setup_repos, started, task_ended

pytestmark = pytest.mark.slow  # two daemons

TRIES = 12  # the cap (300 s) is reached at the 9th


class FakeClockLaptop(Machines):
    """The durability suite's laptop and box, the laptop on `clock`."""

    def __init__(self, tmp: Path, clock: FakeClock) -> None:
        super().__init__(tmp)
        self.clock = clock

    async def start(self, side: str) -> None:
        if side != "laptop":
            await super().start(side)
            return
        config = DaemonConfig(
            home=self.home(side),
            label="laptop",
            listen="127.0.0.1:0",
            watch_chunk_s=CHUNK_S,
            settings=Config(),
            listener_limits=ListenerLimits(),
        )
        daemon = Daemon(config, clock=self.clock)
        stack = contextlib.AsyncExitStack()
        stack.push_async_callback(daemon.shutdown)
        try:
            await daemon.start()
            self._daemons[side] = daemon
            self._clients[side] = await stack.enter_async_context(client_for(self.home(side)))
        except BaseException:
            await stack.aclose()
            raise
        self._stacks[side] = stack


async def stored_backoff(m: Machines, attempts: int) -> float:
    """Once the laptop has stored its `attempts`-th failed try: the delay it stored."""
    query = "SELECT attempts, delay_s FROM link_backoff WHERE env_id = ?"
    found: list[float] = []

    async def stored() -> bool:
        row = await m.laptop.db.fetchone(query, (m.box_id,)) if m.laptop.db else None
        if row is not None and int(row["attempts"]) == attempts:
            found.append(float(row["delay_s"]))
        return bool(found)

    await eventually(stored, what="the link's stored backoff", within=20.0)
    return found[0]


async def test_a_laptop_on_a_fake_clock_backs_off_to_five_minutes_and_the_box_back_ends_it(
    tmp_path: Path,
) -> None:
    clock = FakeClock(wall=time.time())  # its wall time near the box's: tokens are judged by both
    await setup_repos(tmp_path)
    async with started(FakeClockLaptop(tmp_path, clock), tmp_path) as m:
        await m.stop("box")
        step = delegate(
            task=script({"reply": "BACK"}),
            target={"environmentId": m.box_id, "projectId": m.there["id"]},
            clientRequestId="fake-clock-1",
        )
        parent, run = await m.parent(runs_script([step]))
        await wait_terminal(m.lc, parent, run)
        [task] = await tasks_of(m.lc, parent)
        assert task["status"] == "pending", "the box is down: the launch is owed"

        delays = []
        for attempts in range(1, TRIES + 1):
            delay = await stored_backoff(m, attempts)
            delays.append(delay)
            if attempts < TRIES:
                clock.advance(delay)  # the follower's sleep ends: it tries again, and fails
        for n, delay in enumerate(delays, start=1):
            base = min(2.0 * 2 ** (n - 1), 300.0)
            assert base <= delay < base + 1.0, f"try {n}: {delay:.2f} s, not {base:g} s plus < 1 s"
            # jittered, past the cap too (a draw of exactly 0 has odds of 2**-53)
            assert delay > base, f"try {n}: {delay:.2f} s, no jitter"
        assert max(delays) < 301.0, "never more than 5 minutes (and the jitter)"

        await m.start("box")
        clock.advance(delays[-1])  # the next try reaches the box: the launch goes through
        done = await task_ended(m.lc, parent, task["taskId"])
        assert (done["status"], done["result"]) == ("completed", "BACK")

        async def cleared() -> bool:
            assert m.laptop.db is not None
            return (
                await m.laptop.db.fetchone("SELECT 1 FROM link_backoff WHERE env_id = ?", (m.box_id,)) is None
            )

        await eventually(cleared, what="the link's backoff cleared", within=20.0)
