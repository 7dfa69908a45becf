"""The change feed on the wire: `POST /v1/feed/subscription` and `POST /v1/feed/changes` (a
link's follower; the box answers from the authenticated link). Rules: `peerd.tasks.subscription`.

    subscription {add?: [runId], remove?: [runId], reset?: bool, setHash}
                 -> {inSync, size, setHash}          (at once; refused above the cap)
    changes      {cursor?, timeout}
                 -> {cursor, runs: [FeedRun], resynced, setHash?, timedOut}
                    (as soon as a followed run settles or is gone; `runs` holds only those, after
                    the cursor; `resynced` when the cursor was not continued: then every report kept
                    is in `runs`, answered at once, with the box's `setHash`; `approvals`: the
                    link's work's pending approvals, and a change of them answers at once too;
                    `capacity`: the box's capacity report, for placement)
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from peerd.approvals.wire import MAX_MIRRORED, ApprovalView
from peerd.contracts import LONG_POLL_MAX_S, Capacity, Input, Usage, Wire
from peerd.core.runs import RunStatus
from peerd.tasks.subscription import CURSOR_PATTERN, MAX_FOLLOWED_RUNS

SUBSCRIPTION_PATH = "/v1/feed/subscription"
CHANGES_PATH = "/v1/feed/changes"

RunId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
SetHash = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class FeedSubscribe(Input):
    add: list[RunId] = Field(default_factory=list, max_length=MAX_FOLLOWED_RUNS)
    remove: list[RunId] = Field(default_factory=list, max_length=MAX_FOLLOWED_RUNS)
    reset: bool = False
    set_hash: SetHash


class FeedSubscribed(Wire):
    in_sync: bool
    size: int
    set_hash: str


class FeedPoll(Input):
    cursor: str | None = Field(default=None, max_length=40, pattern=CURSOR_PATTERN)
    timeout: float = Field(default=30.0, ge=0, le=LONG_POLL_MAX_S)


class FeedRun(Wire):
    run_id: str
    found: bool
    settled: bool
    status: RunStatus | None = None
    result_run_id: str | None = None
    reason: str | None = None
    reply: str | None = None  # the result run's last reply, when `replyInline` (up to 16,000 characters)
    reply_inline: bool = False
    usage: Usage | None = None  # settled: what the thread spent, with its delegations; null: unknown


class FeedChanges(Wire):
    cursor: str
    runs: list[FeedRun]
    resynced: bool
    timed_out: bool
    set_hash: str | None = None
    # The link's work's pending approvals on the box, in every answer (an older box: absent); a
    # change of that set answers a poll early (peerd/approvals/).
    approvals: list[ApprovalView] | None = Field(default=None, max_length=MAX_MIRRORED)
    # What the box has room for (peerd/placement/), in every answer; an older box: absent.
    capacity: Capacity | None = None
