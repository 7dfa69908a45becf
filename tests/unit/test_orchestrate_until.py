"""`orchestrate --until`, the pure part (`orchestrate/until.py`, `untilreport.py`) and what it added
to the waits' machine and reads (the head a wait is about; a review's words in gh's JSON)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from peerd.orchestrate import store as ostore
from peerd.orchestrate import until, untilreport
from peerd.orchestrate.models import CoderChoice, PrCheck, PrFixReceipt, PrWaitReceipt
from peerd.store.db import Database
from peerd.waits import gh as ghio
from peerd.waits import machine
from peerd.waits.pace import GhPace
from tests.fakeclock import FakeClock
from tests.support.stubgh import check, comment, review, view


def snap(head: str, *buckets: tuple[str, str], decision: str = "") -> machine.Snapshot:
    pr = machine.PullRequest(7, "https://github.com/o/r/pull/7", "OPEN", decision, head=head)
    return machine.Snapshot(pr, tuple(machine.Check(n, b.upper(), b) for n, b in buckets))


def test_a_wait_about_a_pushed_fix_ignores_the_checks_of_the_head_before() -> None:
    failing = snap("old", ("build", "fail"))
    assert machine.judge("checks", failing, head="new") is None  # GitHub has not seen the push yet
    assert machine.judge("checks", failing, head="old") == "failed"
    assert machine.judge("checks", snap("", ("build", "fail")), head="new") == "failed"  # gh did not say
    watch = machine.Watch(until="checks", deadline=100.0, head="new")
    _, actions = machine.step(watch, machine.Polled(failing, 1.0), poll_s=5.0)
    assert actions == (machine.NextPoll(5.0),)
    _, actions = machine.step(watch, machine.Polled(snap("new", ("build", "pass")), 2.0), poll_s=5.0)
    assert actions == (machine.Deliver("passed", ""),)


@dataclass(frozen=True)
class Packet:
    packet_id: str
    state: str
    failure: str | None = None


def test_a_fix_that_was_not_integrated_ends_the_run_instead_of_waiting_again() -> None:
    coder = CoderChoice(spec="script", backend="script", reason="the implementer")
    fix = PrFixReceipt(
        attempt=2, round=2, reason="changes_requested", packet_id="pr-fix-2", base="abc", coder=coder, at=1.0
    )
    parked = [Packet("fix-add", "integrated"), Packet("pr-fix-2", "parked", "the edit found no match")]
    why = until.fix_not_made(fix, parked)
    assert why is not None and "fix attempt 2 (pr-fix-2) was not integrated" in why
    assert "parked: the edit found no match" in why
    assert until.fix_not_made(fix, [Packet("pr-fix-2", "integrated")]) is None
    assert until.fix_not_made(None, parked) is None


def test_what_the_run_does_when_its_wait_ends() -> None:
    assert until.decide("passed", "", attempts=1, over_budget=None) == until.Finish(
        "completed", "pull request: its checks passed"
    )
    for outcome in ("approved", "merged"):
        assert until.decide(outcome, "", attempts=0, over_budget=None) == until.Finish(
            "completed",
            "pull request: " + ("its review approved it" if outcome == "approved" else "it was merged"),
        )
    assert until.decide("failed", "", attempts=0, over_budget=None) == until.Fix("checks_failed", 1)
    assert until.decide("changes_requested", "", attempts=1, over_budget=None) == until.Fix(
        "changes_requested", 2
    )
    limit = until.decide("failed", "", attempts=until.FIX_LIMIT, over_budget=None)
    assert isinstance(limit, until.Finish) and limit.status == "failed"
    assert f"after {until.FIX_LIMIT} fix attempt(s), the limit" in limit.why
    spent = until.decide("failed", "", attempts=0, over_budget="budget exceeded: 12 of 10 tokens")
    assert isinstance(spent, until.Finish) and "past its budget (budget exceeded" in spent.why
    for outcome in ("closed", "timed_out", "error"):
        ended = until.decide(outcome, "gh cannot read this pull request", attempts=0, over_budget=None)
        assert isinstance(ended, until.Finish) and ended.status == "failed"


def test_the_pull_request_is_asked_for_in_the_projects_repository_or_by_number() -> None:
    url = "https://github.com/o/r/pull/7"
    assert until.pr_ref(url, "orchestrate/x/integrated", "github.com/o/r") == ("7", "github.com/o/r")
    assert until.pr_ref(url, "orchestrate/x/integrated", "/tmp/origin.git") == ("7", None)
    assert until.pr_ref(url, "orchestrate/x/integrated", "github.com/other/repo") == ("7", None)
    assert until.pr_ref("https://example.com/weird", "b", None) == ("b", None)


def test_the_fix_packets_goal_quotes_the_failing_checks_and_their_log_or_the_review() -> None:
    failing = [PrCheck(name="build", state="FAILURE", bucket="fail", link="https://x/runs/1")]
    goal = until.fix_goal(
        "checks_failed", url="U", failing_checks=failing, log_tail="E assert 1 == 2", remarks=[]
    )
    assert "CI checks of U failed" in goal and "- build: FAILURE (https://x/runs/1)" in goal
    assert "```\nE assert 1 == 2\n```" in goal
    goal = until.fix_goal(
        "changes_requested",
        url="U",
        failing_checks=[],
        log_tail="",
        remarks=["ana (changes requested): rename x"],
    )
    assert "asked for changes" in goal and "- ana (changes requested): rename x" in goal
    spec = until.fix_spec(2, goal, ["calc.py"], "make test")
    assert spec.id == "pr-fix-2" and spec.allow_out_of_scope is True and spec.files == ["calc.py"]


def test_a_poll_is_recorded_only_when_it_says_something_new() -> None:
    wait = PrWaitReceipt(round=1, until="checks", pr="7", deadline_at=1e12, at=0.0)
    watch = until.watch_of(wait)
    first = until.polled(wait, watch, snap("a", ("build", "pending")), error=None, delay_s=30.0, now=1.0)
    assert until.worth_recording(wait, first) and first.next_at == 31.0 and first.polls == 1
    same = until.polled(first, watch, snap("a", ("build", "pending")), error=None, delay_s=30.0, now=31.0)
    assert not until.worth_recording(first, same) and same.polls == 2
    limited = machine.replace(watch, rate_limited=1)
    backoff = until.polled(same, limited, None, error="GitHub's API rate limit", delay_s=60.0, now=32.0)
    assert until.worth_recording(same, backoff) and backoff.delay_s == 60.0 and backoff.checks == same.checks


def test_gh_reads_the_head_and_the_reviews_and_comments_in_their_real_shape() -> None:
    assert ghio.parse_view(json.dumps({**view(), "headRefOid": "abc"})).head == "abc"
    said = ghio.parse_feedback(
        json.dumps(
            {
                "reviews": [
                    review("ana", "CHANGES_REQUESTED", "Rename x.", at="2026-12-03T01:00:00Z"),
                    review("bo", "APPROVED", "", at="2026-12-03T00:00:00Z"),  # nothing to say: left out
                ],
                "comments": [comment("cy", "And add a test.", at="2026-12-03T02:00:00Z")],
            }
        )
    )
    assert [(r.author, r.state, r.body) for r in said] == [
        ("ana", "CHANGES_REQUESTED", "Rename x."),
        ("cy", "COMMENT", "And add a test."),
    ]


def test_the_report_shows_the_open_wait_then_the_pull_requests_final_state() -> None:
    watching = {
        "round": 1, "until": "checks", "pr": "7", "url": "https://github.com/o/r/pull/7", "status": "watching",
        "polls": 3, "prState": "OPEN", "reviewDecision": "", "checks": [check("build", "pending")],
        "deadlineAt": 1e12, "at": 0.0,
    }  # fmt: skip
    info = {"packets": [], "receipts": [{"kind": "pr_wait", "packetId": None, "body": watching}]}
    text = "\n".join(untilreport.section(info))
    assert "pull request https://github.com/o/r/pull/7: waiting until checks (round 1, 3 poll(s))" in text
    assert "checks: build pending" in text and "fix attempts: 0" in text
    ended = {
        **watching,
        "round": 2,
        "status": "delivered",
        "outcome": "passed",
        "checks": [check("build", "pass")],
    }
    fix = {"attempt": 1, "round": 1, "reason": "checks_failed", "packetId": "pr-fix-1", "at": 0.0,
           "failingChecks": [check("build", "fail")]}  # fmt: skip
    info = {
        "packets": [{"id": "pr-fix-1", "state": "integrated"}],
        "receipts": [
            {"kind": "pr_wait", "packetId": None, "body": watching},
            {"kind": "pr_fix", "packetId": "pr-fix-1", "body": fix},
            {"kind": "pr_wait", "packetId": None, "body": ended},
        ],
    }
    lines = untilreport.section(info)
    assert lines[1] == "pull request https://github.com/o/r/pull/7: waited until checks: every check passed"
    assert "  state: OPEN, merged: no" in lines and "  checks: build pass" in lines
    assert "  fix attempts: 1" in lines
    assert any("1. checks failed: build -> packet pr-fix-1 (integrated)" in line for line in lines)
    seen: dict[str, object] = {}
    assert untilreport.progress(info, seen) and not untilreport.progress(info, seen)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    async with database.write() as tx:
        await tx.execute("INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', 0)")
    try:
        yield database
    finally:
        await database.close()


async def test_a_fix_is_recorded_once_with_its_packet_and_only_while_the_run_waits(db: Database) -> None:
    run = await ostore.create(
        db, project_id="prj_1", task="t", request={"coders": []}, base_commit="c" * 40, now=1.0
    )
    await ostore.add_packets(db, run.id, [{"id": "a"}], now=1.0)
    wait = {"round": 1, "status": "watching"}
    assert not await ostore.open_wait(db, run.id, wait, now=2.0)  # still planning: no wait opens
    await ostore.set_status(db, run.id, "integrating", now=2.0)
    assert await ostore.open_wait(db, run.id, wait, now=3.0)
    assert (await ostore.get(db, run.id)).status == "waiting"
    spec = {"id": "pr-fix-1", "goal": "g", "files": ["a"], "verify": "true"}
    fix = dict(
        wait={**wait, "status": "delivered"}, fix={"attempt": 1}, spec=spec, coder={"spec": "script"},
        reviewer={"spec": "script"}, now=4.0,
    )  # fmt: skip
    assert await ostore.add_fix(db, run.id, **fix)  # type: ignore[arg-type]
    assert not await ostore.add_fix(db, run.id, **fix)  # type: ignore[arg-type]  # a second one: no
    after = await ostore.get(db, run.id)
    assert after.status == "running" and [p.packet_id for p in after.packets] == ["a", "pr-fix-1"]
    assert after.packets[1].state == "queued" and after.packets[1].position == 1
    assert after.request["assignment"]["pr-fix-1"] == {"spec": "script"}
    assert after.request["reviewers"]["pr-fix-1"] == {"spec": "script"}
    assert len(await ostore.receipts_of_kind(db, run.id, "pr_fix")) == 1
    assert [w["status"] for w in await ostore.receipts_of_kind(db, run.id, "pr_wait")] == [
        "watching",
        "delivered",
    ]


async def test_one_pace_for_every_poller_of_the_daemons_gh_login() -> None:
    clock = FakeClock()
    pace = GhPace(clock)
    assert pace.interval(30.0) == 30.0
    for n in range(100):  # waits and orchestrations together
        pace.join(f"p{n}")
    assert pace.interval(30.0) == 180.0  # 100 pollers x 2 calls every 180 s: 4,000 an hour
    pace.leave("p0")
    pace.rate_limited(60.0)
    pace.rate_limited(10.0)  # a shorter pause never shortens the one in force
    waiting = asyncio.create_task(pace.ready())
    assert await clock.jump() == 60.0
    await waiting
    assert clock.slept == [60.0]
