"""`peerd orchestrate --pr --until checks|review|merged`: after its pull request, the run waits on it
(through the waits' machine and gh reads, recorded in its own receipts), sends ONE fix packet per
failing check or review asking for changes, pushes the fix to the same branch and waits again; the
report ends with the pull request's final state. Real daemons, a local bare origin, the stub `gh`
on PATH speaking gh's JSON (`tests/support/stubgh.py`, per pushed head)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import WaitsConfig
from peerd.errors import PeerdError
from peerd.orchestrate.report import render
from tests.helpers import DaemonProcess, client_for, git, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    peerd_in,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
)
from tests.support.stubgh import (
    RATE_LIMITED,
    STALE,
    StubGh,
    comment,
    failing,
    merged,
    passing,
    pending,
    review,
    reviewed,
)

PLAN = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
# What "CI" asks for, in the failing job's log (the scripted coder runs the first script it reads).
CI_FIX = {"edit": {"path": "calc.py", "old": "return a + b", "new": "return b + a"}}
CI_LOG = "tests/test_calc.py::test_order FAILED\nE   AssertionError: operands in the wrong order\n" + steps(
    CI_FIX
)
REVIEW_FIX = {
    "edit": {"path": "calc.py", "old": '"""A tiny calculator."""', "new": '"""A small calculator."""'}
}
REVIEW_FIX_AGAIN = {
    "edit": {"path": "calc.py", "old": '"""A small calculator."""', "new": '"""A small, tidy calculator."""'}
}


def origin_repo(tmp_path: Path) -> tuple[Path, Path]:
    repo = project_repo(tmp_path / "repo")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "set-url", "origin", str(origin))
    return repo, origin


@pytest.fixture
def gh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StubGh:
    return StubGh.install(tmp_path / "bin", monkeypatch)


@pytest.fixture
async def env(tmp_path: Path, gh: StubGh) -> AsyncIterator[tuple[LocalClient, dict[str, Any], Path, Path]]:
    repo, origin = origin_repo(tmp_path)
    config = settings(tmp_path).model_copy(update={"waits": WaitsConfig(poll_seconds=0.05)})
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        yield client, project, repo, origin


async def until_run(client: LocalClient, project: dict[str, Any], until: str) -> dict[str, Any]:
    return await start(client, project, plan=PLAN, coders=["script"], reviewer="script", pr=True, until=until)


async def wait_for(
    client: LocalClient, run_id: str, check: Callable[[dict[str, Any]], Any], total: float = 60.0
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + total
    info: dict[str, Any] = await client.call("GET", f"/v1/orchestrations/{run_id}")
    while not check(info):
        assert info["status"] not in ("completed", "failed", "cancelled"), render(info)
        assert asyncio.get_running_loop().time() < deadline, render(info)
        info = await client.call(
            "GET", f"/v1/orchestrations/{run_id}", params={"after": info["updatedAt"], "timeout": 10}
        )
    return info


def tip(origin: Path, branch: str) -> str:
    return git(origin, "rev-parse", f"refs/heads/{branch}").strip()


@pytest.mark.slow
async def test_an_orchestration_with_until_checks_fixes_a_failing_check_in_one_extra_packet_and_ends_green(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh: StubGh
) -> None:
    client, project, _, origin = env
    # The first head: pending, then build fails; the fix's head: GitHub still shows the head before
    # (build failing: not the fix's checks), then pending, then everything passes.
    gh.rounds([pending(), failing()], [STALE, pending(), passing()], log_failed=CI_LOG)
    info = await until_run(client, project, "checks")
    done = await finished(client, info["id"], total=180)
    assert done["status"] == "completed", render(done)
    assert "pull request: its checks passed" in done["reason"]
    assert {p["id"]: p["state"] for p in done["packets"]} == {
        "fix-add": "integrated",
        "pr-fix-1": "integrated",
    }
    (fix,) = receipts_of(done, "pr_fix", "pr-fix-1")  # one fix attempt, a typed receipt
    assert fix["reason"] == "checks_failed" and [c["name"] for c in fix["failingChecks"]] == ["build"]
    assert "operands in the wrong order" in fix["logTail"] and fix["coder"]["backend"] == "script"
    deliveries = receipts_of(done, "delivery")
    assert len(deliveries) == 2 and all(d["pushed"] for d in deliveries)
    assert deliveries[0]["commit"] == fix["base"] != deliveries[1]["commit"]
    # The fix went to the same branch (the pull request updates): one pull request, never two.
    assert (
        tip(origin, done["branch"])
        == deliveries[1]["commit"]
        == receipts_of(done, "integration")[-1]["commit"]
    )
    assert "return b + a" in git(origin, "show", f"{done['branch']}:calc.py")
    assert gh.created() == 1
    waits = receipts_of(done, "pr_wait")
    assert [w["round"] for w in waits if w["status"] != "watching"] == [1, 2]
    assert waits[-1]["outcome"] == "passed" and {c["bucket"] for c in waits[-1]["checks"]} == {"pass"}
    assert waits[-1]["head"] == deliveries[1]["commit"]
    report = render(done)
    assert (
        report.rstrip()
        .splitlines()[-1]
        .startswith("    1. checks failed: build -> packet pr-fix-1 (integrated)")
    )
    assert "pull request https://github.com/o/r/pull/7: waited until checks: every check passed" in report
    assert "checks: build pass, lint pass" in report and "fix attempts: 1" in report


@pytest.mark.slow
async def test_a_review_asking_for_changes_gets_a_fix_with_its_words_then_approves(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh: StubGh
) -> None:
    client, project, _, origin = env
    asked = {
        **reviewed("CHANGES_REQUESTED"),
        "reviews": [review("ana", "CHANGES_REQUESTED", "Call it small.\n" + steps(REVIEW_FIX))],
        "comments": [comment("cy", "Nice otherwise.")],
    }
    # The fix's head still shows the review it answers; then the reviewer asks for changes again
    # (the decision stays CHANGES_REQUESTED: only a newer review says so), and approves the next.
    again = review(
        "ana", "CHANGES_REQUESTED", "Say tidy.\n" + steps(REVIEW_FIX_AGAIN), at="2026-12-03T02:00:00Z"
    )
    gh.rounds(
        [reviewed("REVIEW_REQUIRED"), asked],
        [{**asked, "comments": []}, {**asked, "reviews": [again], "comments": []}],
        [reviewed("APPROVED")],
    )
    done = await finished(client, (await until_run(client, project, "review"))["id"], total=180)
    assert done["status"] == "completed", render(done)
    assert "pull request: its review approved it" in done["reason"]
    (fix,) = receipts_of(done, "pr_fix", "pr-fix-1")
    assert fix["reason"] == "changes_requested"
    assert fix["remarks"][0].startswith("ana (changes requested): Call it small.")
    assert fix["remarks"][1] == "cy (comment): Nice otherwise."
    assert fix["answeredReviewAt"] == "2026-12-03T01:00:00Z"
    (second,) = receipts_of(done, "pr_fix", "pr-fix-2")  # the reviewer asked again: heard, once
    assert second["reason"] == "changes_requested" and second["round"] == 2
    assert any(r.startswith("ana (changes requested): Say tidy.") for r in second["remarks"])
    assert packets_of(done)["pr-fix-1"]["state"] == packets_of(done)["pr-fix-2"]["state"] == "integrated"
    assert '"""A small, tidy calculator."""' in git(origin, "show", f"{done['branch']}:calc.py")
    assert any(argv[-2:] == ["--json", "reviews,comments"] for argv in gh.calls())
    assert "review decision: APPROVED" in render(done)


@pytest.mark.slow
async def test_until_merged_waits_for_the_merge_and_reports_it(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh: StubGh
) -> None:
    client, project, _, _ = env
    gh.rounds([pending(), passing(), merged()])
    done = await finished(client, (await until_run(client, project, "merged"))["id"], total=120)
    assert done["status"] == "completed", render(done)
    assert done["reason"].endswith("pull request: it was merged")
    assert not receipts_of(done, "pr_fix", "pr-fix-1") and len(done["packets"]) == 1
    report = render(done)
    assert "waited until merged: it was merged" in report and "state: MERGED, merged: yes" in report


@pytest.mark.slow
async def test_cancel_ends_the_wait(env: tuple[LocalClient, dict[str, Any], Path, Path], gh: StubGh) -> None:
    client, project, _, _ = env
    gh.rounds([pending()])
    info = await until_run(client, project, "checks")
    info = await wait_for(
        client, info["id"], lambda i: i["status"] == "waiting" and receipts_of(i, "pr_wait")
    )
    shown = render(info)  # `orchestrate status` while it waits
    assert "pull request https://github.com/o/r/pull/7: waiting until checks (round 1" in shown
    await client.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={"reason": "not today"})
    done = await finished(client, info["id"])
    assert done["status"] == "cancelled"
    wait = receipts_of(done, "pr_wait")[-1]
    assert wait["status"] == "cancelled" and wait["detail"] == "not today"
    polls = gh.views()
    await asyncio.sleep(0.5)  # ten poll intervals: nobody asks GitHub any more
    assert gh.views() == polls
    assert "waited until checks: cancelled" in render(done)


async def test_a_rate_limit_answer_backs_the_wait_off_and_the_run_records_the_backoff(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh: StubGh
) -> None:
    client, project, _, _ = env
    gh.rounds([RATE_LIMITED])
    info = await until_run(client, project, "checks")
    info = await wait_for(
        client, info["id"], lambda i: any(w["lastError"] for w in receipts_of(i, "pr_wait"))
    )
    wait = receipts_of(info, "pr_wait")[-1]
    assert wait["status"] == "watching" and "rate limit" in wait["lastError"] and wait["rateLimited"] == 1
    assert wait["delayS"] >= 59 and wait["nextAt"] - wait["at"] >= 59  # a minute, not the 0.05 s interval
    assert "after: GitHub's API rate limit" in render(info)
    views = gh.views()
    await asyncio.sleep(0.5)
    assert gh.views() == views  # backing off: GitHub is not asked again meanwhile
    await client.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={})
    assert (await finished(client, info["id"]))["status"] == "cancelled"


async def test_bad_until_flags_are_refused(
    env: tuple[LocalClient, dict[str, Any], Path, Path], tmp_path: Path
) -> None:
    client, project, repo, _ = env
    with pytest.raises(PeerdError) as refused:
        await start(client, project, plan=PLAN, coders=["script"], until="checks")
    assert refused.value.code == "invalid_request" and "add --pr, or drop --until" in refused.value.message
    with pytest.raises(PeerdError) as refused:
        await start(client, project, plan=PLAN, coders=["script"], pr=True, until="green")
    assert refused.value.code == "invalid_request"
    assert (await client.call("GET", "/v1/orchestrations"))["items"] == []
    cli = await peerd_in(tmp_path / "home", repo, "orchestrate", "--until", "review", "fix it")
    assert cli.returncode == 2 and "--until review waits on the pull request the run opens" in cli.stderr
    cli = await peerd_in(tmp_path / "home", repo, "orchestrate", "--pr", "--until", "green", "fix it")
    assert cli.returncode == 2 and "'green' is not one of 'checks', 'review', 'merged'" in cli.stderr


@pytest.mark.slow
async def test_a_kill_9_while_it_waits_resumes_and_sends_one_fix_packet_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gh: StubGh
) -> None:
    repo, origin = origin_repo(tmp_path)
    config = tmp_path / "config.toml"
    config.write_text("[waits]\npoll_seconds = 0.1\n")
    monkeypatch.setenv("PEERD_CONFIG", str(config))
    gh.rounds([pending()])
    daemon = DaemonProcess(tmp_path / "home", label="laptop")
    daemon.start()
    try:
        await daemon.ready()
        async with client_for(daemon.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            info = await until_run(client, project, "checks")
            await wait_for(
                client, info["id"], lambda i: i["status"] == "waiting" and receipts_of(i, "pr_wait")
            )
        daemon.kill()  # SIGKILL while it waits on the pull request
        # Meanwhile CI failed; the fix's head will pass.
        gh.rounds([failing()], [pending(), passing()], log_failed=CI_LOG)
        daemon.start()
        await daemon.ready()
        async with client_for(daemon.home) as client:
            await wait_for(client, info["id"], lambda i: "pr-fix-1" in packets_of(i))
        daemon.kill()  # and again, right after the fix packet was recorded
        daemon.start()
        await daemon.ready()
        async with client_for(daemon.home) as client:
            done = await finished(client, info["id"], total=180)
    finally:
        daemon.kill()
    assert done["status"] == "completed", render(done)
    assert sorted(packets_of(done)) == ["fix-add", "pr-fix-1"]
    assert len(receipts_of(done, "pr_fix", "pr-fix-1")) == 1
    assert packets_of(done)["pr-fix-1"]["state"] == "integrated"
    assert gh.created() == 1
    assert tip(origin, done["branch"]) == receipts_of(done, "delivery")[-1]["commit"]
    assert receipts_of(done, "pr_wait")[-1]["outcome"] == "passed"


@pytest.mark.slow
async def test_a_kill_9_during_a_rate_limit_backoff_resumes_the_wait_and_keeps_the_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gh: StubGh
) -> None:
    repo, _ = origin_repo(tmp_path)
    config = tmp_path / "config.toml"
    config.write_text("[waits]\npoll_seconds = 0.1\n")
    monkeypatch.setenv("PEERD_CONFIG", str(config))
    gh.rounds([RATE_LIMITED])
    daemon = DaemonProcess(tmp_path / "home", label="laptop")
    daemon.start()
    try:
        await daemon.ready()
        async with client_for(daemon.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            info = await until_run(client, project, "checks")
            await wait_for(
                client, info["id"], lambda i: any(w["lastError"] for w in receipts_of(i, "pr_wait"))
            )
        daemon.kill()
        views = gh.views()
        daemon.start()
        await daemon.ready()
        async with client_for(daemon.home) as client:
            await asyncio.sleep(1.0)  # ten poll intervals: the recorded minute still holds
            info = await client.call("GET", f"/v1/orchestrations/{info['id']}")
            assert info["status"] == "waiting" and gh.views() == views
            await client.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={})
            assert receipts_of(await finished(client, info["id"]), "pr_wait")[-1]["status"] == "cancelled"
    finally:
        daemon.kill()
