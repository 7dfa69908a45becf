"""Issue 26, case 8: a result stuck after a laptop kill. The theory, proved here without sockets.

The box answers a laptop's long-poll from `FeedHub.changes`. When a followed run settles, the
poll wakes and looks at the changed thread (`_look`): it takes the thread out of the link's
`dirty` set (and its change out of the listener), reads the thread's facts, then for a settled
run its last reply and usage, and only then records the report. The listener answers with
`handler_cancellation=True`, so when the laptop goes away (killed, cut off) the handler is
cancelled wherever it is awaiting. Cancelled after `take_dirty` and before `record` (in
`last_reply` or `task_usage`: the window is the reads of one settled thread), the change was
forgotten: the thread was no longer dirty, nothing was recorded, and no later change comes from an
idle child. Every later poll, from the same laptop's next process (cursor none: a resync) or
after its backoff, answered "nothing" chunk after chunk: the task stayed `running` with no error,
no backoff row and no log line, until the box restarted (its feed is loaded with every thread
dirty). The fix: a look cut short by anything puts its threads back in `dirty`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.core.access import LinkContext, ModeCap
from peerd.operations import Caller
from peerd.runtime.feed import ChangeFeed
from peerd.store.db import Database
from peerd.tasks import feedstore
from peerd.tasks.feed import FeedHub
from peerd.tasks.feedwire import FeedPoll, FeedSubscribe
from peerd.tasks.subscription import set_hash
from tests.support.follower import Gate


def link() -> Caller:
    return Caller.for_link(LinkContext("cli_a", "laptop", "auto", ModeCap("auto", "default")))


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "box.db")
    now = time.time()
    async with database.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', ?)", (now,)
        )
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
            " in_place, worktree_path, created_at, updated_at, link_origin)"
            " VALUES ('thr_0', 'prj_1', 't', 'script', 'auto', 'default', 0, '/w', ?, ?, 'cli_a')",
            (now, now),
        )
        await tx.execute(
            "INSERT INTO runs (id, thread_id, number, status, prompt, created_at, reason)"
            " VALUES ('run_0', 'thr_0', 1, 'running', 'x', ?, NULL)",
            (now,),
        )
    yield database
    await database.close()


@pytest.mark.parametrize("next_cursor", ["none (the laptop restarted)", "the cut poll's cursor"])
async def test_a_poll_cut_mid_look_loses_no_settled_run(
    db: Database, monkeypatch: pytest.MonkeyPatch, next_cursor: str
) -> None:
    """Rule: a look cut short (its poll cancelled because the laptop went away) leaves the threads
    it took to be looked at again, so the next poll, of any laptop process, reports the run."""
    gate = Gate()
    monkeypatch.setattr(feedstore, "last_reply", gate.wrap(feedstore.last_reply))
    feed = ChangeFeed()
    hub = FeedHub(db, feed)
    await hub.subscribe(link(), FeedSubscribe(add=["run_0"], set_hash=set_hash(["run_0"])))
    first = await hub.changes(link(), FeedPoll(timeout=0))
    assert first.runs == [], "nothing settled yet"
    polling = asyncio.ensure_future(hub.changes(link(), FeedPoll(cursor=first.cursor, timeout=20)))
    await asyncio.sleep(0)  # one turn: the poll starts (its first look, or the change, reaches the gate)
    async with db.write() as tx:  # the box's child ends
        await tx.execute("UPDATE runs SET status = 'completed', reason = 'done' WHERE id = 'run_0'")
    feed.changed("thr_0")
    await asyncio.wait_for(gate.entered.wait(), 10)  # the poll is inside the look's window
    polling.cancel()  # the laptop is killed: aiohttp cancels the handler
    with pytest.raises(asyncio.CancelledError):
        await polling
    gate.release.set()
    cursor = None if next_cursor.startswith("none") else first.cursor
    again = await hub.changes(link(), FeedPoll(cursor=cursor, timeout=2))
    assert [(r.run_id, r.settled, r.status) for r in again.runs] == [("run_0", True, "completed")], (
        "the settled run is reported to the next poll, not lost with the cut one"
    )
