"""A wait on a pull request, pure: what `gh` answered, judged against what the agent waits for,
and what the shell does next. No I/O, no clock: time comes in as numbers, jitter as a draw.

    watching --Polled(satisfied)----------> delivered (outcome: passed, failed, approved, ...)
    watching --Polled(not yet)------------> watching, NextPoll(poll_s)
    watching --PollFailed(rate_limited)---> watching, NextPoll(RATE_LIMIT_BACKOFF, at least
                                            GitHub's reset), the normal poll never sooner
    watching --PollFailed(transient)------> watching, NextPoll(POLL_BACKOFF)
    watching --PollFailed(terminal)-------> delivered (outcome `error`, with gh's sentence)
    watching --past its deadline----------> delivered (outcome `timed_out`)
    watching --Cancel---------------------> cancelled
    delivered | cancelled --anything------> unchanged, no action (a wait ends once)

`Deliver` is an action, not a fact: the shell commits the delivery (the wait's end and the wake
run, one transaction fenced by the watcher's claim: `waits/store.py:deliver`) and only then starts
the wake. What `until` asks:

    checks   every check finished (none pending): `passed`, or `failed` when one failed or was
             cancelled; no check reported yet keeps watching (CI may not have started)
    (with `head`: only once the pull request's head is that commit, so checks and reviews of the
    commit before a pushed fix are not taken for the fix's)
    review   the review decision is APPROVED (`approved`), or CHANGES_REQUESTED (`changes_requested`)
             when it was not so at the wait's first poll, or a review asking for changes came
             since (its `baseline`, `review_mark`: the decision and the newest review's time; a
             wait recorded after pushing a fix waits for the next review, not the one it is
             answering, and a reviewer who asks for changes again is heard)
    merged   the pull request was merged (`merged`)
    closed   closed or merged (`closed`, `merged`)

A pull request merged or closed ends every wait (nothing else can happen to it then).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import urlsplit

from peerd.core.backoff import Backoff

Until = Literal["checks", "review", "merged", "closed"]
UNTILS: tuple[Until, ...] = ("checks", "review", "merged", "closed")
Outcome = Literal[
    "passed", "failed", "approved", "changes_requested", "merged", "closed", "timed_out", "error"
]
WaitStatus = Literal["watching", "delivered", "cancelled"]
FailureKind = Literal["rate_limited", "transient", "terminal"]

# A transient failure of `gh` (no network, GitHub's 5xx, a timeout): 15 s doubling to 5 minutes.
POLL_BACKOFF = Backoff(first=15.0, cap=300.0, jitter=5.0)
# GitHub said the rate limit is spent: a minute doubling to 15 minutes, never sooner than its reset.
RATE_LIMIT_BACKOFF = Backoff(first=60.0, cap=900.0, jitter=15.0)
CHECK_BUCKETS = ("pass", "fail", "pending", "skipping", "cancel")
# GitHub allows a login 5,000 REST calls an hour; the waits of one daemon (one gh login) keep to
# 4,000 of them, leaving the rest to the person and to `orchestrate --pr`. A poll is 2 calls.
HOURLY_CALLS = 4000
CALLS_PER_POLL = 2


@dataclass(frozen=True)
class Check:
    """One row of `gh pr checks --json name,state,bucket,link,workflow`."""

    name: str
    state: str
    bucket: str  # pass | fail | pending | skipping | cancel
    link: str = ""
    workflow: str = ""


@dataclass(frozen=True)
class PullRequest:
    """What `gh pr view --json number,url,state,reviewDecision,mergedAt,closedAt,headRefOid` said."""

    number: int
    url: str
    state: str  # OPEN | CLOSED | MERGED
    review_decision: str  # APPROVED | CHANGES_REQUESTED | REVIEW_REQUIRED | "" (none)
    head: str = ""  # headRefOid: the commit its checks are about ("" when gh did not say)
    # The newest of `latestReviews` (each reviewer's latest): when it was submitted (ISO 8601, as
    # GitHub gives it) and its state; "" when there is none or gh did not say.
    newest_review_at: str = ""
    newest_review_state: str = ""


def review_mark(decision: str, newest_review_at: str) -> str:
    """A wait's review baseline: the decision, and the newest review's time after `@` (a decision
    alone: no review yet, or a baseline an older peerd stored)."""
    return f"{decision}@{newest_review_at}" if newest_review_at else decision


def asked_again(pr: PullRequest, baseline: str | None) -> bool:
    """The review decision asks for changes and that is news against `baseline`: it did not at
    the baseline, or a review asking for changes was submitted after the baseline's newest."""
    if pr.review_decision.upper() != "CHANGES_REQUESTED":
        return False
    decision, _, since = (baseline or "").partition("@")
    if decision.upper() != "CHANGES_REQUESTED":
        return True
    return (
        bool(since) and pr.newest_review_state.upper() == "CHANGES_REQUESTED" and pr.newest_review_at > since
    )


@dataclass(frozen=True)
class Snapshot:
    pr: PullRequest
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Watch:
    """A wait as the machine sees it (the store holds the rest)."""

    until: Until
    deadline: float  # wall seconds (this machine's clock) past which it ends `timed_out`
    status: WaitStatus = "watching"
    failures: int = 0  # transient failures in a row
    rate_limited: int = 0  # rate-limit answers in a row
    baseline: str | None = None  # the review at the first poll that answered (`review_mark`)
    # The commit the checks must be about (an orchestration's wait after it pushed a fix): checks
    # GitHub reports for another head are of the commit before and keep the wait watching.
    head: str | None = None


@dataclass(frozen=True)
class Polled:
    snapshot: Snapshot
    now: float


@dataclass(frozen=True)
class PollFailed:
    kind: FailureKind
    detail: str
    now: float
    retry_after: float | None = None  # seconds GitHub said to wait (its reset), when it said


@dataclass(frozen=True)
class Cancel:
    reason: str


Event = Polled | PollFailed | Cancel


@dataclass(frozen=True)
class NextPoll:
    delay: float


@dataclass(frozen=True)
class Deliver:
    outcome: Outcome
    detail: str  # for `error` and `timed_out`: why; otherwise empty


@dataclass(frozen=True)
class Cancelled:
    reason: str


Action = NextPoll | Deliver | Cancelled


def judge(
    until: Until, snapshot: Snapshot, baseline: str | None = None, head: str | None = None
) -> Outcome | None:
    """The outcome the snapshot satisfies the wait with, or None to keep watching."""
    state = snapshot.pr.state.upper()
    if state == "MERGED":
        return "merged"
    if state == "CLOSED":
        return "closed"
    if head and snapshot.pr.head and snapshot.pr.head != head:
        return None  # GitHub still shows the pull request as it was before the push
    if until == "checks":
        if not snapshot.checks or any(c.bucket == "pending" for c in snapshot.checks):
            return None
        return "failed" if any(c.bucket in ("fail", "cancel") for c in snapshot.checks) else "passed"
    if until == "review":
        decision = snapshot.pr.review_decision.upper()
        if decision == "APPROVED":
            return "approved"
        if asked_again(snapshot.pr, baseline):
            return "changes_requested"
    return None


def step(watch: Watch, event: Event, *, poll_s: float, draw: float = 0.0) -> tuple[Watch, tuple[Action, ...]]:
    """One event into the wait: its new state and what the shell does (`draw` in [0, 1]: jitter)."""
    if watch.status != "watching":
        return watch, ()  # a wait ends once: a late poll or a second cancel changes nothing
    if isinstance(event, Cancel):
        return replace(watch, status="cancelled"), (Cancelled(event.reason),)
    if isinstance(event, Polled):
        pr = event.snapshot.pr
        baseline = (
            review_mark(pr.review_decision, pr.newest_review_at) if watch.baseline is None else watch.baseline
        )
        calm = replace(watch, failures=0, rate_limited=0, baseline=baseline)
        outcome = judge(watch.until, event.snapshot, baseline, watch.head)
        if outcome is not None:
            return replace(calm, status="delivered"), (Deliver(outcome, ""),)
        if event.now >= watch.deadline:
            return _timed_out(calm)
        return calm, (NextPoll(poll_s),)
    if event.kind == "terminal":
        return replace(watch, status="delivered"), (Deliver("error", event.detail),)
    if event.now >= watch.deadline:
        return _timed_out(watch)
    if event.kind == "rate_limited":
        tries = watch.rate_limited + 1
        delay = max(RATE_LIMIT_BACKOFF.delay(tries, draw), event.retry_after or 0.0, poll_s)
        return replace(watch, rate_limited=tries), (NextPoll(delay),)
    tries = watch.failures + 1
    return replace(watch, failures=tries), (NextPoll(max(POLL_BACKOFF.delay(tries, draw), poll_s)),)


def _timed_out(watch: Watch) -> tuple[Watch, tuple[Action, ...]]:
    return replace(watch, status="delivered"), (
        Deliver("timed_out", "The wait reached its deadline before the pull request got there."),
    )


def spaced(poll_s: float, open_waits: int) -> float:
    """The poll interval with `open_waits` waits polling at once: `poll_s`, stretched so that all of
    them together stay within `HOURLY_CALLS` (100 open waits poll every 180 s, not every 30 s)."""
    return max(poll_s, max(open_waits, 1) * CALLS_PER_POLL * 3600.0 / HOURLY_CALLS)


def first_delay(*, delay_s: float | None, next_at: float | None, wall_now: float, poll_s: float) -> float:
    """After a restart: how long until the next poll. A stored backoff holds at most its own delay
    whatever the wall clock did meanwhile; a wait without one polls at once."""
    if delay_s is None or next_at is None:
        return 0.0
    return min(max(next_at - wall_now, 0.0), max(delay_s, poll_s))


# What each outcome means, in words (the wake's text, and `--until`'s report: orchestrate/untilreport.py).
OUTCOME_WORDS: dict[str, str] = {
    "passed": "every check passed",
    "failed": "checks failed",
    "approved": "the review approved it",
    "changes_requested": "a review asked for changes",
    "merged": "it was merged",
    "closed": "it was closed without being merged",
    "timed_out": "the wait timed out",
    "error": "the wait could not go on",
}


def wake_text(
    wait_id: str,
    pr: str,
    until: Until,
    outcome: Outcome,
    detail: str,
    snapshot: Snapshot | None,
    log_tail: str,
) -> str:
    """The message of the wake run that delivers a wait (pure)."""
    where = pr if snapshot is None or not snapshot.pr.url else f"#{snapshot.pr.number} ({snapshot.pr.url})"
    lines = [f"Your wait {wait_id} on pull request {where} (until {until}) ended: {OUTCOME_WORDS[outcome]}."]
    if detail:
        lines.append(detail)
    if snapshot is not None:
        if snapshot.pr.review_decision:
            lines.append(f"Review decision: {snapshot.pr.review_decision}.")
        if snapshot.checks:
            lines.append("Checks:")
            lines.extend(_check_line(c) for c in snapshot.checks)
    if log_tail:
        lines += ["The failing job's log ends:", "```", log_tail, "```"]
    lines.append(
        "Act on it (fix, push, answer the review), then call wait_for_github again if you need to keep "
        "waiting; list_waits shows your waits."
    )
    return "\n".join(lines)


def _check_line(check: Check) -> str:
    failed = check.bucket in ("fail", "cancel")
    return f"- {check.name}: {check.state} ({check.bucket})" + (
        f" {check.link}" if failed and check.link else ""
    )


def scope_pr(pr: str, repository_key: str | None) -> tuple[str, str | None]:
    """The pull request as gh is asked for it, and the `--repo` it is asked in: always the
    project's own repository (a run reads its own project's pull requests, never another
    repository the machine's gh login may read). A URL must name that repository and becomes its
    number; without a GitHub-like key (`host/owner/repo`) gh resolves a number or branch from the
    checkout, and a URL is refused. Raises ValueError with the sentence to show."""
    repo = repository_key if repository_key and _is_host_owner_repo(repository_key) else None
    if "://" not in pr:
        return pr, repo
    parts = urlsplit(pr)
    segments = [s for s in parts.path.split("/") if s]
    if (
        parts.scheme not in ("http", "https")
        or len(segments) < 4
        or segments[2] != "pull"
        or not segments[3].isdigit()
    ):
        raise ValueError(f"pr {pr!r} is not a pull request's URL (https://HOST/OWNER/REPO/pull/NUMBER)")
    named = f"{parts.hostname or ''}/{segments[0]}/{segments[1].removesuffix('.git')}".lower()
    if repo is None:
        raise ValueError(
            f"pr {pr!r}: this thread's project has no GitHub origin to match it with; pass the pull "
            "request's number or head branch instead"
        )
    if named != repo.lower():
        raise ValueError(
            f"pr {pr!r} is in {named}, not in this thread's repository {repo}: a wait watches its own "
            "project's pull requests"
        )
    return segments[3], repo


def _is_host_owner_repo(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and all(parts) and ":" not in key and "." in parts[0]
