"""The laptop's follower over the change feed, with two real daemons (TLS on loopback, the scripted
provider): a new task joins the poll in flight instead of restarting it, a restart of the laptop
re-syncs with one request (a hash), and one of the box with a lost subscription sends the set
once. Each test names the rule it guards."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from peerd.tasks import feedstore
from peerd.tasks.feed import FeedHub
from peerd.tasks.subscription import set_hash
from tests.helpers import script, wait_terminal
from tests.support.delegation import wait_task
from tests.support.eventually import eventually
from tests.support.follower import poll_in_flight
from tests.support.machines import WAIT_S, Machines, delegated_and_running


def box_hub(m: Machines) -> FeedHub:
    box = m._daemons["box"]
    assert box.followers is not None
    return box.followers.delegation.ender.watcher.hub


async def polling(m: Machines) -> None:
    await eventually(
        lambda: poll_in_flight(m.laptop, m.box_id), what="the follower's settled poll in flight", within=20
    )


async def test_a_new_task_joins_the_poll_in_flight_without_restarting_it(
    m: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rules: a new task joins the watch without restarting it (one short subscription request
    beside the poll, no poll abandoned); the poll in flight answers the moment the new task's run
    settles."""
    assert m.laptop.followers is not None
    m.laptop.followers.watch_chunk_s = 50.0  # a restarted poll could not answer within the test
    await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "held")
    await polling(m)
    follower = m.follower()
    assert follower is not None
    abandoned: list[str] = []
    forwarder = m.delegation.forwarder
    real_call = forwarder.call

    async def spy(env_id: str, method: str, path: str, **kw: Any) -> Any:
        try:
            return await real_call(env_id, method, path, **kw)
        except asyncio.CancelledError:
            abandoned.append(path)
            raise

    monkeypatch.setattr(forwarder, "call", spy)
    reads: list[str] = []
    real_open_tasks = feedstore.open_tasks

    async def counted(db: Any, env_id: str) -> Any:
        reads.append(env_id)
        return await real_open_tasks(db, env_id)

    monkeypatch.setattr(feedstore, "open_tasks", counted)
    polls, syncs = follower.requests, follower.syncs
    parent, task = await delegated_and_running(m, script({"reply": "SECOND"}), "quick")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done = await asyncio.wait_for(wait_task(m.lc, parent, task["taskId"], while_status="running"), WAIT_S)
    assert (done["status"], done["result"]) == ("completed", "SECOND")
    assert loop.time() - t0 < 10.0, "answered by the poll in flight, not at the end of a 50 s chunk"
    assert follower is m.follower(), "the same follower"
    assert follower.syncs - syncs >= 1, "the new run joined by a subscription change"

    async def polled_again() -> bool:
        return follower.requests > polls

    await eventually(polled_again, what="another poll of the follower", within=20)
    assert abandoned == [], "no poll was abandoned for the new task"
    assert reads == [], "the link's open tasks are read once, at the start: not again per task"
    assert follower.requests - polls == 1, "the poll in flight answered; one new poll after it"


async def test_a_laptop_restart_resyncs_with_one_request(m: Machines, tmp_path: Path) -> None:
    """Rule: resume at start-up is one subscription sync per link: the laptop sends its set's
    hash, the box finds it holds that set, and nothing more is sent before the poll."""
    for i in range(5):
        await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), f"r{i}")
    await polling(m)
    await m.stop("laptop")
    await m.start("laptop")

    async def resumed() -> bool:
        follower = m.follower()
        return follower is not None and follower.requests >= 1

    await eventually(resumed, what="a poll of the restarted laptop's follower", within=20)
    follower = m.follower()
    assert follower is not None
    assert follower.syncs == 1, "one request, the hash only: the box still holds the set"
    assert len(follower.machine.sub.want) == 5 and follower.machine.sub.settled


async def test_a_box_that_lost_the_subscription_gets_the_whole_set_once(
    m: Machines, tmp_path: Path, signals: Path
) -> None:
    """Rule: on a mismatch the box says so and the laptop sends its whole set once; the tasks are
    followed as before (one completes when its child ends)."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(
        m, script({"wait_for_file": str(hold)}, {"reply": "LATE"}), "k"
    )
    await polling(m)
    await m.stop("laptop")
    await m.stop("box")
    with sqlite3.connect(m.home("box") / "peerd.db") as con:
        con.execute("DELETE FROM feed_runs")
    await m.start("box")
    await m.start("laptop")

    async def resynced() -> bool:
        follower = m.follower()
        return follower is not None and follower.machine.sub.settled and follower.requests >= 1

    await eventually(resynced, what="the restarted follower settled and polling", within=20)
    follower = m.follower()
    assert follower is not None and follower.syncs == 2, "the hash (a mismatch), then the set once"
    [link] = box_hub(m)._links.values()
    assert set(link.state.runs) == {task["remoteChild"]["runId"]}
    hold.write_text("go")
    done = await asyncio.wait_for(wait_task(m.lc, parent, task["taskId"], while_status="running"), WAIT_S)
    # The box's stop cut the child; it went on in a continuation, whose reply is the result.
    assert done["status"] == "completed" and done["result"], done


async def test_removing_a_project_there_reports_its_followed_runs_gone(m: Machines) -> None:
    """Rule: a followed run whose thread goes with its project is reported gone at once (the
    removal notifies its threads), even when nothing else about the thread changes."""
    peers = m.laptop.peers
    assert peers is not None

    async def there(method: str, path: str, **kw: Any) -> Any:
        return await peers.call(m.box_id, method, path, **kw)

    first = await there(
        "POST", "/v1/threads", body={"projectId": m.there["id"], "prompt": script({"reply": "one"})}
    )
    thread, run = first["threadId"], first["runId"]
    await wait_terminal(m.bc, thread, run)
    await there("POST", "/v1/feed/subscription", body={"add": [run], "setHash": set_hash([run])})
    settled = await there("POST", "/v1/feed/changes", body={"timeout": 10})
    assert [(r["runId"], r["settled"]) for r in settled["runs"]] == [(run, True)]
    await m.bc.call("POST", f"/v1/threads/{thread}/archive")
    looked = await there("POST", "/v1/feed/changes", body={"cursor": settled["cursor"], "timeout": 0})
    assert looked["runs"] == [], "archived: the same report, nothing new"
    await m.bc.call("DELETE", f"/v1/projects/{m.there['id']}")
    gone = await asyncio.wait_for(
        there("POST", "/v1/feed/changes", body={"cursor": looked["cursor"], "timeout": 20}), 10
    )
    assert [(r["runId"], r["found"]) for r in gone["runs"]] == [(run, False)]
