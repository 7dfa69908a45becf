"""Asking GitHub about a pull request, through `gh` (`runtime/gh.py:run_gh`: argument list, no
shell, its own credentials, bounded). Two reads per poll:

    gh pr view PR --json number,url,state,reviewDecision,mergedAt,closedAt,headRefOid,latestReviews
    gh pr checks PR --json name,state,bucket,link,workflow      (exit 8: some pending; 1: one failed)

and, when checks failed, the failing jobs' log (`gh run view RUN --log-failed`), its tail only.
What gh answered is classified here (`classify`, pure): a rate limit (GitHub's "API rate limit
exceeded", "secondary rate limit"), a failure that retrying cannot fix (no such pull request, gh
not installed or not logged in) or a transient one (anything else: the network, GitHub's 5xx, a
timeout). Nothing gh prints is logged; only the first line of its error is kept for the person.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.runtime.gh import GhResult, run_gh
from peerd.waits.machine import Check, FailureKind, PullRequest, Snapshot

GhRunner = Callable[..., Awaitable[GhResult]]
POLL_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 4000
VIEW_FIELDS = "number,url,state,reviewDecision,mergedAt,closedAt,headRefOid,latestReviews"
CHECK_FIELDS = "name,state,bucket,link,workflow"
_RATE = re.compile(r"rate limit|abuse detection|was submitted too quickly", re.IGNORECASE)
_GONE = re.compile(
    r"no pull requests? found|could not resolve to a pullrequest|could not resolve to a repository|"
    r"not a git repository|none of the git remotes|gh auth login|authentication|not logged in",
    re.IGNORECASE,
)
_NO_CHECKS = re.compile(r"no checks reported", re.IGNORECASE)
_RUN_ID = re.compile(r"/actions/runs/(\d+)")


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    detail: str


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def classify(result: GhResult) -> Failure:
    """What a failed `gh` call means for the wait (pure)."""
    said = _first_line(result.stderr) or _first_line(result.stdout) or f"gh exited {result.returncode}"
    if _RATE.search(result.stderr) or _RATE.search(result.stdout):
        return Failure("rate_limited", f"GitHub's API rate limit: {said}")
    if result.returncode == 127:
        return Failure(
            "terminal",
            "gh (the GitHub CLI) is not installed on this machine: install it (https://cli.github.com), "
            "run `gh auth login`, and wait again",
        )
    if _GONE.search(result.stderr):
        return Failure("terminal", f"gh cannot read this pull request: {said}")
    return Failure("transient", f"gh failed (exit {result.returncode}): {said}")


def parse_view(stdout: str) -> PullRequest:
    data = json.loads(stdout)
    reviews = [
        {"submittedAt": str(r.get("submittedAt") or ""), "state": str(r.get("state") or "")}
        for r in data.get("latestReviews") or []
        if isinstance(r, dict)
    ]
    newest = max(reviews, key=lambda r: r["submittedAt"], default={})
    return PullRequest(
        number=int(data.get("number") or 0),
        url=str(data.get("url") or ""),
        state=str(data.get("state") or ""),
        review_decision=str(data.get("reviewDecision") or ""),
        head=str(data.get("headRefOid") or ""),
        newest_review_at=newest.get("submittedAt") or "",
        newest_review_state=newest.get("state") or "",
    )


def parse_checks(stdout: str) -> tuple[Check, ...]:
    rows: list[dict[str, Any]] = json.loads(stdout) if stdout.strip() else []
    return tuple(
        Check(
            name=str(row.get("name") or ""),
            state=str(row.get("state") or ""),
            bucket=str(row.get("bucket") or "pending").lower(),
            link=str(row.get("link") or ""),
            workflow=str(row.get("workflow") or ""),
        )
        for row in rows
    )


def _in(slug: str | None) -> tuple[str, ...]:
    return () if slug is None else ("--repo", slug)


async def poll(repo: Path, pr: str, slug: str | None = None, *, gh: GhRunner = run_gh) -> Snapshot | Failure:
    """One look at the pull request (in the project's repository `slug`, `HOST/OWNER/REPO`, when
    it has one): its state and review, and its checks."""
    view = await gh(repo, "pr", "view", pr, *_in(slug), "--json", VIEW_FIELDS, timeout_s=POLL_TIMEOUT_S)
    if view.returncode != 0:
        return classify(view)
    try:
        pull = parse_view(view.stdout)
    except (ValueError, TypeError, AttributeError):
        return Failure("transient", "gh pr view answered something that is not its JSON")
    checks = await gh(repo, "pr", "checks", pr, *_in(slug), "--json", CHECK_FIELDS, timeout_s=POLL_TIMEOUT_S)
    # `gh pr checks` exits 8 while some are pending and 1 when one failed, JSON on stdout either way.
    if checks.returncode not in (0, 1, 8) or (checks.returncode != 0 and not checks.stdout.strip()):
        if _NO_CHECKS.search(checks.stderr):
            return Snapshot(pull, ())
        return classify(checks)
    try:
        return Snapshot(pull, parse_checks(checks.stdout))
    except (ValueError, TypeError, AttributeError):
        return Failure("transient", "gh pr checks answered something that is not its JSON")


async def failing_log_tail(
    repo: Path, snapshot: Snapshot, slug: str | None = None, *, gh: GhRunner = run_gh
) -> str:
    """The tail of the first failing check's log (`gh run view RUN --log-failed`), or "" when there
    is none to be had cheaply (a check that is not a GitHub Actions run, gh failing)."""
    for check in snapshot.checks:
        if check.bucket not in ("fail", "cancel"):
            continue
        match = _RUN_ID.search(check.link)
        if match is None:
            continue
        result = await gh(
            repo, "run", "view", match.group(1), *_in(slug), "--log-failed", timeout_s=POLL_TIMEOUT_S
        )
        if result.returncode != 0 or not result.stdout.strip():
            return ""
        tail = "\n".join(result.stdout.rstrip().splitlines()[-LOG_TAIL_LINES:])
        return tail[-LOG_TAIL_CHARS:]
    return ""


FEEDBACK_FIELDS = "reviews,comments"
FEEDBACK_ITEMS = 20  # the newest reviews and comments kept
FEEDBACK_CHARS = 2000  # of each one's body


@dataclass(frozen=True)
class Remark:
    """A review (its state: CHANGES_REQUESTED, COMMENTED, APPROVED ...) or a comment ("COMMENT") on
    the pull request, as `gh pr view --json reviews,comments` gives them."""

    author: str
    state: str
    body: str
    at: str


def parse_feedback(stdout: str) -> tuple[Remark, ...]:
    """The reviews that say something and the comments, oldest first (the newest kept)."""
    data = json.loads(stdout)
    found: list[Remark] = []
    for kind, stamp in (("reviews", "submittedAt"), ("comments", "createdAt")):
        for row in data.get(kind) or []:
            body = str(row.get("body") or "").strip()
            state = str(row.get("state") or "COMMENT") if kind == "reviews" else "COMMENT"
            if not body and state != "CHANGES_REQUESTED":
                continue
            author = str((row.get("author") or {}).get("login") or "someone")
            found.append(Remark(author, state, body[:FEEDBACK_CHARS], str(row.get(stamp) or "")))
    found.sort(key=lambda r: r.at)
    return tuple(found[-FEEDBACK_ITEMS:])


async def feedback(
    repo: Path, pr: str, slug: str | None = None, *, gh: GhRunner = run_gh
) -> tuple[Remark, ...]:
    """What the reviews and comments of the pull request say (one more call, made only when a
    review asked for changes); empty when gh cannot say."""
    result = await gh(repo, "pr", "view", pr, *_in(slug), "--json", FEEDBACK_FIELDS, timeout_s=POLL_TIMEOUT_S)
    if result.returncode != 0:
        return ()
    try:
        return parse_feedback(result.stdout)
    except (ValueError, TypeError, AttributeError):
        return ()
