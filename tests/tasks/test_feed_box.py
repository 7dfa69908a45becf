"""The box's change feed (`FeedHub`) over a real store, without sockets: the subscription is
durable, a poll answers the moment a followed run settles with only that run, a change costs a
look at one thread, and a restart of the box re-syncs with the poll itself. Each test names the
rule it guards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.core.access import LinkContext, ModeCap
from peerd.operations import Caller
from peerd.runtime.feed import ChangeFeed
from peerd.store.db import Database
from peerd.tasks import feedstore
from peerd.tasks.feed import FeedHub, client_key
from peerd.tasks.feedwire import FeedPoll, FeedSubscribe
from peerd.tasks.subscription import set_hash
from tests.support.eventually import eventually
from tests.support.inflight import await_chain

N = 2_000  # followed runs: a wake must not cost O(N)


def link(client_id: str = "cli_a") -> Caller:
    return Caller.for_link(LinkContext(client_id, "laptop", "auto", ModeCap("auto", "default")))


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "box.db")
    now = time.time()
    async with database.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', ?)", (now,)
        )
        for i in range(N):
            origin = "cli_b" if i == N - 1 else "cli_a"  # the last thread is another link's
            await tx.execute(
                "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
                " in_place, worktree_path, created_at, updated_at, link_origin)"
                " VALUES (?, 'prj_1', 't', 'script', 'auto', 'default', 0, '/w', ?, ?, ?)",
                (f"thr_{i}", now, now, origin),
            )
            await tx.execute(
                "INSERT INTO runs (id, thread_id, number, status, prompt, created_at, reason)"
                " VALUES (?, ?, 1, 'running', 'x', ?, NULL)",
                (f"run_{i}", f"thr_{i}", now),
            )
    yield database
    await database.close()


async def end_run(db: Database, feed: ChangeFeed, i: int, status: str = "completed") -> None:
    async with db.write() as tx:
        await tx.execute("UPDATE runs SET status = ?, reason = 'done' WHERE id = ?", (status, f"run_{i}"))
    feed.changed(f"thr_{i}")


async def subscribed(hub: FeedHub, runs: list[str], caller: Caller | None = None) -> bool:
    answer = await hub.subscribe(caller or link(), FeedSubscribe(add=runs, set_hash=set_hash(runs)))
    return answer.in_sync


def parked(poll: asyncio.Task[Any]) -> bool:
    """Whether the box's poll waits for a change (its look done, nothing to answer yet)."""
    chain = await_chain(poll)
    return chain[:1] == ["FeedHub.changes"] and "ChangeFeed.wait_any" in chain


async def test_a_poll_answers_the_moment_a_followed_run_settles_with_only_that_run(db: Database) -> None:
    """Rules: the box answers the moment any followed run changes (in-memory notification, no
    polling loop), with only the changed runs; a wake looks at one thread, whatever N is."""
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    runs = [f"run_{i}" for i in range(N - 1)]
    assert await subscribed(hub, runs)
    first = await hub.changes(link(), FeedPoll(timeout=0))
    assert first.resynced and first.runs == [], "nothing settled yet"
    looks = hub.looks
    polling = asyncio.ensure_future(hub.changes(link(), FeedPoll(cursor=first.cursor, timeout=20)))
    await eventually(lambda: parked(polling), what="the poll waiting for a change")
    assert not polling.done()
    t0 = time.monotonic()
    await end_run(db, feed, 7)
    answer = await asyncio.wait_for(polling, 5)
    assert time.monotonic() - t0 < 1.0
    assert [(r.run_id, r.settled, r.status, r.result_run_id) for r in answer.runs] == [
        ("run_7", True, "completed", "run_7")
    ]
    assert not answer.resynced and not answer.timed_out
    assert hub.looks - looks == 1, "one thread looked at for one change"
    again = await hub.changes(link(), FeedPoll(cursor=answer.cursor, timeout=0))
    assert again.runs == [] and again.timed_out


async def test_the_subscription_survives_a_box_restart_and_the_poll_resyncs(db: Database) -> None:
    """Rules: the subscription is durable (keyed by the link); after the box restarts, the
    laptop's old cursor is answered at once with every settled run and the box's set hash."""
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    runs = ["run_1", "run_2", "run_3"]
    assert await subscribed(hub, runs)
    cursor = (await hub.changes(link(), FeedPoll(timeout=0))).cursor
    await end_run(db, feed, 2)  # while the box is "down": nobody is told
    restarted = FeedHub(db, ChangeFeed())
    answer = await restarted.changes(link(), FeedPoll(cursor=cursor, timeout=10))
    assert answer.resynced and answer.set_hash == set_hash(runs)
    assert [r.run_id for r in answer.runs] == ["run_2"]


async def test_a_changed_thread_is_looked_at_even_when_no_poll_is_in_flight(db: Database) -> None:
    """Rule: the feed listens whether a poll is in flight or not: a run that settles between two
    polls is in the next one's answer."""
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    assert await subscribed(hub, ["run_1", "run_2"])
    cursor = (await hub.changes(link(), FeedPoll(timeout=0))).cursor
    await end_run(db, feed, 1, "failed")
    answer = await hub.changes(link(), FeedPoll(cursor=cursor, timeout=10))
    assert [(r.run_id, r.status, r.reason) for r in answer.runs] == [("run_1", "failed", "done")]


async def test_a_revocation_ends_a_poll_at_once(db: Database) -> None:
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    assert await subscribed(hub, ["run_1"])
    cursor = (await hub.changes(link(), FeedPoll(timeout=0))).cursor
    polling = asyncio.ensure_future(hub.changes(link(), FeedPoll(cursor=cursor, timeout=30)))
    await eventually(lambda: parked(polling), what="the poll waiting for a change")
    feed.changed(client_key("cli_a"))
    answer = await asyncio.wait_for(polling, 2)
    assert answer.timed_out and answer.runs == []


async def test_a_removed_thread_is_reported_gone(db: Database) -> None:
    """Rule: a followed run whose thread is gone (its project removed) is reported `found: false`."""
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    assert await subscribed(hub, ["run_5"])
    cursor = (await hub.changes(link(), FeedPoll(timeout=0))).cursor
    async with db.write() as tx:
        await tx.execute("DELETE FROM threads WHERE id = 'thr_5'")
    feed.changed("thr_5")
    answer = await hub.changes(link(), FeedPoll(cursor=cursor, timeout=5))
    assert [(r.run_id, r.found) for r in answer.runs] == [("run_5", False)]


async def test_the_store_reads_only_the_links_own_threads(db: Database) -> None:
    """Rule (each read on its own): resolving followed runs and reading threads for settlement
    both keep to threads the link started; another link's thread is not there for it."""
    theirs = N - 1
    assert await feedstore.resolve(db, "cli_a", [f"run_{theirs}", "run_1"]) == {"run_1": "thr_1"}
    assert set(await feedstore.thread_facts(db, "cli_a", [f"thr_{theirs}", "thr_1"])) == {"thr_1"}


async def add_reply(db: Database, i: int, text: str) -> None:
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO items (id, thread_id, run_id, position, kind, text, data, created_at)"
            " VALUES (?, ?, ?, 0, 'assistant_message', ?, '{}', 0)",
            (f"itm_{i}", f"thr_{i}", f"run_{i}", text),
        )


async def test_a_settled_runs_reply_comes_with_its_report_unless_it_is_long(db: Database) -> None:
    """Rule: a wake costs no further request: the result run's reply (up to 16,000 characters)
    comes with the report; a longer one is left to the laptop to read whole."""
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    assert await subscribed(hub, ["run_1", "run_2", "run_3"])
    cursor = (await hub.changes(link(), FeedPoll(timeout=0))).cursor
    await add_reply(db, 1, "short reply")
    await add_reply(db, 2, "x" * 16_001)
    for i in (1, 2, 3):
        await end_run(db, feed, i)
    answer = await hub.changes(link(), FeedPoll(cursor=cursor, timeout=5))
    got = {r.run_id: (r.reply, r.reply_inline) for r in answer.runs}
    assert got == {"run_1": ("short reply", True), "run_2": (None, False), "run_3": (None, True)}
