"""The one clock (`peerd/core/clock.py`), its fake (`tests/fakeclock.py`), and the retry loops
that wait on it, driven by the fake: each waits its schedule's delays, in order, without real time
(the follower's: tests/tasks/test_follower_machine.py and tests/integration/test_fake_clock.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from peerd.core.backoff import Backoff
from peerd.core.clock import SYSTEM_CLOCK, Clock, SystemClock
from peerd.errors import PeerUnreachable, StorageUnavailable
from peerd.handoff import service as handoff_service
from peerd.handoff.machine import RETRY
from peerd.handoff.service import HandoffService
from peerd.orchestrate.context import UNREACHABLE_BACKOFF, OrchestrationContext
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.runner import STORE_RETRY, RunManager
from peerd.tasks.timing import Retrier
from tests.fakeclock import T0, FakeClock
from tests.support.eventually import eventually


def test_the_system_clock_is_the_machines() -> None:
    clock: Clock = SystemClock()
    assert abs(clock.wall() - time.time()) < 5 and abs(clock() - time.time()) < 5
    before = time.monotonic()
    assert before <= clock.monotonic() <= time.monotonic()


async def test_the_system_clock_sleeps_or_is_woken() -> None:
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    began = loop.time()
    loop.call_later(0.05, wake.set)
    await SYSTEM_CLOCK.sleep(30, wake)
    assert loop.time() - began < 5, "the event ended the sleep"
    await SYSTEM_CLOCK.sleep(-1)  # nothing to wait for


@pytest.mark.parametrize("clock", [SYSTEM_CLOCK, FakeClock()], ids=["system", "fake"])
async def test_a_sleep_cancelled_as_it_is_woken_is_cancelled(clock: Clock) -> None:
    """A stop that lands as the sleep's event is set stops it (`asyncio.wait_for` on 3.11 swallowed
    it, and a follower stopped at that moment kept running while the daemon waited for it)."""
    wake = asyncio.Event()
    sleeping = asyncio.ensure_future(clock.sleep(30, wake))
    for _ in range(3):
        await asyncio.sleep(0)
    wake.set()
    assert sleeping.cancel(), "still sleeping"
    with pytest.raises(asyncio.CancelledError):
        await sleeping


def test_the_fake_moves_only_when_told() -> None:
    clock = FakeClock()
    assert (clock(), clock.wall(), clock.monotonic()) == (T0, T0, 1000.0)
    clock.advance(30)
    assert (clock.wall(), clock.monotonic()) == (T0 + 30, 1030.0)
    clock.step_wall(-600)
    assert (clock.wall(), clock.monotonic()) == (T0 - 570, 1030.0), "a wall step moves no interval"
    with pytest.raises(ValueError, match="only goes forward"):
        clock.advance(-1)


async def test_the_fake_sleeps_until_time_is_moved_past_its_end_or_it_is_woken() -> None:
    clock = FakeClock()
    slept = asyncio.ensure_future(clock.sleep(10))
    assert await clock.jump() == 10 and clock.monotonic() == 1010.0
    await asyncio.wait_for(slept, 1)
    wake = asyncio.Event()
    woken = asyncio.ensure_future(clock.sleep(99, wake))
    await asyncio.sleep(0)
    assert clock.sleeping == [99]
    clock.advance(50)
    await asyncio.sleep(0)
    assert not woken.done() and clock.sleeping == [49]
    wake.set()
    await asyncio.wait_for(woken, 1)
    assert clock.sleeping == [] and clock.slept == [10, 99]


async def test_a_live_runs_store_write_is_retried_on_its_schedule_until_it_goes_through(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    manager = RunManager(
        None,  # type: ignore[arg-type]  # `_write` touches no store of its own
        ChangeFeed(),
        {},
        state_dir=tmp_path / "state",
        tool_env={},
        clock=clock,
    )
    failures = 9

    async def op() -> str:
        nonlocal failures
        if failures:
            failures -= 1
            raise StorageUnavailable("disk full")
        return "written"

    write = asyncio.ensure_future(manager._write(op))
    waited = [await clock.jump() for _ in range(9)]
    assert await asyncio.wait_for(write, 1) == "written"
    assert waited == [0.5, 1, 2, 4, 8, 16, 30, 30, 30] == [STORE_RETRY.delay(n) for n in range(1, 10)]
    assert manager.store_retries == 9


async def test_a_store_write_waiting_to_be_retried_gives_up_at_shutdown(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = RunManager(
        None,  # type: ignore[arg-type]
        ChangeFeed(),
        {},
        state_dir=tmp_path / "state",
        tool_env={},
        clock=clock,
    )

    async def op() -> None:
        raise StorageUnavailable("disk full")

    write = asyncio.ensure_future(manager._write(op))
    await eventually(
        lambda: clock.sleeping, what="the write waiting on the clock to be retried", within=5, every=0.001
    )
    manager._closing = True
    manager._closed.set()  # what `shutdown` sets: the wait ends without the clock moving
    with pytest.raises(StorageUnavailable):
        await asyncio.wait_for(write, 1)
    assert clock.monotonic() == 1000.0


async def test_a_tasks_store_work_is_retried_from_2_s_to_30_s_with_jitter() -> None:
    clock = FakeClock()
    retrier = Retrier(clock=clock, jitter=lambda: 0.5)
    failures = 6  # the first try and five retries fail
    done = asyncio.Event()

    async def work() -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise StorageUnavailable("disk full")
        done.set()

    assert await retrier.run("wake:thr_1", work) is False, "left to the retries"
    waited = [await clock.jump() for _ in range(6)]
    await asyncio.wait_for(done.wait(), 1)
    assert waited == [2.5, 4.5, 8.5, 16.5, 30.5, 30.5]
    await retrier.close()


class _Ops:
    """What the orchestration and move loops read of `Operations` here: the clock, the feed's state,
    and a wait that fails while the box is away."""

    def __init__(self, clock: FakeClock, away: int) -> None:
        self.clock = clock
        self.feed = ChangeFeed()
        self.away = away

    async def thread_wait(self, caller: object, thread_id: str, req: object) -> SimpleNamespace:
        if self.away:
            self.away -= 1
            raise PeerUnreachable("the box is away")
        return SimpleNamespace(terminal=True, status="completed")


async def test_an_orchestration_waits_out_a_box_that_is_away_from_2_s_to_a_minute(tmp_path: Path) -> None:
    clock = FakeClock()
    ops = _Ops(clock, away=8)
    ctx = OrchestrationContext(
        None,  # type: ignore[arg-type]  # the wait reads no store
        ops.feed,
        ops,  # type: ignore[arg-type]
        worktrees_dir=tmp_path,
        clock=clock,
    )
    wait = asyncio.ensure_future(ctx.wait("orc_1", "thr_1", "run_1", "box"))
    waited = [await clock.jump() for _ in range(8)]
    assert await asyncio.wait_for(wait, 1) == "completed"
    assert waited == [2, 4, 8, 16, 32, 60, 60, 60] == [UNREACHABLE_BACKOFF.delay(n) for n in range(1, 9)]


async def test_a_moves_failed_steps_are_retried_from_1_s_and_a_step_that_goes_through_starts_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    service = HandoffService.__new__(HandoffService)  # only its driver loop, on a fake `ops`
    service.ops = _Ops(clock, away=0)  # type: ignore[assignment]
    service.db = None  # type: ignore[assignment]
    service._closed = False
    steps = iter(["away", "away", "away", "done", "away", "away", "moved"])

    async def advance(move_id: str) -> bool:
        step = next(steps)
        if step == "away":
            raise PeerUnreachable("the box is away")
        return step == "moved"

    async def row(db: object, move_id: str) -> dict[str, object]:
        return {"snapshot": None, "there_branch": None, "there_thread_id": None}

    monkeypatch.setattr(service, "_advance", advance)
    monkeypatch.setattr(handoff_service.moves, "get", row)
    run = asyncio.ensure_future(service._run("mov_1"))
    waited = [await clock.jump() for _ in range(5)]
    await asyncio.wait_for(run, 1)
    assert waited == [1, 2, 4, 1, 2], "1 s doubling; a step that went through starts it again"
    assert Backoff(first=1.0, cap=60.0) == RETRY and RETRY.delay(30) == 60.0
