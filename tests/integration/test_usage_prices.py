"""The owner's price table (`[prices]` in config.toml): a run whose CLI reports no cost gets an
estimated cost, marked as one, counted by budgets and by the per-link dollar ceiling; a CLI's own
cost always wins. Real daemons, the scripted provider reporting synthetic usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import Config, LinksConfig, PriceConfig
from peerd.core.usage import Usage
from peerd.errors import PeerdError
from peerd.store.threads import usage as usage_store
from tests.helpers import client_for, make_repo, running_daemon, script, two_daemons, wait_terminal
from tests.support.cli import ok, peerd

Json = dict[str, Any]
# $1.25 per million input tokens ($0.125 cached), $10 per million output tokens
PRICE = PriceConfig(input_per_mtok=1.25, cached_input_per_mtok=0.125, output_per_mtok=10.0)
MILLION = {"input_tokens": 1_000_000, "cached_tokens": 200_000, "output_tokens": 100_000}
# 800,000 * 1.25 + 200,000 * 0.125 + 100,000 * 10, per million: $1.0 + $0.025 + $1.0
COST = 2.025


async def run_to_end(client: Any, project: Json, prompt: str, **extra: Any) -> Json:
    body = {"projectId": project["id"], "prompt": prompt, **extra}
    launched: Json = await client.call("POST", "/v1/threads", body=body)
    await wait_terminal(client, launched["threadId"], launched["runId"], total=15)
    thread: Json = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    return thread


async def test_a_run_without_a_cost_is_priced_from_the_table_and_says_it_is_an_estimate(
    tmp_path: Path,
) -> None:
    settings = Config(
        prices={"tiny-model": PRICE, "script": PriceConfig(input_per_mtok=1, output_per_mtok=1)}
    )
    async with (
        running_daemon(tmp_path / "home", settings=settings) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        # the thread's model has an entry
        thread = await run_to_end(
            client, project, script({"reply": "hi", "usage": MILLION}), model="tiny-model"
        )
        usage = thread["latestRun"]["usage"]
        assert usage["costUsd"] == pytest.approx(COST) and usage["costEstimated"] is True
        assert thread["usage"]["costEstimated"] is True  # a sum with an estimate in it is one
        shown = ok(await peerd(daemon.paths.home, "thread", "show", thread["id"]))
        assert "~$2.0250 (estimate)" in shown
        # a CLI's own cost always wins over the table
        own = await run_to_end(
            client, project, script({"usage": {**MILLION, "cost_usd": 0.5}}), model="tiny-model"
        )
        assert (
            own["latestRun"]["usage"]["costUsd"] == 0.5
            and own["latestRun"]["usage"]["costEstimated"] is False
        )
        # no model: the entry named after the provider
        plain = await run_to_end(client, project, script({"usage": {"input_tokens": 2_000_000}}))
        assert plain["latestRun"]["usage"]["costUsd"] == pytest.approx(2.0)
        assert plain["latestRun"]["usage"]["costEstimated"] is True
        # a model the table does not know: the provider's entry too
        other = await run_to_end(client, project, script({"usage": MILLION}), model="unpriced")
        assert other["latestRun"]["usage"]["costUsd"] == pytest.approx(1.1)  # the provider's entry


async def test_a_usd_budget_stops_a_run_on_its_estimated_cost(tmp_path: Path) -> None:
    settings = Config(prices={"tiny-model": PRICE})
    async with (
        running_daemon(tmp_path / "home", settings=settings) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        prompt = script({"usage": MILLION}, {"wait": 20})
        thread = await run_to_end(client, project, prompt, model="tiny-model", budget={"usd": 1})
        run = thread["latestRun"]
        assert (run["status"], run["reason"]) == ("failed", "budget exceeded: ~$2.0250 of $1.0000")
        # without a price the same usage has no cost, and a usd budget cannot bite on it
        unpriced = await run_to_end(
            client, project, script({"usage": MILLION}), model="other", budget={"usd": 1}
        )
        assert (
            unpriced["latestRun"]["status"] == "completed"
            and unpriced["latestRun"]["usage"]["costUsd"] is None
        )


async def test_the_per_link_dollar_ceiling_counts_estimates(tmp_path: Path) -> None:
    settings = Config(links=LinksConfig(max_usd_per_day=1.0), prices={"script": PRICE})
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")
        body = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": script({"reply": "a"})}
        launched = await pair.lc.call("POST", "/v1/threads", body=body)
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
        # The tokens as a coder CLI's own stream reports them (a scripted run's are only claimed,
        # and the ceiling counts no claimed cost: test_usage_claimed.py), priced from the table.
        assert pair.box.db is not None
        await usage_store.set_run_usage(pair.box.db, launched["runId"], Usage(**MILLION))
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", "/v1/threads", body={**body, "prompt": script({"reply": "more"})})
        assert refused.value.code == "capability_denied"
        assert "links.max_usd_per_day" in refused.value.message and "$2.02 spent" in refused.value.message
