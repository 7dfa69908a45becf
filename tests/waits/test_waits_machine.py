"""The wait's rules, pure (`peerd/waits/machine.py`, `peerd/waits/gh.py:classify`): no socket, no
store, no clock but the numbers given."""

from __future__ import annotations

import json

import pytest

from peerd.runtime.gh import GhResult
from peerd.waits.gh import classify, parse_checks, parse_view
from peerd.waits.machine import (
    POLL_BACKOFF,
    RATE_LIMIT_BACKOFF,
    Cancel,
    Cancelled,
    Check,
    Deliver,
    NextPoll,
    Polled,
    PollFailed,
    PullRequest,
    Snapshot,
    Watch,
    first_delay,
    judge,
    review_mark,
    scope_pr,
    spaced,
    step,
    wake_text,
)

POLL = 30.0
NOW = 1_000.0


def snap(state: str = "OPEN", review: str = "", *checks: tuple[str, str, str]) -> Snapshot:
    return Snapshot(
        PullRequest(number=7, url="https://github.com/o/r/pull/7", state=state, review_decision=review),
        tuple(
            Check(name=n, state=s, bucket=b, link=f"https://github.com/o/r/actions/runs/9/job/{n}")
            for n, s, b in checks
        ),
    )


def test_checks_wait_until_none_is_pending_then_say_passed_or_failed() -> None:
    assert judge("checks", snap()) is None  # no check reported yet: CI may not have started
    assert (
        judge("checks", snap("OPEN", "", ("build", "IN_PROGRESS", "pending"), ("lint", "SUCCESS", "pass")))
        is None
    )
    assert (
        judge("checks", snap("OPEN", "", ("build", "FAILURE", "fail"), ("lint", "SUCCESS", "pass")))
        == "failed"
    )
    assert judge("checks", snap("OPEN", "", ("build", "CANCELLED", "cancel"))) == "failed"
    assert (
        judge("checks", snap("OPEN", "", ("build", "SUCCESS", "pass"), ("docs", "SKIPPED", "skipping")))
        == "passed"
    )


def test_review_merged_and_closed() -> None:
    assert judge("review", snap("OPEN", "REVIEW_REQUIRED")) is None
    assert judge("review", snap("OPEN", "CHANGES_REQUESTED")) == "changes_requested"
    assert judge("review", snap("OPEN", "APPROVED")) == "approved"
    assert judge("merged", snap("OPEN", "APPROVED")) is None
    assert judge("merged", snap("MERGED")) == "merged"
    assert judge("merged", snap("CLOSED")) == "closed"  # can never merge now: it ends
    assert judge("closed", snap("CLOSED")) == "closed"
    assert judge("checks", snap("MERGED", "", ("build", "IN_PROGRESS", "pending"))) == "merged"


def test_a_wait_polls_on_until_satisfied_and_then_ends_once() -> None:
    watch = Watch(until="checks", deadline=NOW + 3600)
    watch, actions = step(watch, Polled(snap("OPEN", "", ("b", "PENDING", "pending")), NOW), poll_s=POLL)
    assert actions == (NextPoll(POLL),) and watch.status == "watching"
    watch, actions = step(watch, Polled(snap("OPEN", "", ("b", "FAILURE", "fail")), NOW + 30), poll_s=POLL)
    assert actions == (Deliver("failed", ""),) and watch.status == "delivered"
    # delivered once: a late poll, a second satisfied poll or a cancel change nothing
    again, more = step(watch, Polled(snap("OPEN", "", ("b", "SUCCESS", "pass")), NOW + 60), poll_s=POLL)
    assert (again, more) == (watch, ())
    assert step(watch, Cancel("late"), poll_s=POLL) == (watch, ())


def test_rate_limits_back_off_exponentially_and_never_sooner_than_the_reset() -> None:
    watch = Watch(until="checks", deadline=NOW + 10 * 3600)
    delays = []
    for n in range(1, 7):
        watch, actions = step(watch, PollFailed("rate_limited", "API rate limit exceeded", NOW), poll_s=POLL)
        (action,) = actions
        assert isinstance(action, NextPoll) and watch.rate_limited == n
        delays.append(action.delay)
    assert delays == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0]  # a minute, doubling, capped at 15
    watch2, (told,) = step(Watch(until="checks", deadline=NOW + 3600),
                           PollFailed("rate_limited", "x", NOW, retry_after=1800.0), poll_s=POLL)  # fmt: skip
    assert told == NextPoll(1800.0)
    # jitter comes from the draw, within the schedule's bound
    _, (jittered,) = step(
        Watch(until="checks", deadline=NOW + 3600),
        PollFailed("rate_limited", "x", NOW),
        poll_s=POLL,
        draw=1.0,
    )
    assert jittered == NextPoll(RATE_LIMIT_BACKOFF.longest(1))
    # an answer ends the backoff: the next failure starts from the first delay again
    calm, (normal,) = step(watch, Polled(snap("OPEN", "", ("b", "PENDING", "pending")), NOW), poll_s=POLL)
    assert normal == NextPoll(POLL) and calm.rate_limited == 0 and calm.failures == 0
    assert watch2.rate_limited == 1


def test_transient_failures_back_off_but_never_poll_faster_than_the_interval() -> None:
    watch = Watch(until="review", deadline=NOW + 10 * 3600)
    watch, (first,) = step(watch, PollFailed("transient", "timeout", NOW), poll_s=POLL)
    assert first == NextPoll(max(POLL_BACKOFF.delay(1), POLL)) and watch.failures == 1
    for _ in range(10):
        watch, (later,) = step(watch, PollFailed("transient", "timeout", NOW), poll_s=POLL)
    assert later == NextPoll(POLL_BACKOFF.cap)


def test_a_terminal_failure_and_the_deadline_deliver_with_the_reason() -> None:
    watch = Watch(until="merged", deadline=NOW + 60)
    ended, (action,) = step(
        watch, PollFailed("terminal", "no pull requests found for branch x", NOW), poll_s=POLL
    )
    assert action == Deliver("error", "no pull requests found for branch x") and ended.status == "delivered"
    late, (timeout,) = step(watch, Polled(snap("OPEN", "APPROVED"), NOW + 61), poll_s=POLL)
    assert isinstance(timeout, Deliver) and timeout.outcome == "timed_out" and late.status == "delivered"
    _, (timeout2,) = step(watch, PollFailed("rate_limited", "x", NOW + 61), poll_s=POLL)
    assert isinstance(timeout2, Deliver) and timeout2.outcome == "timed_out"


def test_cancel_ends_it_without_a_delivery() -> None:
    watch, actions = step(Watch(until="checks", deadline=NOW + 60), Cancel("thread archived"), poll_s=POLL)
    assert watch.status == "cancelled" and actions == (Cancelled("thread archived"),)
    assert step(watch, Polled(snap("MERGED"), NOW), poll_s=POLL) == (watch, ())


def test_after_a_restart_a_stored_backoff_holds_at_most_its_delay() -> None:
    assert first_delay(delay_s=None, next_at=None, wall_now=NOW, poll_s=POLL) == 0.0
    assert first_delay(delay_s=120.0, next_at=NOW + 100, wall_now=NOW, poll_s=POLL) == 100.0
    assert (
        first_delay(delay_s=120.0, next_at=NOW + 10_000, wall_now=NOW, poll_s=POLL) == 120.0
    )  # wall stepped back
    assert first_delay(delay_s=120.0, next_at=NOW - 5, wall_now=NOW, poll_s=POLL) == 0.0


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        (GhResult(1, "", "HTTP 403: API rate limit exceeded for user ID 1."), "rate_limited"),
        (
            GhResult(1, "", "You have exceeded a secondary rate limit. Please wait a few minutes"),
            "rate_limited",
        ),
        (GhResult(1, "", 'no pull requests found for branch "feature"'), "terminal"),
        (GhResult(4, "", "To get started with GitHub CLI, please run:  gh auth login"), "terminal"),
        (GhResult(127, "", "gh is not installed"), "terminal"),
        (GhResult(1, "", "error connecting to api.github.com"), "transient"),
        (GhResult(124, "", "gh pr did not answer within 60 s"), "transient"),
    ],
)
def test_gh_answers_are_classified(result: GhResult, kind: str) -> None:
    assert classify(result).kind == kind


def test_gh_json_shapes_parse() -> None:
    pr = parse_view(
        json.dumps(
            {
                "number": 7,
                "url": "u",
                "state": "OPEN",
                "reviewDecision": "",
                "mergedAt": None,
                "closedAt": None,
            }
        )
    )
    assert pr == PullRequest(7, "u", "OPEN", "")
    rows = [{"name": "build", "state": "FAILURE", "bucket": "fail", "link": "l", "workflow": "CI"}]
    assert parse_checks(json.dumps(rows)) == (Check("build", "FAILURE", "fail", "l", "CI"),)
    assert parse_checks("") == ()
    ana = {"author": {"login": "ana"}, "state": "CHANGES_REQUESTED", "submittedAt": "2026-12-03T01:00:00Z"}
    bo = {"author": {"login": "bo"}, "state": "COMMENTED", "submittedAt": "2026-12-03T02:00:00Z"}
    reviewed = parse_view(json.dumps({"number": 7, "url": "u", "state": "OPEN", "latestReviews": [bo, ana]}))
    assert (reviewed.newest_review_at, reviewed.newest_review_state) == ("2026-12-03T02:00:00Z", "COMMENTED")


def test_the_wake_text_names_the_checks_and_the_failing_tail() -> None:
    seen = snap("OPEN", "REVIEW_REQUIRED", ("build", "FAILURE", "fail"), ("lint", "SUCCESS", "pass"))
    text = wake_text("wt_1", "7", "checks", "failed", "", seen, "E   assert 1 == 2")
    assert "wt_1" in text and "#7 (https://github.com/o/r/pull/7)" in text and "checks failed" in text
    assert "- build: FAILURE (fail) https://github.com/o/r/actions/runs/9/job/build" in text
    assert "- lint: SUCCESS (pass)" in text and "assert 1 == 2" in text and "wait_for_github" in text


def test_a_review_wait_after_changes_were_asked_waits_for_the_next_review() -> None:
    watch = Watch(until="review", deadline=NOW + 3600)
    watch, (first,) = step(watch, Polled(snap("OPEN", "CHANGES_REQUESTED"), NOW), poll_s=POLL)
    assert first == NextPoll(POLL) and watch.baseline == "CHANGES_REQUESTED"  # the review it answers
    watch, (again,) = step(watch, Polled(snap("OPEN", "CHANGES_REQUESTED"), NOW + 30), poll_s=POLL)
    assert again == NextPoll(POLL)
    watch, (done,) = step(watch, Polled(snap("OPEN", "APPROVED"), NOW + 60), poll_s=POLL)
    assert done == Deliver("approved", "")
    fresh, (asked,) = step(
        Watch(until="review", deadline=NOW + 3600), Polled(snap("OPEN", "REVIEW_REQUIRED"), NOW), poll_s=POLL
    )
    fresh, (asked,) = step(fresh, Polled(snap("OPEN", "CHANGES_REQUESTED"), NOW + 30), poll_s=POLL)
    assert asked == Deliver("changes_requested", "")


def asked(at: str, state: str = "CHANGES_REQUESTED") -> Snapshot:
    pr = PullRequest(7, "u", "OPEN", "CHANGES_REQUESTED", newest_review_at=at, newest_review_state=state)
    return Snapshot(pr, ())


def test_a_reviewer_who_asks_for_changes_again_is_heard() -> None:
    """The decision stays CHANGES_REQUESTED when a reviewer asks again after a fix: a review asking
    for changes newer than the baseline's is the news; a comment is not, nor the same review."""
    watch = Watch(until="review", deadline=NOW + 3600)
    watch, (first,) = step(watch, Polled(asked("2026-12-03T01:00:00Z"), NOW), poll_s=POLL)
    assert first == NextPoll(POLL) and watch.baseline == "CHANGES_REQUESTED@2026-12-03T01:00:00Z"
    assert watch.baseline == review_mark("CHANGES_REQUESTED", "2026-12-03T01:00:00Z")
    watch, (same,) = step(watch, Polled(asked("2026-12-03T01:00:00Z"), NOW + 30), poll_s=POLL)
    assert same == NextPoll(POLL)
    watch, (comment,) = step(watch, Polled(asked("2026-12-03T02:00:00Z", "COMMENTED"), NOW + 60), poll_s=POLL)
    assert comment == NextPoll(POLL)
    watch, (again,) = step(watch, Polled(asked("2026-12-03T03:00:00Z"), NOW + 90), poll_s=POLL)
    assert again == Deliver("changes_requested", "")
    # A baseline an older peerd stored (the decision alone) keeps its meaning.
    assert judge("review", asked("2026-12-03T03:00:00Z"), "CHANGES_REQUESTED") is None


def test_a_wait_watches_its_own_projects_pull_requests_only() -> None:
    key = "github.com/o/r"
    assert scope_pr("7", key) == ("7", key)
    assert scope_pr("feature/x", key) == ("feature/x", key)
    assert scope_pr("https://github.com/O/R/pull/12", key) == ("12", key)
    assert scope_pr("7", "file:/tmp/origin") == ("7", None)  # no GitHub origin: gh reads the checkout
    assert scope_pr("7", None) == ("7", None)
    for bad, why in [
        ("https://github.com/other/secret/pull/3", "not in this thread's repository"),
        ("https://github.com/o/r/issues/3", "is not a pull request's URL"),
        ("ftp://github.com/o/r/pull/3", "is not a pull request's URL"),
    ]:
        with pytest.raises(ValueError, match=why):
            scope_pr(bad, key)
    with pytest.raises(ValueError, match="no GitHub origin"):
        scope_pr("https://github.com/o/r/pull/3", None)


def test_many_open_waits_poll_less_often_to_stay_within_githubs_hourly_limit() -> None:
    assert spaced(30.0, 1) == 30.0
    assert spaced(30.0, 10) == 30.0
    assert spaced(30.0, 100) == 180.0  # 100 waits x 2 calls every 180 s = 4,000 calls an hour
    assert spaced(0.05, 0) == 1.8
