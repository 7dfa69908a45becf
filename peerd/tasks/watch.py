"""The box's side of following: has the work a run started settled (`watch_one`); the change feed
laptops follow their tasks by (`hub`, `peerd.tasks.feed`); and the batched long-poll
(`POST /v1/watch`) that laptops before the change feed send, still served for them.

A watch returns as soon as any named run settled or is gone, at its timeout, or at once when the
calling link is revoked here (its next request then learns why).
"""

from __future__ import annotations

from peerd import contracts as c
from peerd.errors import NotFound
from peerd.operations import Caller
from peerd.runtime.feed import ChangeFeed
from peerd.store import threads
from peerd.store.db import Database
from peerd.tasks import store as tasks
from peerd.tasks.feed import FeedHub, client_key
from peerd.tasks.rules import settlement

__all__ = ["RunWatcher", "client_key"]


class RunWatcher:
    def __init__(self, db: Database, feed: ChangeFeed, *, hub: FeedHub | None = None) -> None:
        self.db = db
        self.feed = feed
        self.hub = hub or FeedHub(db, feed)

    async def watch_one(self, thread_id: str, run_id: str) -> c.WatchedRun:
        """Has the work this run started settled (its own delegations included), and with which run?"""
        try:
            thread = await threads.get_thread(self.db, thread_id)
            facts = await threads.run_facts(self.db, thread_id)
        except NotFound:
            return c.WatchedRun(thread_id=thread_id, run_id=run_id, status=None, settled=False, found=False)
        launched = next((f for f in facts if f.id == run_id), None)
        if launched is None:
            return c.WatchedRun(thread_id=thread_id, run_id=run_id, status=None, settled=False, found=False)
        settled, result_run = settlement(
            launched,
            facts,
            open_children=await tasks.has_open_children(self.db, thread_id),
            queue_held=thread.queue_held,
        )
        return c.WatchedRun(
            thread_id=thread_id,
            run_id=run_id,
            status=result_run.status,
            settled=settled,
            found=True,
            result_run_id=result_run.id if settled else None,
            reason=result_run.reason if settled else None,
        )

    async def watch(self, caller: Caller, req: c.RunWatch) -> c.RunWatchResult:
        """The follower's batched long-poll: returns when any named run settles (or is gone), and
        at once when the calling link is revoked here."""
        deadline = self.feed.deadline(req.timeout)
        # Each change re-reads only the threads that changed, not every watched run: a link with
        # many open tasks must not pay O(tasks) for every item one child adds.
        keys = {ref.thread_id for ref in req.runs}
        revoked_key = client_key(caller.link.client_id) if caller.link is not None else None
        if revoked_key is not None:
            keys.add(revoked_key)
        listener = self.feed.listen(keys)
        try:
            runs = [await self.watch_one(ref.thread_id, ref.run_id) for ref in req.runs]
            while True:
                done = any(r.settled or not r.found for r in runs)
                remaining = self.feed.remaining(deadline)
                if done or remaining <= 0 or self.feed.closed:
                    return c.RunWatchResult(runs=runs, timed_out=not done)
                await self.feed.wait_any([listener.event], remaining)
                changed = listener.take()
                if revoked_key is not None and revoked_key in changed:
                    return c.RunWatchResult(runs=runs, timed_out=True)
                for i, ref in enumerate(req.runs):
                    if ref.thread_id in changed:
                        runs[i] = await self.watch_one(ref.thread_id, ref.run_id)
        finally:
            self.feed.unlisten(listener, keys)
