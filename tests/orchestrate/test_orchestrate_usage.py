"""An orchestration's usage and budgets: each hop's receipt carries what its runs spent, the report
sums packets and the run, a packet past --packet-budget is parked, and past --budget nothing new
starts. Scripted coders report synthetic usage per step (docs/user/usage.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peerd.cli.common import EXIT_USAGE
from peerd.orchestrate.report import render
from tests.helpers import client_for, git, running_daemon, two_daemons
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

DOCS = {"write": {"path": "docs/usage.md", "content": "add\n"}}
DOCS_CHECK = "test -f docs/usage.md"
REPLY = {"reply": "ok"}


def used(n_in: int, n_out: int, cost: float | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": n_in, "output_tokens": n_out}
    if cost is not None:
        usage["cost_usd"] = cost
    return {"usage": usage}


async def test_every_receipt_carries_its_hops_usage_and_the_report_sums_them(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [
            packet("fix-add", "Fix.\n\n" + steps(FIX_ADD, used(1000, 50, 0.01), REPLY), ["calc.py"], CHECK_ADD),
            packet("docs", "Docs.\n\n" + steps(DOCS, used(2000, 100), REPLY), ["docs"], DOCS_CHECK),
        ]  # fmt: skip
        info = await start(client, project, plan=plan, coders=["script"], packetBudget={"tokens": 100000})
        done = await finished(client, info["id"])
    assert done["status"] == "completed", done
    packets = packets_of(done)
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["usage"]["inputTokens"] == 1000 and impl["usage"]["outputTokens"] == 50
    assert impl["usage"]["costUsd"] == 0.01
    assert receipts_of(done, "implementation", "docs")[-1]["usage"]["totalTokens"] == 2100
    # the budget state, in every hop's receipt: limit, spent, not exceeded
    state = impl["budgets"][0]
    assert state["scope"] == "packet" and state["limit"]["tokens"] == 100000
    assert state["spent"]["totalTokens"] == 1050 and not state["exceeded"] and state["reason"] is None
    # the custom reviewer reports nothing: unknown, not zero
    review = receipts_of(done, "review", "fix-add")[-1]
    assert review["usage"] is None and review["budgets"][0]["spent"]["totalTokens"] == 1050
    # peerd's own integration spends nothing
    integration = receipts_of(done, "integration")[-1]
    assert integration["usage"] is None
    assert packets["fix-add"]["usage"]["totalTokens"] == 1050
    assert packets["docs"]["usage"]["totalTokens"] == 2100
    assert done["usage"]["totalTokens"] == 3150 and done["usage"]["costUsd"] == 0.01
    text = render(done)
    assert "usage: 3,150 tokens (3,000 in, 0 cached; 150 out, 0 reasoning), $0.0100" in text
    assert "usage: 1,050 tokens (1,000 in, 0 cached; 50 out, 0 reasoning), $0.0100" in text
    assert "usage: not reported" in text  # the reviewer's
    assert "integration usage: none (peerd's own git" in text
    assert "budget: none for the run, 100,000 tokens per packet" in text


async def test_a_packet_past_its_budget_is_parked_with_the_reason(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        big = steps(FIX_ADD, used(30000, 100), used(21000, 100), {"wait": 20}, {"reply": "done"})
        plan = [
            packet("big", "Fix.\n\n" + big, ["calc.py"], CHECK_ADD),
            packet("docs", "Docs.\n\n" + steps(DOCS, used(2000, 100), REPLY), ["docs"], DOCS_CHECK),
        ]  # fmt: skip
        info = await start(
            client, project, plan=plan, coders=["script", "script:other"], packetBudget={"tokens": 50000}
        )
        done = await finished(client, info["id"], total=60)
    packets = packets_of(done)
    # stopped by its run's budget as usage arrived (long before the wait ended), then parked,
    # never re-dispatched to the other coder
    assert packets["big"]["state"] == "parked", packets["big"]
    assert packets["big"]["failure"] == "budget exceeded: 51,200 of 50,000 tokens"
    assert packets["big"]["attempt"] == 1
    tries = receipts_of(done, "implementation", "big")
    assert [t["verification"]["classification"] for t in tries] == ["budget"]
    assert tries[0]["usage"]["totalTokens"] == 51200
    assert (
        tries[0]["budgets"][0]["exceeded"] and tries[0]["budgets"][0]["reason"] == packets["big"]["failure"]
    )
    # the hop's run had the packet's budget as its own
    hop = [r["body"] for r in done["receipts"] if r["kind"] == "hop_budget" and r["packetId"] == "big"]
    assert hop[0]["budget"]["tokens"] == 50000
    assert packets["docs"]["state"] == "integrated"
    assert "budget exceeded: 51,200 of 50,000 tokens" in render(done)


async def test_past_the_whole_runs_budget_no_new_hop_starts(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [
            packet("first", "Fix.\n\n" + steps(FIX_ADD, used(45000, 100), {"reply": "ok"}), ["calc.py"], CHECK_ADD),
            packet("second", "Docs.\n\n" + steps(DOCS, {"reply": "ok"}), ["docs"], DOCS_CHECK),
        ]  # fmt: skip
        info = await start(
            client, project, plan=plan, coders=["script"], budget={"tokens": 40000}, concurrency=1
        )
        done = await finished(client, info["id"], total=60)
    why = "budget exceeded: 45,100 of 40,000 tokens (the whole orchestration's --budget)"
    assert done["status"] == "failed" and done["reason"] == why, done
    packets = packets_of(done)
    assert packets["first"]["failure"] == why
    assert packets["second"]["state"] == "parked" and packets["second"]["failure"] == why
    assert receipts_of(done, "implementation", "second") == []  # it never started
    assert not [r for r in done["receipts"] if r["kind"] == "thread" and r["packetId"] == "second"]
    assert done["usage"]["totalTokens"] == 45100
    assert why in render(done)


async def test_a_hop_on_a_linked_box_reports_its_usage_and_the_box_stops_it_at_the_budget(
    tmp_path: Path,
) -> None:
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(project_repo(tmp_path / "seed")), str(origin))
    async with two_daemons(tmp_path, settings=settings(tmp_path)) as pair:
        for side, client in (("laptop", pair.lc), ("box", pair.bc)):
            git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
            await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
        await pair.link("auto")
        project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
        big = steps(DOCS, used(30000, 100), used(21000, 100), {"wait": 20}, {"reply": "done"})
        plan = [
            packet("fix-add", "Fix.\n\n" + steps(FIX_ADD, used(1000, 50), {"reply": "ok"}), ["calc.py"], CHECK_ADD),
            packet("big", "Docs.\n\n" + big, ["docs"], DOCS_CHECK),
        ]  # fmt: skip
        info = await start(
            pair.lc, project, plan=plan, coders=["box/script"], concurrency=2, packetBudget={"tokens": 50000}
        )
        done = await finished(pair.lc, info["id"], total=90)
    packets = packets_of(done)
    assert packets["fix-add"]["state"] == "integrated" and packets["fix-add"]["environment"] == "box"
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["usage"]["totalTokens"] == 1050 and impl["environment"] == "box"
    # the box stopped the run as usage arrived (its run budget went with the launch), long before
    # the wait ended; the laptop parked the packet with its own sum
    assert packets["big"]["failure"] == "budget exceeded: 51,200 of 50,000 tokens"
    assert receipts_of(done, "implementation", "big")[-1]["usage"]["totalTokens"] == 51200
    assert done["usage"]["totalTokens"] == 52250


async def test_the_cli_takes_budgets_and_reports_the_usage(tmp_path: Path) -> None:

    repo = project_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon:
        home = daemon.paths.home
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        bad = await peerd_in(
            home, repo, "orchestrate", "fix it", "--coder", "script", "--budget", "tokens=lots"
        )
        assert (
            bad.returncode == EXIT_USAGE
            and "--budget" in bad.stderr
            and "'lots' is not a number" in bad.stderr
        )
        plan = tmp_path / "plan"
        plan.mkdir()
        big = steps(FIX_ADD, used(30000, 100), used(21000, 100), {"wait": 20})
        (plan / "big.md").write_text(
            f'+++\nfiles = ["calc.py"]\nverify = "{CHECK_ADD}"\n+++\nFix.\n\n{big}\n'
        )
        done = await peerd_in(
            home, repo, "orchestrate", "--plan", str(plan), "--coder", "script", "--reviewer", "reviewer",
            "--non-interactive", "--packet-budget", "tokens=50000", "--budget", "usd=5",
        )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    text = done.stdout
    assert "budget exceeded: 51,200 of 50,000 tokens" in text
    assert "budget: $5.0000 for the run, 50,000 tokens per packet" in text
    assert "usage: 51,200 tokens (51,000 in" in text
