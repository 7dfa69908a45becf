"""Usage a link cannot forge (issue 27, case 4). The scripted coder's usage is text its prompt's
author wrote: it is recorded marked `claimed`, counted by the caller's own budgets (the owner's
scripted runs still record and stop on it), and never by the box owner's per-link dollar ceiling,
which counts only usage peerd parsed from a coder CLI's own stream; a link's scripted run still
counts as a run. Real daemons on loopback, the scripted provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import Config, LinksConfig
from peerd.core.usage import Usage, ceiling_spend
from peerd.errors import PeerdError
from peerd.store.threads import usage as usage_store
from tests.helpers import client_for, make_repo, running_daemon, script, two_daemons, wait_terminal

Json = dict[str, Any]


def test_the_ceiling_counts_no_claimed_cost() -> None:
    parsed, claimed = Usage(cost_usd=0.5), Usage(cost_usd=7.0, claimed=True)
    assert ceiling_spend([parsed, claimed, None]) == 0.5
    assert Usage.from_json(claimed.to_json()) == claimed and claimed.plus(parsed).claimed


async def test_the_owners_scripted_run_records_its_usage_marked_claimed(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home"), client_for(tmp_path / "home") as client:
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "r"))})
        prompt = script({"reply": "x", "usage": {"input_tokens": 10, "cost_usd": 0.5}})
        body = {"projectId": project["id"], "prompt": prompt, "budget": {"usd": 0.25}}
        launched = await client.call("POST", "/v1/threads", body=body)
        final = await wait_terminal(client, launched["threadId"], launched["runId"], total=15)
        thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
        usage = thread["latestRun"]["usage"]
        assert usage["claimed"] is True and usage["costUsd"] == 0.5 and usage["inputTokens"] == 10
        assert final["status"] == "failed"  # the owner's own budget still stops on it


@pytest.mark.slow
async def test_a_links_scripted_usage_moves_the_dollar_ceiling_neither_way(tmp_path: Path) -> None:
    settings = Config(links=LinksConfig(max_runs=4, max_usd_per_day=1.0))
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")
        box_db = pair.box.db
        assert box_db is not None

        async def launch_there(prompt: str) -> Json:
            body = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": prompt}
            launched: Json = await pair.lc.call("POST", "/v1/threads", body=body)
            await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
            return launched

        # A claimed $5 is not a cost the box paid: the next launch is admitted ...
        await launch_there(script({"reply": "loud", "usage": {"cost_usd": 5.0}}))
        tiny = await launch_there(script({"reply": "quiet", "usage": {"cost_usd": 0.0, "input_tokens": 1}}))
        shown = await pair.bc.call("GET", f"/v1/threads/{tiny['threadId']}")
        assert shown["latestRun"]["usage"]["claimed"] is True
        # ... and a cost parsed from a CLI's own stream (what the run manager records for Codex,
        # Claude Code or Gemini CLI) reaches the ceiling, whatever the scripted runs printed.
        await usage_store.set_run_usage(box_db, tiny["runId"], Usage(input_tokens=1, cost_usd=1.25))
        with pytest.raises(PeerdError) as refused:
            await launch_there(script({"reply": "under", "usage": {"cost_usd": 0.0001}}))
        assert refused.value.code == "capability_denied"
        assert "links.max_usd_per_day" in refused.value.message and "$1.25 spent" in refused.value.message
        # The run count counts every scripted run; the dollars only the parsed cost.
        client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
        assert await usage_store.link_spend(box_db, client_id, 0.0) == (2, 1.25)
