"""A budget belongs to its work across every run of it (issue 26, case 6), in a real daemon: the
wake of a thread that delegated counts what the thread's launch spent, and a wake whose work is
already past its budget fails before its provider starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import client_for, make_repo, running_daemon, wait_terminal
from tests.support.delegation import READ_AND_REPORT, delegate, runs_script, wait_run_number


def spend(tokens: int) -> dict[str, Any]:
    return {"usage": {"input_tokens": tokens - 100, "output_tokens": 100}}


async def woken(tmp_path: Path, first: list[dict[str, Any]], wake: list[dict[str, Any]]) -> dict[str, Any]:
    repo = make_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home") as daemon, client_for(daemon.paths.home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(repo)})
        prompt = runs_script(first, wake)
        body = {"projectId": project["id"], "prompt": prompt, "budget": {"tokens": 50_000}}
        launched = await c.call("POST", "/v1/threads", body=body)
        thread_id = launched["threadId"]
        await wait_terminal(c, thread_id, launched["runId"])
        # 30 s: the child runs, its task ends, the wake (run 2) runs: followed on the thread's events.
        await wait_run_number(c, thread_id, 2, total=30)
        latest = (await c.call("GET", f"/v1/threads/{thread_id}"))["latestRun"]
        assert latest["status"] in ("completed", "failed"), latest
        items = await c.call("GET", f"/v1/threads/{thread_id}/items", params={"runId": latest["id"]})
        return {**latest, "texts": [i["text"] for i in items["items"]]}


CHILD = runs_script([{"reply": "CHILD"}])


async def test_a_wake_counts_what_its_launch_spent(tmp_path: Path) -> None:
    first = [spend(30_100), delegate(task=CHILD, clientRequestId="k1"), {"reply": "sent"}]
    wake = await woken(tmp_path, first, [spend(25_100), *READ_AND_REPORT])
    assert wake["status"] == "failed"
    assert (
        wake["reason"] == "budget exceeded: 55,200 of 50,000 tokens, counting the earlier runs of this work"
    )


async def test_a_wake_of_work_already_past_its_budget_does_not_start(tmp_path: Path) -> None:
    # The launch delegates, then its report passes the budget: it fails, and its task still ends.
    first = [{**delegate(task=CHILD, clientRequestId="k1"), **spend(50_100)}, {"wait": 20}]
    wake = await woken(tmp_path, first, READ_AND_REPORT)
    assert wake["status"] == "failed"
    assert (
        wake["reason"] == "budget exceeded: 50,100 of 50,000 tokens, counting the earlier runs of this work"
    )
    assert not any(t.startswith("PARENT GOT") for t in wake["texts"])  # its provider never ran
