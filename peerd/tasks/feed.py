"""The box's side of the change feed (I/O shell): per link, the durable subscription and the
long-poll for changes after a cursor. The rules are `peerd.tasks.subscription.LinkFeed`.

A link's feed is loaded on its first request after this daemon started (one read of its
subscription; every followed thread is then looked at once, three reads per 500 threads) and
kept in memory, listening on the change feed (`ChangeFeed`) for all its threads and for the
link's revocation, whether a poll is in flight or not. A change to one thread costs a look at that
thread only (three reads): a wake costs O(1) however many runs the link follows. A poll answers
as soon as a followed run is reported settled or gone after its cursor, at its timeout, at once
when the link is revoked, or when this daemon stops.

The link is the caller's, from the authenticated request: a link follows only runs of threads it
started. Any other run id (another link's, an unknown one) is followed as *gone*: the answer says
`found: false` and nothing else about it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from peerd.approvals import store as approvals_store
from peerd.approvals.desk import pending_hash
from peerd.approvals.service import link_key as approvals_key
from peerd.approvals.wire import MAX_MIRRORED, ApprovalView
from peerd.contracts import Capacity, Usage
from peerd.errors import CapabilityDenied, InvalidRequest
from peerd.events import ClientRevoked
from peerd.operations import Caller
from peerd.runtime.feed import ChangeFeed, Listener
from peerd.store.db import Database
from peerd.store.threads.usage import task_usage
from peerd.tasks import feedstore
from peerd.tasks.feedwire import FeedChanges, FeedPoll, FeedRun, FeedSubscribe, FeedSubscribed
from peerd.tasks.rules import settlement
from peerd.tasks.subscription import INLINE_REPLY_MAX, MAX_FOLLOWED_RUNS, LinkFeed, Report

# A link gets this box's capacity report at most this often (its cache keeps the age).
CAPACITY_EVERY_S = 10.0


def client_key(client_id: str) -> str:
    """The change-feed key a link client's revocation is announced on."""
    return f"client:{client_id}"


@dataclass
class _Link:
    client_id: str
    state: LinkFeed
    listener: Listener
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    revoked: bool = False
    approvals_sent: str | None = None  # the pending approvals' hash last answered to this link
    asking: list[ApprovalView] | None = None  # the link's pending approvals as last read (None: read them)
    capacity_sent: float | None = None  # when this box's report last went to this link


class FeedHub:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        *,
        epoch: str | None = None,
        capacity: Callable[[], Awaitable[Capacity]] | None = None,
    ) -> None:
        self.db = db
        self.feed = feed
        self.epoch = epoch or secrets.token_hex(8)
        self.cap = MAX_FOLLOWED_RUNS
        self._links: dict[str, _Link] = {}
        self._loading = asyncio.Lock()
        self.looks = 0  # threads looked at (the benchmark reads it: O(changes), not O(followed))
        # This box's capacity report, sent with the answers (peerd/placement/service.py).
        self.capacity = capacity

    async def _link(self, caller: Caller) -> _Link:
        if caller.link is None:
            raise CapabilityDenied("The change feed follows a link's runs; it is served to links only.")
        client_id = caller.link.client_id
        link = self._links.get(client_id)
        if link is not None:
            return link
        async with self._loading:
            link = self._links.get(client_id)
            if link is None:
                state = LinkFeed(self.epoch, await feedstore.subscription(self.db, client_id), cap=self.cap)
                listener = self.feed.listen(
                    {*state.by_thread, client_key(client_id), approvals_key(client_id)}
                )
                link = _Link(client_id, state, listener)
                self._links[client_id] = link
        return link

    def client_revoked(self, event: ClientRevoked) -> None:
        """A revoked client's open long-polls (here and `POST /v1/watch`) end now."""
        self.feed.changed(client_key(event.client_id))

    # --- the subscription --------------------------------------------------------------------------

    async def subscribe(self, caller: Caller, req: FeedSubscribe) -> FeedSubscribed:
        link = await self._link(caller)
        async with link.lock:
            state = link.state
            size = state.size_after(req.add, req.remove, req.reset)
            if size > self.cap:
                raise InvalidRequest(
                    f"A link may follow at most {self.cap} runs at once; this change would make {size}. "
                    "Follow fewer runs, or unfollow ended ones first."
                )
            new = [run_id for run_id in req.add if run_id not in state.runs]
            threads = await feedstore.resolve(self.db, link.client_id, new)
            add = {
                run_id: state.runs[run_id] if run_id in state.runs else threads.get(run_id)
                for run_id in req.add
            }
            await feedstore.save(self.db, link.client_id, add=add, remove=req.remove, reset=req.reset)
            applied = state.apply(add, req.remove, req.reset, req.set_hash)
            self.feed.listen(applied.threads_added, listener=link.listener)
            self.feed.unlisten(link.listener, applied.threads_removed)
            link.listener.event.set()  # a poll in flight looks at the new runs (and reports gone ones)
        return FeedSubscribed(in_sync=applied.in_sync, size=len(state.runs), set_hash=state.set.hex)

    # --- changes after a cursor --------------------------------------------------------------------

    async def changes(self, caller: Caller, req: FeedPoll) -> FeedChanges:
        link = await self._link(caller)
        deadline = self.feed.deadline(req.timeout)
        while True:
            async with link.lock:
                await self._look(link)
                reports, resynced = link.state.since(req.cursor)
                cursor = link.state.cursor
                if link.asking is None:  # read again only when they changed (the approvals key)
                    waiting = await approvals_store.pending(self.db, link_origin=link.client_id)
                    # The oldest ones, as many as the laptop takes from one answer; who asks is the link.
                    link.asking = [
                        ApprovalView.of(a).model_copy(update={"link_label": None})
                        for a in waiting[:MAX_MIRRORED]
                    ]
                asking = link.asking
                asked = pending_hash(asking)
                news, link.approvals_sent = asked != link.approvals_sent, asked
            remaining = self.feed.remaining(deadline)
            if reports or resynced or news or remaining <= 0 or link.revoked or self.feed.closed:
                return FeedChanges(
                    cursor=cursor,
                    runs=[_wire(r) for r in reports],
                    resynced=resynced,
                    timed_out=not reports and not news,
                    set_hash=link.state.set.hex if resynced else None,
                    approvals=asking,
                    capacity=await self._capacity_for(link, self.feed.clock.monotonic()),
                )
            await self.feed.wait_any([link.listener.event], remaining)

    async def _capacity_for(self, link: _Link, now: float) -> Capacity | None:
        """This box's report, when the link has not had it for `CAPACITY_EVERY_S` (None: nothing
        new; the laptop keeps the last one with its age). Not even read otherwise: a wake's
        answer carries nothing it does not need."""
        if self.capacity is None or (
            link.capacity_sent is not None and now - link.capacity_sent < CAPACITY_EVERY_S
        ):
            return None
        link.capacity_sent = now
        return await self.capacity()

    async def _look(self, link: _Link) -> None:
        """Take what changed since the last look and read those threads (under the link's lock)."""
        changed = link.listener.take()
        if client_key(link.client_id) in changed:
            link.revoked = True
        if approvals_key(link.client_id) in changed:
            changed.discard(approvals_key(link.client_id))  # not a thread: nothing to look at
            link.asking = None  # read them again for the next answer
        state = link.state
        state.changed(changed)
        dirty = state.take_dirty()
        if not dirty:
            return
        try:
            reports, unsettled = await self._read(link, dirty)
        except BaseException:
            # Looked at again next time: nothing is lost to a store fault, nor to this poll being
            # cancelled mid-look (its laptop went away, killed or cut off: issue 26, case 8). Its
            # threads were taken from `dirty` and their change from the listener; without this the
            # run's settling would never be reported, to this laptop or its next process.
            state.dirty |= dirty
            raise
        state.record(reports, unsettled)

    async def _read(self, link: _Link, dirty: set[str]) -> tuple[list[Report], list[str]]:
        """What the dirty threads' followed runs are now: settled (a report) or not yet."""
        state = link.state
        facts = await feedstore.thread_facts(self.db, link.client_id, dirty)
        self.looks += len(dirty)
        reports: list[Report] = []
        unsettled: list[str] = []
        for thread_id in dirty:
            runs = state.by_thread.get(thread_id, set())
            fact = facts.get(thread_id)
            for run_id in runs:
                launched = None if fact is None else next((r for r in fact.runs if r.id == run_id), None)
                if fact is None or launched is None:
                    reports.append(Report(run_id, found=False, settled=False))
                    continue
                settled, result = settlement(
                    launched, fact.runs, open_children=fact.open_children, queue_held=fact.queue_held
                )
                if settled:
                    reply = await feedstore.last_reply(self.db, thread_id, result.id)
                    inline = reply is None or len(reply) <= INLINE_REPLY_MAX
                    shown = reply if inline else None
                    spent = await task_usage(self.db, thread_id)  # sent with the result (issue 20)
                    usage = None if spent is None else json.dumps(spent.to_json())
                    reports.append(
                        Report(
                            run_id, True, True, result.status, result.id, result.reason, shown, inline, usage
                        )
                    )
                else:
                    unsettled.append(run_id)
        return reports, unsettled


def _wire(report: Report) -> FeedRun:
    return FeedRun(
        run_id=report.run_id,
        found=report.found,
        settled=report.settled,
        status=report.status,  # a run's status, from the store
        result_run_id=report.result_run_id,
        reason=report.reason,
        reply=report.reply,
        reply_inline=report.inline,
        usage=None if report.usage is None else Usage.model_validate_json(report.usage),
    )
