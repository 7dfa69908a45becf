"""How a task ends: once (first result wins), waking its parent once, in one transaction
(`peerd.tasks.store.finish`); and how a local child's end settles its task.

Both survive a failing store: settling a local task and kicking the parent's wake run are retried
with backoff while the store raises (`Retrier`), so a full disk delays a result but never loses
it. At start-up, `Delegation.recover` settles what a crash left open, and `RunManager.kick_all`
starts wake runs that were committed but never started.
"""

from __future__ import annotations

import structlog

from peerd import contracts as c
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.runner import RunManager
from peerd.store import threads
from peerd.store.db import Database
from peerd.tasks import store as tasks
from peerd.tasks.feed import FeedHub
from peerd.tasks.rules import result_text, task_status_from_run
from peerd.tasks.store import TaskRow
from peerd.tasks.timing import Retrier
from peerd.tasks.watch import RunWatcher

log = structlog.get_logger(__name__)


class TaskEnder:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        runs: RunManager,
        *,
        clock: Clock = SYSTEM_CLOCK,
        retries: Retrier | None = None,
        hub: FeedHub | None = None,
    ) -> None:
        self.db = db
        self.feed = feed
        self.runs = runs
        self.clock = clock
        self.watcher = RunWatcher(db, feed, hub=hub)
        self.retries = retries or Retrier(clock=clock)

    async def end(
        self, task_id: str, status: c.TaskStatus, result: str, *, wake: bool = True
    ) -> TaskRow | None:
        """End the task (first result wins) and start the parent's wake run, if one was made."""
        ended = await tasks.finish(self.db, task_id, status, result, now=self.clock(), wake=wake)
        if ended is None:
            return None
        log.info("task.ended", task_id=task_id, status=status, woken_run_id=ended.woken_run_id)
        self.feed.changed(ended.parent_thread_id)
        if ended.woken_run_id is not None:
            parent = ended.parent_thread_id
            # The wake run is committed; starting it is retried while the store fails.
            await self.retries.run(f"wake:{parent}", lambda: self.runs.kick(parent))
        return ended

    async def on_run_end(self, thread_id: str) -> None:
        """A run here ended: local tasks whose child thread this is may now be settled."""
        await self.retries.run(f"settle:{thread_id}", lambda: self._settle_local(thread_id))

    async def _settle_local(self, thread_id: str) -> None:
        for task in await tasks.open_local(self.db, child_thread_id=thread_id):
            if task.child_run_id is None:
                continue
            watched = await self.watcher.watch_one(thread_id, task.child_run_id)
            if watched.settled and watched.result_run_id is not None:
                reply = await threads.last_reply(self.db, watched.result_run_id)
                result = result_text(watched.status, reply, watched.reason)
                await self.end(task.id, task_status_from_run(watched.status or ""), result)
