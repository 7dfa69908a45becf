"""The daemon's event hub (`peerd/events.py`): typed, in order, awaited, errors to the publisher."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from peerd.events import Event, Events, RunEnded, RunQueued, ThreadStopped


async def test_handlers_of_the_type_run_in_the_order_they_subscribed_sync_and_async() -> None:
    events, heard = Events(), []

    async def later(event: RunEnded) -> None:
        await asyncio.sleep(0)  # it suspends: the publisher still waits for it
        heard.append(f"async {event.thread_id}")

    events.subscribe(RunEnded, lambda event: heard.append(f"first {event.thread_id}"))
    events.subscribe(RunEnded, later)
    events.subscribe(RunEnded, lambda event: heard.append(f"last {event.thread_id}"))
    events.subscribe(RunQueued, lambda event: heard.append("another type"))
    await events.publish(RunEnded("thr_1"))
    assert heard == ["first thr_1", "async thr_1", "last thr_1"]
    assert events.subscribers(RunEnded) == 3 and events.subscribers(ThreadStopped) == 0


async def test_the_publisher_goes_on_only_once_every_handler_is_done() -> None:
    events, released = Events(), asyncio.Event()
    events.subscribe(ThreadStopped, lambda event: released.wait())  # a coroutine: awaited
    publishing = asyncio.ensure_future(events.publish(ThreadStopped("thr_1", None)))
    await asyncio.sleep(0)
    assert not publishing.done()  # as when the caller awaited a hook of its own
    released.set()
    await publishing


async def test_a_handlers_error_reaches_the_publisher_and_the_rest_are_not_called() -> None:
    events, heard = Events(), []

    def refuse(event: RunQueued) -> None:
        raise RuntimeError(f"no {event.thread_id}")

    events.subscribe(RunQueued, refuse)
    events.subscribe(RunQueued, heard.append)
    with pytest.raises(RuntimeError, match="no thr_1"):
        await events.publish(RunQueued("thr_1"))
    assert heard == []


async def test_only_the_exact_type_is_delivered_and_nothing_without_subscribers() -> None:
    @dataclasses.dataclass(frozen=True)
    class Special(RunEnded):
        pass

    events, heard = Events(), []
    events.subscribe(RunEnded, heard.append)
    await events.publish(Special("thr_1"))
    await events.publish(ThreadStopped("thr_1", "why"))  # no one listens: nothing happens
    assert heard == []


def test_events_are_frozen_records() -> None:
    event = ThreadStopped("thr_1", "why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.reason = "other"  # type: ignore[misc]
    assert isinstance(event, Event) and event == ThreadStopped("thr_1", "why")
