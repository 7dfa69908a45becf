"""The follower's sans-IO machine driven by hand (a machine, open tasks, the watch it asks for, a
synced start), a fault hook that holds the box's look at its replies (`Gate`), and whether a live
follower has a poll on the wire (`poll_in_flight`)."""

from __future__ import annotations

import asyncio

from peerd.daemon import Daemon
from peerd.tasks.machine import FollowerMachine, OpenTask, Poll, Subscribe

T0 = 1_000_000.0
CHUNK = 50.0


def machine(jitter: float = 0.0) -> FollowerMachine:
    return FollowerMachine(chunk_s=CHUNK, jitter=lambda: jitter)


def running(n: int = 1, *, stop_owed: bool = False) -> list[OpenTask]:
    return [OpenTask(f"t{i}", "running", f"th{i}", f"run{i}", stop_owed, "box") for i in range(n)]


def watch_of(actions: list[object]) -> Poll:
    [action] = actions
    assert isinstance(action, Poll), action
    return action


def synced(m: FollowerMachine, now: float, tasks: list[OpenTask]) -> list[object]:
    """Plan past the subscription's check (the box confirms it holds the set): the next step."""
    actions = m.plan(now, tasks)
    while actions and isinstance(actions[0], Subscribe):
        m.subscribed(now, True)
        actions = m.plan(now)
    return list(actions)


class Gate:
    """A fault hook in the look's window: the first read of a reply blocks until released (or the
    look is cancelled: `cut` is set then)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cut = asyncio.Event()
        self.calls = 0

    def wrap(self, real: object) -> object:
        async def last_reply(*args: object) -> str | None:
            self.calls += 1
            if self.calls == 1:
                self.entered.set()
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.cut.set()
                    raise
            return await real(*args)  # type: ignore[operator]

        return last_reply


def poll_in_flight(laptop: Daemon, box_id: str) -> bool:
    """Whether the laptop's follower of `box_id` has a poll with a cursor in flight: not the link's
    first, which the box answers at once with its cursor (`resynced`)."""
    follower = laptop.followers._followers.get(box_id) if laptop.followers is not None else None
    return (
        follower is not None
        and follower.machine.polling
        and follower.machine.sub.settled
        and follower.machine.sub.cursor is not None
    )
