"""Start slots (peerd/runtime/slots.py): at most N runs start at once, the rest wait their turn in
the order they came, and a launch's `kick` never waits for a slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.contracts import Thread
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.provider import ItemProduced, ProviderEvent, RunFinished, RunSpec
from peerd.runtime.runner import RunManager
from peerd.runtime.slots import StartSlots, default_start_slots
from peerd.store import projects
from peerd.store import threads as store
from peerd.store.db import Database
from tests.support.eventually import eventually


async def test_at_most_limit_slots_are_taken_and_waiters_go_in_order() -> None:
    slots = StartSlots(2)
    order: list[str] = []
    gates = {name: asyncio.Event() for name in "abcd"}

    async def run(name: str) -> None:
        async with slots.slot():
            order.append(name)
            await gates[name].wait()

    tasks = [asyncio.create_task(run(n)) for n in "abcd"]
    await asyncio.sleep(0)  # two turns of the loop: every task has asked for its slot
    await asyncio.sleep(0)
    assert order == ["a", "b"] and slots.taken == 2 and slots.waiting == 2
    gates["b"].set()
    await asyncio.sleep(0.01)  # a few turns: b's slot passes to c, and to nobody else
    assert order == ["a", "b", "c"] and slots.taken == 2
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks)
    assert order == ["a", "b", "c", "d"] and slots.taken == 0 and slots.waiting == 0


async def test_a_slot_given_back_early_frees_it_once() -> None:
    slots = StartSlots(1)
    async with slots.slot() as slot:
        slot.release()
        slot.release()  # idempotent: the first event, the end and the timer may all give it back
        assert not slot.held and slots.taken == 0
        async with slots.slot() as second:  # the freed slot is there for the next run at once
            assert second.held and slots.taken == 1
    assert slots.taken == 0


async def test_a_quiet_run_holds_its_slot_no_longer_than_the_hold() -> None:
    slots = StartSlots(1, hold_max_s=0.01)
    async with slots.slot() as slot:
        slot.release_after(slots.hold_max_s)
        async with asyncio.timeout(5):
            async with slots.slot():
                assert not slot.held


def test_the_default_is_half_the_cpus_at_least_one() -> None:
    assert default_start_slots() >= 1
    with pytest.raises(ValueError):
        StartSlots(0)


# --- the run manager ------------------------------------------------------------------------------


class _Run:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[ProviderEvent] = asyncio.Queue()

    @property
    def pgid(self) -> int | None:
        return None

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, RunFinished):
                return

    async def interrupt(self) -> None:
        self.queue.put_nowait(RunFinished("interrupted"))


class _Provider:
    """Started runs wait for the test to send their events."""

    name = "script"

    def __init__(self) -> None:
        self.started: dict[str, _Run] = {}
        self.changed = asyncio.Event()

    async def start(self, spec: RunSpec) -> _Run:
        run = self.started[spec.thread_id] = _Run()
        self.changed.set()
        return run


async def _launch(db: Database, project_id: str, cwd: Path, n: int) -> str:
    spec = store.NewThread(
        project_id=project_id,
        title=f"t{n}",
        provider="script",
        model=None,
        runtime_mode="full-access",
        interaction_mode="default",
        in_place=True,
        worktree_path=str(cwd),
        branch=None,
    )
    key = store.Idempotency("local", f"k{n}", "h")
    result, _ = await store.launch(db, key=key, spec=spec, prompt="go", now=1.0)
    return str(result["threadId"])


async def test_runs_start_one_slot_at_a_time_and_kick_never_waits(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "peerd.db")
    provider = _Provider()
    manager = RunManager(
        db, ChangeFeed(), {"script": provider}, state_dir=tmp_path / "state", tool_env={}, start_slots=1
    )
    manager.start_slots.hold_max_s = 60.0  # only the first event or the end gives a slot back here
    try:
        project = await projects.add(db, name="p", path=str(tmp_path), repository_key=None, now=1.0)
        ids = [await _launch(db, project.id, tmp_path, n) for n in range(3)]
        async with asyncio.timeout(5):  # every kick is answered while the one slot is taken
            for thread_id in ids:
                await manager.kick(thread_id)
        await eventually(
            lambda: ids[0] in provider.started, what="the first run started", within=5, every=0.005
        )
        await asyncio.sleep(0.05)  # a window for a wrong start: an absence has no event
        assert list(provider.started) == [ids[0]]  # the others wait for the slot
        assert manager.start_slots.waiting == 2
        statuses = [(await store.run_views(db, t))[0].status for t in ids]
        assert statuses == ["running", "starting", "starting"]
        # Its CLI's first event gives the slot back: the next run starts while the first goes on.
        provider.started[ids[0]].queue.put_nowait(ItemProduced("assistant_message", "hello"))
        await eventually(
            lambda: ids[1] in provider.started,
            what="the second run started (the first gave its slot back)",
            within=5,
            every=0.005,
        )
        assert ids[2] not in provider.started
        provider.started[ids[1]].queue.put_nowait(RunFinished("completed"))  # its end, too
        await eventually(
            lambda: ids[2] in provider.started, what="the third run started", within=5, every=0.005
        )
        for thread_id in ids:
            provider.started[thread_id].queue.put_nowait(RunFinished("completed"))
        for thread_id in ids:
            run_id = (await store.run_views(db, thread_id))[0].id
            await eventually(
                lambda run_id=run_id: not manager.is_executing(run_id),
                what="the run ended",
                within=5,
                every=0.005,
            )
        assert [(await store.run_views(db, t))[0].status for t in ids] == ["completed"] * 3
        assert manager.start_slots.taken == 0
    finally:
        await manager.shutdown()
        await db.close()


async def test_a_run_interrupted_while_it_waits_for_a_slot_ends_before_anything_starts(
    tmp_path: Path,
) -> None:
    db = await Database.open(tmp_path / "peerd.db")
    provider = _Provider()
    manager = RunManager(
        db, ChangeFeed(), {"script": provider}, state_dir=tmp_path / "state", tool_env={}, start_slots=1
    )
    manager.start_slots.hold_max_s = 60.0
    made: list[str] = []
    workspace = manager._workspace

    async def recorded(thread: Thread) -> Path:
        made.append(thread.id)
        return await workspace(thread)

    manager._workspace = recorded  # type: ignore[method-assign]
    try:
        project = await projects.add(db, name="p", path=str(tmp_path), repository_key=None, now=1.0)
        first, second = [await _launch(db, project.id, tmp_path, n) for n in range(2)]
        await manager.kick(first)
        await manager.kick(second)
        await eventually(
            lambda: first in provider.started and manager.start_slots.waiting == 1,
            what="the first run started and the second waiting for its slot",
            within=5,
            every=0.005,
        )
        await manager.interrupt(second, stop=False, reason="not now")
        provider.started[first].queue.put_nowait(RunFinished("completed"))  # its slot is free
        run = (await store.run_views(db, second))[0]
        await eventually(
            lambda: not manager.is_executing(run.id), what="the interrupted run ended", within=5, every=0.005
        )
        assert (await store.run_views(db, second))[0].status == "interrupted"
        assert second not in provider.started and made == [first]  # no worktree, no process
    finally:
        await manager.shutdown()
        await db.close()
