"""The daemon's events keep the semantics of the hooks they replaced: a publisher goes on only once
its handlers are done (`peerd/events.py`), here a Stop's answer and the tasks it stops."""

from __future__ import annotations

import asyncio
from typing import Any

from peerd import contracts as c
from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from peerd.events import ThreadStopped
from peerd.operations import Caller
from tests.helpers import wait_terminal


async def test_a_stop_is_answered_only_once_the_thread_stopped_handlers_are_done(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    assert daemon.parts is not None
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": "hi"})
    thread_id = launched["threadId"]
    await wait_terminal(client, thread_id, launched["runId"])
    entered, release = asyncio.Event(), asyncio.Event()

    async def stopping_slowly(event: ThreadStopped) -> None:
        assert (event.thread_id, event.reason) == (thread_id, "enough")
        entered.set()
        await release.wait()

    daemon.parts.events.subscribe(ThreadStopped, stopping_slowly)  # after `Delegation.stop_children`
    stop = c.ThreadInterrupt(stop=True, reason="enough")
    answer = asyncio.ensure_future(daemon.parts.ops.thread_interrupt(Caller.local(), thread_id, stop))
    await entered.wait()
    assert not answer.done(), "the Stop was answered before its delegated tasks were stopped"
    release.set()
    assert (await answer).queue_held is True
