"""How the follower reaches a box's change feed (`FeedTransport.call`): the feed itself, or, for a
box of an older release that has none (wire revision 1: `peerd.peer.skew`), the same two calls
emulated here over the batched `POST /v1/watch` such a box serves, so delegation to it works.

    subscription {add?, remove?, reset?, setHash}  -> kept here, per link: the runs to follow
                                                      (`inSync` when our set's hash is the one sent)
    changes      {cursor?, timeout}                -> POST /v1/watch {runs: [{threadId, runId}], timeout}
                                                      -> the settled or gone runs, as feed reports

The box's revision is what its last answer said (`PeerClient.protocol_of`); a box not heard from
yet is asked for the feed, and its `version_skew` answer switches to the watch at once (no backoff:
the watch answers). The link stays `version_skew` meanwhile (`environment list`, doctor): the
emulation follows runs only; the box's pending approvals and capacity, which only the feed carries,
are not seen here until the box is updated. An updated box answers with revision 2 and the feed is
used again from the next call.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from peerd.contracts import FEED_PROTOCOL, LONG_POLL_MAX_S
from peerd.errors import VersionSkew
from peerd.peer.forwarding import Forwarder
from peerd.store.db import Database
from peerd.tasks import feedstore
from peerd.tasks.feedwire import SUBSCRIPTION_PATH
from peerd.tasks.subscription import set_hash

WATCH_PATH = "/v1/watch"
WATCH_MAX_RUNS = 1000  # the older box's cap on one watch request
CURSOR_EPOCH = "0" * 16  # emulated cursors: never continued by anyone but this object


class FeedTransport:
    def __init__(self, db: Database, forwarder: Forwarder) -> None:
        self.db = db
        self.forwarder = forwarder
        self._followed: dict[str, dict[str, None]] = {}  # per link: the runs the follower follows
        self._seq = itertools.count(1)

    def watching(self, env_id: str) -> bool:
        """Is this box one of an older release, followed through its watch?"""
        peer = self.forwarder.peers.protocol_of(env_id)
        return peer is not None and peer.revision < FEED_PROTOCOL

    async def call(self, env_id: str, path: str, body: dict[str, Any]) -> Any:
        if not self.watching(env_id):
            try:
                return await self.forwarder.call(env_id, "POST", path, body=body)
            except VersionSkew:
                pass  # an older box: the same call through its watch, now
        if path == SUBSCRIPTION_PATH:
            return self._subscribe(env_id, body)
        return await self._changes(env_id, body)

    def _subscribe(self, env_id: str, body: dict[str, Any]) -> dict[str, Any]:
        runs = self._followed.setdefault(env_id, {})
        if body.get("reset"):
            runs.clear()
        for run_id in body.get("add", ()):
            runs[str(run_id)] = None
        for run_id in body.get("remove", ()):
            runs.pop(str(run_id), None)
        ours = set_hash(runs)
        return {"inSync": ours == body.get("setHash"), "size": len(runs), "setHash": ours}

    async def _changes(self, env_id: str, body: dict[str, Any]) -> dict[str, Any]:
        timeout = min(max(float(body.get("timeout") or 0.0), 0.0), LONG_POLL_MAX_S)
        followed = self._followed.get(env_id, {})
        threads = {
            t.child_run_id: t.child_thread_id
            for t in await feedstore.open_tasks(self.db, env_id)
            if t.child_run_id in followed and t.child_thread_id is not None
        }
        refs = [{"threadId": thread, "runId": run} for run, thread in threads.items()][:WATCH_MAX_RUNS]
        cursor = f"{CURSOR_EPOCH}-{next(self._seq)}"
        if not refs:  # nothing to ask about: wait the chunk out, as the box would
            await asyncio.sleep(timeout)
            return {"cursor": cursor, "runs": [], "resynced": False, "timedOut": True}
        answer = await self.forwarder.call(
            env_id, "POST", WATCH_PATH, body={"runs": refs, "timeout": timeout}
        )
        reports = [
            {
                "runId": run["runId"],
                "found": bool(run.get("found")),
                "settled": bool(run.get("settled")),
                "status": run.get("status"),
                "resultRunId": run.get("resultRunId"),
                "reason": run.get("reason"),
            }
            for run in answer.get("runs", [])
            if not run.get("found") or run.get("settled")
        ]
        return {
            "cursor": cursor,
            "runs": reports,
            "resynced": False,
            "timedOut": bool(answer.get("timedOut")) and not reports,
        }
