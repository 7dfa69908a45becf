"""What work cost, in the browser: a thread page's runs' usage and the thread's total, a task's
usage on the Tasks page, and an orchestration's usage per packet and hop with the total
(docs/user/usage.md). Scripted runs report synthetic usage per step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import ConsoleConfig, PriceConfig
from tests.helpers import client_for, running_daemon, script, wait_terminal
from tests.support.console import console_url, shot, signed_in
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    project_repo,
    settings,
    start,
    steps,
)

pytestmark = pytest.mark.browser


def used(n_in: int, n_out: int, **more: Any) -> dict[str, Any]:
    return {"usage": {"input_tokens": n_in, "output_tokens": n_out, **more}}


async def test_threads_tasks_and_orchestrations_show_what_they_spent(browser: Any, tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    # a price for a model the scripted runs name: its runs' cost is an estimate
    config = settings(tmp_path).model_copy(
        update={
            "console": ConsoleConfig(listen="127.0.0.1:0"),
            "prices": {"priced": PriceConfig(input_per_mtok=10.0, output_per_mtok=0.0)},
        }
    )
    async with (
        running_daemon(tmp_path / "home", label="laptop", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        child = script({"reply": "child", **used(700, 30, cost_usd=0.25)})
        prompt = script(
            {"reply": "one", **used(1000, 200, cost_usd=0.5)},
            {"tool": {"name": "delegate_task", "arguments": {"task": child, "mode": "wait"}, "check": True}},
        )
        body = {"projectId": project["id"], "prompt": prompt}
        launched = await client.call("POST", "/v1/threads", body=body)
        await wait_terminal(client, launched["threadId"], launched["runId"], total=30)
        sent = await client.call(
            "POST", f"/v1/threads/{launched['threadId']}/runs", body={"text": script({"reply": "no usage"})}
        )
        await wait_terminal(client, launched["threadId"], sent["runId"])
        priced = await client.call(
            "POST", "/v1/threads", body={**body, "prompt": script(used(1200, 0)), "model": "priced"}
        )
        await wait_terminal(client, priced["threadId"], priced["runId"])
        plan = [
            packet(
                "fix-add",
                "Fix.\n\n" + steps(FIX_ADD, used(4000, 100), {"reply": "ok"}),
                ["calc.py"],
                CHECK_ADD,
            )
        ]
        orc = await start(client, project, plan=plan, coders=["script"], packetBudget={"tokens": 100000})
        assert (await finished(client, orc["id"]))["status"] == "completed"

        page = await signed_in(browser, daemon)
        base = console_url(daemon)
        # a thread: each run's usage (an unknown one says so) and the thread's total
        await page.goto(f"{base}/threads/here/{launched['threadId']}")
        runs = page.locator("section.usage tr.run-usage")
        assert await runs.count() == 2
        assert (
            "1,200 tokens (1,000 in, 0 cached; 200 out, 0 reasoning), $0.5000"
            in await runs.nth(0).inner_text()
        )
        assert "not reported" in await runs.nth(1).inner_text()
        total = await page.inner_text("dd.usage-total")
        assert "1,200 tokens" in total and "$0.5000" in total  # the child's runs count apart
        await shot(page, "thread-usage")
        await page.goto(f"{base}/threads/here/{priced['threadId']}")
        assert "~$0.0120 (estimate)" in await page.inner_text("dd.usage-total")
        # a task: its child's usage
        await page.goto(f"{base}/tasks")
        row = page.locator("tr.task td.usage")
        assert "730 tokens (700 in, 0 cached; 30 out, 0 reasoning), $0.2500" in await row.first.inner_text()
        # an orchestration: the total, each packet's and each hop's; the integration used no model
        await page.goto(f"{base}/orchestrations/{orc['id']}")
        assert "4,100 tokens" in await page.inner_text("tr.packet[data-packet=fix-add] td.usage")
        usage = page.locator("section.usage")
        text = await usage.inner_text()
        assert "Total: 4,100 tokens" in text and "100,000 tokens per packet" in text
        assert (
            "attempt 1" in text and "review round 1" in text and "integration (peerd's git, no model)" in text
        )
        hop = await usage.locator("tr.hop", has_text="attempt 1").inner_text()
        assert "4,100 tokens (4,000 in" in hop
        assert "not reported" in await usage.locator("tr.hop", has_text="review round 1").inner_text()
        await shot(page, "orchestration-usage")
