"""Waits on a pull request in a real daemon (one, in this event loop) with a stub `gh` on PATH
that changes state over time (tests/support/stubgh.py): an agent asks in one turn and ends it, and
is woken once, in a new turn, with what happened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, WaitsConfig
from peerd.console.fleet import read_fleet
from peerd.console.owner import Owner
from peerd.daemon import Daemon
from peerd.waits import store
from tests.helpers import client_for, items, make_repo, running_daemon, wait_terminal
from tests.support.delegation import delegate, runs_script, wait_run_number
from tests.support.eventually import eventually
from tests.support.stubgh import RATE_LIMITED, StubGh, failing, merged, passing, pending, reviewed

Json = dict[str, Any]
FAST = Config(waits=WaitsConfig(poll_seconds=0.05))


def wait_for(**arguments: Any) -> Json:
    return {"tool": {"name": "wait_for_github", "arguments": arguments, "check": True}}


@pytest.fixture
def gh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StubGh:
    return StubGh.install(tmp_path / "bin", monkeypatch)


@pytest.fixture
async def env(tmp_path: Path, gh: StubGh) -> AsyncIterator[tuple[Daemon, LocalClient, Json]]:
    async with (
        running_daemon(tmp_path / "home", listen=None, settings=FAST) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        repo = make_repo(tmp_path / "repo")
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        yield daemon, client, project


async def launch(client: LocalClient, project: Json, *runs: list[Json]) -> Json:
    body = {"projectId": project["id"], "prompt": runs_script(*runs), "inPlace": True}
    thread: Json = await client.call("POST", "/v1/threads", body=body)
    return thread


async def waits_of(client: LocalClient, thread_id: str) -> list[Json]:
    return list((await client.call("GET", "/v1/waits", params={"threadId": thread_id}))["items"])


async def test_a_checks_wait_wakes_its_thread_once_with_the_failing_checks_and_log(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    _, client, project = env
    gh.play(pending(), pending(), failing(), log_failed="step 3\nE   assert 1 == 2\nFAILED tests/test_x.py")
    thread = await launch(
        client, project, [wait_for(pr="7", until="checks"), {"reply": "waiting on CI"}], [{"reply": "WOKEN"}]
    )
    woken = await wait_run_number(client, thread["threadId"], 2)
    assert woken["status"] == "completed"
    (wait,) = await waits_of(client, thread["threadId"])
    assert wait["status"] == "delivered" and wait["outcome"] == "failed"
    assert wait["wokenRunId"] == woken["runId"] and wait["prUrl"] == "https://github.com/o/r/pull/7"
    assert {c["name"]: c["bucket"] for c in wait["checks"]} == {"build": "fail", "lint": "pass"}
    said = [i for i in await items(client, thread["threadId"]) if i.get("runId") == woken["runId"]]
    prompt = next(i["text"] for i in said if i["kind"] == "user_message")
    assert "checks failed" in prompt and "- build: FAILURE (fail)" in prompt and "assert 1 == 2" in prompt
    # always in the project's own repository (its origin), the failing run's log included
    assert ["run", "view", "4242", "--repo", "github.com/peerd/demo", "--log-failed"] in gh.calls()
    assert all(
        argv[argv.index("--repo") + 1] == "github.com/peerd/demo" for argv in gh.calls() if argv[0] != "run"
    )
    # delivered once: no further poll, no second wake
    views = gh.views()
    page = await client.call("GET", f"/v1/threads/{thread['threadId']}")
    assert page["latestRun"]["number"] == 2 and gh.views() == views


async def test_rate_limit_answers_back_off_and_the_wait_goes_on(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    _, client, project = env
    gh.play(RATE_LIMITED)
    thread = await launch(
        client, project, [wait_for(pr="7", until="merged"), {"reply": "ok"}], [{"reply": "WOKEN"}]
    )
    await wait_terminal(client, thread["threadId"], thread["runId"])

    async def backing_off() -> Json | None:
        waits = await waits_of(client, thread["threadId"])
        return waits[0] if waits and waits[0]["lastError"] else None

    wait = await eventually(backing_off, what="the wait noted the rate limit")
    assert wait["status"] == "watching" and "rate limit" in wait["lastError"]
    assert wait["nextPollAt"] - wait["createdAt"] >= 59  # a minute at least, not the 0.05 s interval
    assert gh.views() == 1


async def test_a_rate_limit_one_wait_hit_pauses_every_wait(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    """One gh login answers all the waits here: after a rate-limit answer no other wait asks
    GitHub either until the backoff is over."""
    _, client, project = env
    gh.play(RATE_LIMITED)
    thread = await launch(
        client, project, [wait_for(pr="7", until="merged"), {"reply": "ok"}], [{"reply": "W"}]
    )
    await wait_terminal(client, thread["threadId"], thread["runId"])

    async def limited() -> bool:
        return bool((await waits_of(client, thread["threadId"]))[0]["lastError"])

    await eventually(limited, what="the first wait hit the rate limit")
    views = gh.views()
    second = await launch(
        client, project, [wait_for(pr="8", until="merged"), {"reply": "ok"}], [{"reply": "W"}]
    )
    await wait_terminal(client, second["threadId"], second["runId"])
    await asyncio.sleep(0.5)  # a window (10 poll intervals) in which the second wait must not ask
    (paused,) = await waits_of(client, second["threadId"])
    assert paused["status"] == "watching" and paused["polls"] == 0 and gh.views() == views


async def test_review_changes_requested_then_merged(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    _, client, project = env
    gh.play(reviewed("REVIEW_REQUIRED"), reviewed("CHANGES_REQUESTED"))
    thread = await launch(
        client, project, [wait_for(pr="feature", until="review"), {"reply": "ok"}], [{"reply": "WOKEN"}]
    )
    await wait_run_number(client, thread["threadId"], 2)
    (wait,) = await waits_of(client, thread["threadId"])
    assert wait["outcome"] == "changes_requested" and wait["reviewDecision"] == "CHANGES_REQUESTED"
    gh.play(merged())
    await client.call(
        "POST", f"/v1/threads/{thread['threadId']}/runs",
        body={"text": runs_script([wait_for(pr="feature", until="merged"), {"reply": "ok"}], [{"reply": "M"}])},
    )  # fmt: skip
    await wait_run_number(client, thread["threadId"], 4)  # the send (3), then the merge's wake (4)
    newest = (await waits_of(client, thread["threadId"]))[0]
    assert newest["outcome"] == "merged" and newest["prState"] == "MERGED"


async def test_cancel_and_a_stopped_thread_end_waits_without_a_wake(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh, tmp_path: Path
) -> None:
    _, client, project = env
    repo = tmp_path / "repo"
    gh.play(pending())
    thread = await launch(
        client,
        project,
        [wait_for(pr="7", until="checks"), wait_for(pr="8", until="merged"), {"wait_for_file": "turn-ends"},
         {"reply": "ok"}],
        [{"reply": "WOKEN"}],
    )  # fmt: skip

    async def both_recorded() -> list[Json] | None:
        waits = await waits_of(client, thread["threadId"])
        return waits if len(waits) == 2 else None

    # recorded (and watched) while the turn that asked is still live, before it ends
    recorded = await eventually(both_recorded, what="both waits recorded")
    assert [w["status"] for w in recorded] == ["watching", "watching"]
    assert (await client.call("GET", f"/v1/threads/{thread['threadId']}"))["latestRun"]["status"] == "running"
    (repo / "turn-ends").write_text("")
    await wait_terminal(client, thread["threadId"], thread["runId"])
    first, second = sorted(recorded, key=lambda w: w["pr"])
    cancelled = await client.call("POST", f"/v1/waits/{first['waitId']}/cancel", body={"reason": "by hand"})
    assert cancelled["status"] == "cancelled" and cancelled["detail"] == "by hand"
    again = await client.call("POST", f"/v1/waits/{first['waitId']}/cancel", body={})
    assert again["status"] == "cancelled" and again["detail"] == "by hand"  # it ended once
    await client.call("POST", f"/v1/threads/{thread['threadId']}/interrupt", body={"stop": True})
    stopped = await client.call("GET", f"/v1/waits/{second['waitId']}")
    assert stopped["status"] == "cancelled" and "stopped or archived" in stopped["detail"]
    gh.play(merged())
    page = await client.call("GET", f"/v1/threads/{thread['threadId']}")
    assert page["latestRun"]["number"] == 1  # nobody woken


async def test_bad_input_and_unknown_ids_change_nothing(env: tuple[Daemon, LocalClient, Json]) -> None:
    _, client, _ = env
    with pytest.raises(Exception) as missing:
        await client.call("GET", "/v1/waits/wt_nope")
    assert getattr(missing.value, "code", None) == "wait_not_found"
    with pytest.raises(Exception) as owner:
        await client.call("POST", "/v1/tools/wait_for_github", body={"pr": "7", "until": "checks"})
    assert getattr(owner.value, "code", None) == "parent_not_active"
    with pytest.raises(Exception) as bad:
        await client.call("POST", "/v1/tools/wait_for_github", body={"pr": "--repo=x", "until": "checks"})
    assert getattr(bad.value, "code", None) == "invalid_request"
    assert (await client.call("GET", "/v1/waits"))["items"] == []


async def test_a_child_that_waits_on_its_pull_request_ends_its_task_only_after_the_wake(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    """A delegated child's wait is open work of its own (`tasks/store.py:has_open_children`): its
    task ends with the reply of the wake the wait started, not with the turn that asked, so the
    parent is woken once, with what CI said (the same settlement a box's feed answers a laptop)."""
    _, client, project = env
    gh.play(pending(), pending(), passing())
    child = runs_script(
        [wait_for(pr="7", until="checks"), {"reply": "waiting on CI"}], [{"reply": "CI SAID GREEN"}]
    )
    parent = await launch(
        client,
        project,
        [delegate(task=child, clientRequestId="k1"), {"reply": "delegated"}],
        [{"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
         {"reply": "PARENT GOT ${result}"}],
    )  # fmt: skip
    woken = await wait_run_number(client, parent["threadId"], 2)
    assert woken["status"] == "completed"
    [task] = (await client.call("GET", "/v1/tasks", params={"threadId": parent["threadId"]}))["items"]
    assert (task["status"], task["result"]) == ("completed", "CI SAID GREEN")
    (wait,) = await waits_of(client, task["childThreadId"])
    assert wait["outcome"] == "passed"
    replies = [i["text"] for i in await items(client, parent["threadId"]) if i["kind"] == "assistant_message"]
    assert replies[-1] == "PARENT GOT CI SAID GREEN"
    assert (await client.call("GET", f"/v1/threads/{parent['threadId']}"))["latestRun"]["number"] == 2


async def test_the_sweep_resumes_a_wait_nobody_watches(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    """Owned, owed or ending (design invariant 13): a `watching` wait no watcher drives (here: one
    recorded behind the service's back) is resumed by the sweep of open work, then delivered."""
    daemon, client, project = env
    gh.play(passing())
    thread = await launch(client, project, [{"reply": "idle"}], [{"reply": "WOKEN"}])
    await wait_terminal(client, thread["threadId"], thread["runId"])
    new = store.NewWait(
        thread_id=thread["threadId"], run_id=thread["runId"], project_id=project["id"], namespace="t",
        request_key=None, request_hash="h", pr="7", until="checks", deadline_at=daemon.clock() + 60,
    )  # fmt: skip
    row, _ = await store.record(daemon.db, new, now=daemon.clock())
    assert daemon.parts is not None and row.id not in daemon.parts.waits.watching()
    fixes = await daemon.parts.sweeper.once()
    assert [(f.action, f.id) for f in fixes] == [("resume_wait", row.id)]
    await wait_run_number(client, thread["threadId"], 2)
    assert (await client.call("GET", f"/v1/waits/{row.id}"))["outcome"] == "passed"


async def test_an_archived_thread_ends_its_waits(env: tuple[Daemon, LocalClient, Json], gh: StubGh) -> None:
    _, client, project = env
    gh.play(pending())
    thread = await launch(
        client, project, [wait_for(pr="7", until="checks"), {"reply": "ok"}], [{"reply": "W"}]
    )
    await wait_terminal(client, thread["threadId"], thread["runId"])
    await client.call("POST", f"/v1/threads/{thread['threadId']}/archive", body={})
    (wait,) = await waits_of(client, thread["threadId"])
    assert wait["status"] == "cancelled" and "it was archived" in wait["detail"]


async def test_a_review_asking_for_changes_is_in_the_consoles_needs_you_queue(
    env: tuple[Daemon, LocalClient, Json], gh: StubGh
) -> None:
    """The console's needs-you queue (peerd/console/fleet.py, read through the owner API) shows a
    thread whose wait ended with a review asking for changes, until the person sends it anything."""
    daemon, client, project = env
    gh.play(reviewed("REVIEW_REQUIRED"), reviewed("CHANGES_REQUESTED"))
    thread = await launch(
        client, project, [wait_for(pr="7", until="review"), {"reply": "ok"}], [{"reply": "SEEN"}]
    )
    await wait_run_number(client, thread["threadId"], 2)
    assert daemon.identity is not None
    owner = Owner(client, env_id=daemon.identity.env_id, label="test")
    (card,) = (await read_fleet(owner)).needs
    assert card.thread.id == thread["threadId"]
    assert [(n.kind, n.text) for n in card.needs] == [
        ("review", "a review asked for changes on https://github.com/o/r/pull/7")
    ]
    await client.call("POST", f"/v1/threads/{thread['threadId']}/runs", body={"text": "handle it"})
    await wait_run_number(client, thread["threadId"], 3)
    assert (await read_fleet(owner)).needs == []  # the person answered: it left on its own
