"""Usage per run and per thread, and budgets that stop runs: real daemons, the scripted provider
reporting synthetic usage per step (issue 20)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, LinksConfig
from peerd.core.usage import Usage as CoreUsage
from peerd.daemon import Daemon
from peerd.errors import PeerdError
from peerd.store.threads import usage as usage_store
from tests.helpers import items, make_repo, script, two_daemons, wait_terminal
from tests.support.cli import ok, peerd
from tests.support.delegation import linked_pair, wait_run_number

Json = dict[str, Any]


async def launch(client: LocalClient, project: Json, prompt: str, **extra: Any) -> Json:
    result: Json = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt, **extra}
    )
    return result


async def run_of(client: LocalClient, thread_id: str) -> Json:
    thread: Json = await client.call("GET", f"/v1/threads/{thread_id}")
    return thread


async def ended(client: LocalClient, launched: Json) -> Json:
    """The launched run once it is terminal (its status, reason and usage)."""
    await wait_terminal(client, launched["threadId"], launched["runId"], total=15)
    run: Json = (await run_of(client, launched["threadId"]))["latestRun"]
    assert run["id"] == launched["runId"]
    return run


async def test_a_runs_usage_is_stored_exactly_and_summed_per_thread(
    client: LocalClient, project: Json
) -> None:
    first = await launch(
        client,
        project,
        script(
            {"reply": "one", "usage": {"input_tokens": 1000, "output_tokens": 200, "cached_tokens": 300}},
            {"reply": "two", "usage": {"input_tokens": 500, "output_tokens": 50, "reasoning_tokens": 20}},
            {"usage": {"cost_usd": 0.25}},
        ),
    )
    assert (await wait_terminal(client, first["threadId"], first["runId"]))["status"] == "completed"
    thread = await run_of(client, first["threadId"])
    usage = thread["latestRun"]["usage"]
    assert {k: usage[k] for k in usage if k not in ("wallMs",)} == {
        "inputTokens": 1500,
        "outputTokens": 250,
        "cachedTokens": 300,
        "reasoningTokens": 20,
        "totalTokens": 1750,
        "costUsd": 0.25,
        "providerMs": None,
        "costEstimated": False,  # the CLI's own cost (here, the script's)
        "claimed": True,  # the script's say, not a CLI's stream
    }
    assert isinstance(usage["wallMs"], int) and usage["wallMs"] >= 0
    # A follow-up with no usage of its own: the thread's sum is the first run's.
    sent = await client.call(
        "POST", f"/v1/threads/{first['threadId']}/runs", body={"text": script({"reply": "three"})}
    )
    assert (await wait_terminal(client, first["threadId"], sent["runId"]))["status"] == "completed"
    thread = await run_of(client, first["threadId"])
    assert thread["latestRun"]["usage"] is None  # unknown, not zero
    assert thread["usage"]["totalTokens"] == 1750
    again = await client.call(
        "POST",
        f"/v1/threads/{first['threadId']}/runs",
        body={"text": script({"reply": "four", "usage": {"input_tokens": 10, "output_tokens": 5}})},
    )
    await wait_terminal(client, first["threadId"], again["runId"])
    thread = await run_of(client, first["threadId"])
    assert thread["usage"]["totalTokens"] == 1765
    assert thread["usage"]["costUsd"] == 0.25


async def test_thread_show_prints_the_runs_and_the_threads_usage(
    daemon: Daemon, client: LocalClient, project: Json
) -> None:
    launched = await launch(
        client, project, script({"reply": "hi", "usage": {"input_tokens": 51200, "output_tokens": 3}})
    )
    await wait_terminal(client, launched["threadId"], launched["runId"])
    shown = ok(await peerd(daemon.paths.home, "thread", "show", launched["threadId"]))
    assert "run usage" in shown and "51,203 tokens (51,200 in, 0 cached; 3 out" in shown
    assert "thread usage" in shown


async def test_a_token_budget_stops_the_run_mid_way_and_fails_it_with_the_reason(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    never = tmp_path / "never.txt"
    launched = await launch(
        client,
        project,
        script(
            {"reply": "step one", "usage": {"input_tokens": 30000, "output_tokens": 100}},
            {"reply": "step two", "usage": {"input_tokens": 21000, "output_tokens": 100}},
            {"wait": 20},  # the budget stops the run here, long before the wait ends
            {"write": {"path": str(never), "content": "ran past its budget"}},
        ),
        budget={"tokens": 50000},
    )
    final = await ended(client, launched)
    assert final["status"] == "failed"
    assert final["reason"] == "budget exceeded: 51,200 of 50,000 tokens"
    assert not never.exists()
    texts = [item["text"] for item in await items(client, launched["threadId"])]
    assert "step two" in texts
    assert "budget exceeded: 51,200 of 50,000 tokens" in texts  # the error item says it too
    assert final["usage"]["totalTokens"] == 51200


async def test_a_run_within_its_budget_completes(client: LocalClient, project: Json) -> None:
    launched = await launch(
        client,
        project,
        script({"reply": "ok", "usage": {"input_tokens": 49000, "output_tokens": 1000}}),
        budget={"tokens": 50000, "usd": 1.0, "seconds": 60},
    )
    final = await ended(client, launched)
    assert final["status"] == "completed", final


async def test_a_seconds_budget_stops_a_run_that_reports_nothing(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"wait": 30}), budget={"seconds": 0.5})
    final = await ended(client, launched)
    assert final["status"] == "failed"
    assert final["reason"].startswith("budget exceeded: ") and final["reason"].endswith(" of 0.5 seconds")


async def test_a_usd_budget_stops_the_run(client: LocalClient, project: Json) -> None:
    launched = await launch(
        client,
        project,
        script({"usage": {"cost_usd": 0.75}}, {"usage": {"cost_usd": 0.5}}, {"wait": 20}),
        budget={"usd": 1},
    )
    final = await ended(client, launched)
    assert (final["status"], final["reason"]) == ("failed", "budget exceeded: $1.2500 of $1.0000")


async def test_a_budget_must_be_positive(client: LocalClient, project: Json) -> None:
    for budget in ({"tokens": 0}, {"usd": -1}, {"seconds": 0}, {"tokens": 5, "other": 1}):
        try:
            await launch(client, project, "hi", budget=budget)
        except Exception as exc:  # any refusal; its code is checked below
            assert getattr(exc, "code", None) == "invalid_request", exc
        else:
            raise AssertionError(f"budget {budget} was accepted")


# --- delegated tasks ------------------------------------------------------------------------------

OVERSPENDING_CHILD = script(
    {"reply": "child step one", "usage": {"input_tokens": 30000, "output_tokens": 100}},
    {"reply": "child step two", "usage": {"input_tokens": 21000, "output_tokens": 100}},
    {"wait": 20},
    {"reply": "child never gets here"},
)


def delegate_with_budget(**arguments: Any) -> dict[str, Any]:
    return {"tool": {"name": "delegate_task", "arguments": arguments, "check": True}}


def parent_prompt(**arguments: Any) -> str:
    """A parent that delegates (run 1) and, woken (run 2), replies with the task's status and result."""
    runs = [
        {"steps": [delegate_with_budget(**arguments)]},
        {
            "steps": [
                {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
                {"reply": "PARENT GOT ${status}: ${result}"},
            ]
        },
    ]
    return "```peerd-script\n" + json.dumps({"runs": runs}) + "\n```"


async def woken_reply(client: LocalClient, parent: str, total: float = 30) -> str:
    """The parent's reply in its wake run (run 2)."""
    await wait_run_number(client, parent, 2, total=total)  # followed on the parent's events
    texts = [i["text"] for i in await items(client, parent) if i["kind"] == "assistant_message"]
    return texts[-1]


async def test_a_delegated_tasks_budget_stops_its_child_and_wakes_the_parent_with_why(
    client: LocalClient, project: Json
) -> None:
    launched = await launch(client, project, parent_prompt(task=OVERSPENDING_CHILD, budget={"tokens": 50000}))
    parent = launched["threadId"]
    assert await woken_reply(client, parent) == "PARENT GOT failed: budget exceeded: 51,200 of 50,000 tokens"
    [task] = (await client.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
    assert task["status"] == "failed"
    child = (await run_of(client, task["childThreadId"]))["latestRun"]
    assert (child["status"], child["reason"]) == ("failed", "budget exceeded: 51,200 of 50,000 tokens")


async def test_a_task_on_a_linked_box_is_stopped_by_its_budget_there(tmp_path: Path) -> None:
    async with linked_pair(tmp_path, watch_chunk_s=5) as (pair, here):
        prompt = parent_prompt(
            task=OVERSPENDING_CHILD,
            target={"environmentId": pair.box_id},
            budget={"tokens": 50000},
            clientRequestId="b1",
        )
        launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": prompt})
        reply = await woken_reply(pair.lc, launched["threadId"], total=60)
        assert reply == "PARENT GOT failed: budget exceeded: 51,200 of 50,000 tokens"
        [task] = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
        there = await pair.bc.call("GET", f"/v1/threads/{task['remoteChild']['threadId']}")
        assert there["latestRun"]["usage"]["totalTokens"] == 51200


async def test_a_tasks_usage_is_its_childs_and_their_delegations_not_the_parents(
    daemon: Daemon, client: LocalClient, project: Json
) -> None:
    grandchild = script({"reply": "leaf", "usage": {"input_tokens": 7, "output_tokens": 3}})
    child = script(
        {"reply": "middle", "usage": {"input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5}},
        {"tool": {"name": "delegate_task", "arguments": {"task": grandchild, "mode": "wait"}, "check": True}},
    )
    prompt = script(
        {"reply": "parent's own", "usage": {"input_tokens": 5000, "output_tokens": 1}},
        {"tool": {"name": "delegate_task", "arguments": {"task": child, "mode": "wait"}, "check": True}},
    )
    launched = await launch(client, project, prompt)
    assert (await ended(client, launched))["status"] == "completed"
    [task] = (await client.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
    shown = await client.call("GET", f"/v1/tasks/{task['taskId']}")
    assert shown["usage"]["totalTokens"] == 130  # 120 of the child, 10 of the grandchild
    assert shown["usage"]["costUsd"] == 0.5
    parent = await run_of(client, launched["threadId"])
    assert parent["usage"]["totalTokens"] == 5001  # the parent's own, apart
    printed = ok(await peerd(daemon.paths.home, "task", "show", task["taskId"]))
    assert "130 tokens (107 in, 0 cached; 23 out, 0 reasoning), $0.5000" in printed


async def test_a_task_on_a_linked_box_reports_its_usage_with_the_result(tmp_path: Path) -> None:
    """The box sends what its thread spent (with that thread's own delegations) in the change
    feed's report; the laptop keeps it with the task, apart from the parent's own usage."""
    grandchild = script({"reply": "leaf", "usage": {"input_tokens": 7, "output_tokens": 3}})
    child = script(
        {"reply": "there", "usage": {"input_tokens": 900, "output_tokens": 90, "cost_usd": 0.02}},
        {"tool": {"name": "delegate_task", "arguments": {"task": grandchild, "mode": "wait"}, "check": True}},
        {"reply": "BOX DONE"},
    )
    async with linked_pair(tmp_path, watch_chunk_s=5) as (pair, here):
        prompt = parent_prompt(task=child, target={"environmentId": pair.box_id}, clientRequestId="u1")
        launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": prompt})
        assert await woken_reply(pair.lc, launched["threadId"], total=60) == "PARENT GOT completed: BOX DONE"
        [task] = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
        shown = await pair.lc.call("GET", f"/v1/tasks/{task['taskId']}")
        assert shown["usage"]["totalTokens"] == 1000 and shown["usage"]["costUsd"] == 0.02
        assert (await run_of(pair.lc, launched["threadId"]))["usage"] is None  # the parent spent nothing


# --- a box owner's ceilings per link -------------------------------------------------------------


async def test_a_links_ceilings_refuse_a_launch_and_say_which_limit(tmp_path: Path) -> None:
    settings = Config(links=LinksConfig(max_runs=2, max_usd_per_day=1.0))
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")

        async def launch_there(prompt: str) -> Json:
            body = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": prompt}
            launched: Json = await pair.lc.call("POST", "/v1/threads", body=body)
            await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
            return launched

        # The first run spends $1.25 (as a coder CLI's own stream reports it; a scripted run's
        # usage is only claimed and the ceiling does not count it: test_usage_claimed.py): the
        # dollar ceiling is reached before the run ceiling.
        first = await launch_there(script({"reply": "costly"}))
        assert pair.box.db is not None
        await usage_store.set_run_usage(pair.box.db, first["runId"], CoreUsage(cost_usd=1.25))
        with pytest.raises(PeerdError) as refused:
            await launch_there(script({"reply": "one more"}))
        assert refused.value.code == "capability_denied"
        assert "links.max_usd_per_day" in refused.value.message and "$1.25 spent" in refused.value.message
        # A follow-up is a run too: refused the same way; the owner's own runs are never limited.
        with pytest.raises(PeerdError) as again:
            await pair.lc.call(
                "POST",
                f"/v1/threads/{first['threadId']}/runs",
                params={"environmentId": pair.box_id},
                body={"text": "more", "environmentId": pair.box_id},
            )
        assert again.value.code == "capability_denied"
        own = await pair.bc.call("POST", "/v1/threads", body={"projectId": there["id"], "prompt": "mine"})
        assert own["runId"]


async def test_a_links_run_ceiling_counts_the_last_24_hours(tmp_path: Path) -> None:
    settings = Config(links=LinksConfig(max_runs=1))
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")
        body = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": script({"reply": "a"})}
        await pair.lc.call("POST", "/v1/threads", body=body)
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", "/v1/threads", body={**body, "prompt": script({"reply": "b"})})
        assert "at most 1 runs a day (links.max_runs" in refused.value.message


async def test_a_retried_launch_at_the_ceiling_reaches_its_first_thread(tmp_path: Path) -> None:
    """A retry (same clientRequestId) is answered with its first result, never refused for what
    that first copy spent: the ceiling is checked after the retry was answered, in one transaction."""
    settings = Config(links=LinksConfig(max_runs=1))
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")
        body = {
            "environmentId": pair.box_id,
            "projectId": there["id"],
            "prompt": script({"reply": "a"}),
            "clientRequestId": "launch-once",
        }
        first = await pair.lc.call("POST", "/v1/threads", body=body)
        again = await pair.lc.call("POST", "/v1/threads", body=body)
        assert (again["threadId"], again["replayed"]) == (first["threadId"], True)
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", "/v1/threads", body={**body, "clientRequestId": "another"})
        assert refused.value.code == "capability_denied"


async def test_a_link_started_runs_own_delegation_counts_against_the_links_ceiling(tmp_path: Path) -> None:
    """On the box, a run a link started delegates a local task: the child is launched as the link
    (tasks/delegation.py `_launch_local`), so with `links.max_runs` reached by the parent's own run
    the child's launch is refused and the task fails with the sentence naming the limit."""
    settings = Config(links=LinksConfig(max_runs=1))
    async with two_daemons(tmp_path, settings=settings) as pair:
        there = await pair.bc.call(
            "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
        )
        await pair.link("auto")
        delegated = {"task": script({"reply": "child ran"}), "mode": "async", "clientRequestId": "c1"}
        prompt = script(
            {"tool": {"name": "delegate_task", "arguments": delegated, "check": True}},
            {"reply": "DELEGATED ${status}: ${result}"},
        )
        body = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": prompt}
        launched = await pair.lc.call("POST", "/v1/threads", body=body)
        final = await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=30)
        assert final["status"] == "completed", final
        [task] = (await pair.bc.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
        assert task["status"] == "failed" and task["childThreadId"] is None
        why = (
            "The child thread could not start: This machine's owner lets a linked machine start at most 1 "
            "runs a day (links.max_runs in its config.toml); 1 started in the last 24 hours. Try later, or ask them."
        )
        assert task["result"] == why
        replies = [
            i["text"] for i in await items(pair.bc, launched["threadId"]) if i["kind"] == "assistant_message"
        ]
        assert replies[-1] == f"DELEGATED failed: {why}"
        # the box's owner delegating from their own run is not limited
        own = await pair.bc.call("POST", "/v1/threads", body={"projectId": there["id"], "prompt": prompt})
        assert (await wait_terminal(pair.bc, own["threadId"], own["runId"], total=30))[
            "status"
        ] == "completed"
        [mine] = (await pair.bc.call("GET", "/v1/tasks", params={"threadId": own["threadId"]}))["items"]
        assert mine["childThreadId"] is not None
