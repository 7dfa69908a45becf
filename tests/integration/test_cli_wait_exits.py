"""A wait's exit code says how the run ended (issue 30): `thread launch --wait` and `thread wait` exit
0 only for `completed`; 5 failed, 6 interrupted, 7 still live because a question waits for a person
(with a line naming it and the command that shows it, here or on the box), 4 still live.
Real CLI subprocesses, real daemons."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.cli.common import (
    EXIT_AWAITING_APPROVAL,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_RUN_STOPPED,
    EXIT_TIMED_OUT,
    EXIT_USAGE,
)
from tests.helpers import script, two_daemons, wait_terminal
from tests.support.approvals import launch, launch_on_box, new_approval, set_up
from tests.support.cli import peerd
from tests.support.delegation import delegate, runs_script, tasks_of
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # CLI subprocesses against real daemons

Json = dict[str, Any]


async def home_of(client: LocalClient) -> Path:
    return Path((await client.call("GET", "/v1/status"))["home"])


async def test_launch_wait_exits_0_for_completed_and_5_for_failed(client: LocalClient, project: Json) -> None:
    home = await home_of(client)
    done = await peerd(home, "thread", "launch", "--project", "repo", "--prompt", "hi", "--wait", "30")
    assert done.returncode == EXIT_OK, done.stderr
    over = script({"reply": "spent", "usage": {"input_tokens": 500, "output_tokens": 1}}, {"wait": 20})
    failed = await peerd(
        home,
        "thread",
        "launch",
        "--project",
        "repo",
        "--prompt",
        over,
        "--budget",
        "tokens=100",
        "--wait",
        "30",
    )
    assert failed.returncode == EXIT_RUN_FAILED, (failed.stdout, failed.stderr)
    assert "failed: budget exceeded" in failed.stdout
    typo = await peerd(
        home, "thread", "launch", "--project", "repo", "--prompt", "hi", "--budget", "tokens=abc"
    )
    assert typo.returncode == EXIT_USAGE and "'--budget'" in typo.stderr, typo.stderr  # names the option


async def test_wait_exits_6_for_an_interrupted_run_and_4_while_it_is_live(
    client: LocalClient, project: Json
) -> None:
    home = await home_of(client)
    body = {"projectId": project["id"], "prompt": script({"wait": 30})}
    launched = await client.call("POST", "/v1/threads", body=body)
    live = await peerd(home, "thread", "wait", launched["threadId"], "--timeout", "0.5")
    assert live.returncode == EXIT_TIMED_OUT, (live.stdout, live.stderr)
    assert "waiting for your approval" not in live.stdout
    await client.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
    stopped = await peerd(home, "thread", "wait", launched["threadId"], "--timeout", "30")
    assert stopped.returncode == EXIT_RUN_STOPPED, (stopped.stdout, stopped.stderr)
    assert "interrupted" in stopped.stdout


async def test_a_run_waiting_for_a_person_exits_7_and_names_the_question(
    client: LocalClient, project: Json
) -> None:
    home = await home_of(client)
    launched = await launch(client, project, script({"run": "echo a > a.txt"}, {"reply": "done"}))
    asked = await new_approval(client, set())
    waited = await peerd(home, "thread", "wait", launched["threadId"], "--timeout", "0.5")
    assert waited.returncode == EXIT_AWAITING_APPROVAL, (waited.stdout, waited.stderr)
    line = waited.stdout.splitlines()[-1]
    assert line == f"waiting for your approval: {asked['summary']} (peerd approval show {asked['id']})"
    shown = await peerd(home, "thread", "show", launched["threadId"])
    assert re.search(
        rf"^waiting for +your approval: {re.escape(asked['summary'])} \(peerd approval show {asked['id']}\)$",
        shown.stdout,
        re.MULTILINE,
    ), shown.stdout
    assert not re.search(r"^(reason|placement) *$", shown.stdout, re.MULTILINE)  # empty fields are left out
    listed = await peerd(home, "thread", "list")
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(launched["threadId"])]
    assert row.rstrip().endswith(f"active, waiting for your approval ({asked['id']})"), row
    as_json = await peerd(home, "thread", "wait", launched["threadId"], "--timeout", "0.5", "--json")
    assert as_json.returncode == EXIT_AWAITING_APPROVAL
    assert f'"approvalId": "{asked["id"]}"' in as_json.stdout


async def test_a_box_threads_question_is_named_with_the_box(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)  # linked at approval-required
        launched = await launch_on_box(pair, project, script({"run": "echo a > a.txt"}, {"reply": "done"}))
        asked = await new_approval(pair.bc, set())
        waited = await peerd(
            pair.laptop.paths.home,
            "thread",
            "wait",
            launched["threadId"],
            "--env",
            pair.box_id,
            "--timeout",
            "0.5",
        )
        assert waited.returncode == EXIT_AWAITING_APPROVAL, (waited.stdout, waited.stderr)
        assert waited.stdout.splitlines()[-1] == (
            f"waiting for your approval on {pair.box_id}: {asked['summary']} (peerd approval show {asked['id']})"
        )

        async def shown_here() -> str | None:  # the hint's command works on the laptop
            shown = await peerd(pair.laptop.paths.home, "approval", "show", asked["id"])
            return shown.stdout if shown.returncode == EXIT_OK else None

        assert asked["id"] in await eventually(shown_here, what="the box's approval shown on the laptop")
        on_box = await peerd(pair.box.paths.home, "approval", "list")  # the box names whose work asks
        [row] = [line for line in on_box.stdout.splitlines() if asked["id"] in line]
        assert f"here for {asked['linkLabel']}" in row and asked["linkLabel"], row


async def test_task_show_wait_exits_by_how_the_task_ended(client: LocalClient, project: Json) -> None:
    """`task show --wait` waits for the task like `thread wait` for a run: 4 while it runs, then 0
    for completed and 5 for failed."""
    home = await home_of(client)
    slow_child = script({"wait": 2}, {"reply": "CHILD DONE"})
    failing_child = script({"fail": "the child gave up"})
    prompt = runs_script([delegate(task=slow_child, title="slow"), delegate(task=failing_child, title="bad")])
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    tasks = {t["title"]: t for t in await tasks_of(client, launched["threadId"])}
    still = await peerd(home, "task", "show", tasks["slow"]["taskId"], "--wait", "0.2")
    assert still.returncode == EXIT_TIMED_OUT, (still.stdout, still.stderr)
    done = await peerd(home, "task", "show", tasks["slow"]["taskId"], "--wait", "30")
    assert done.returncode == EXIT_OK, (done.stdout, done.stderr)
    assert "CHILD DONE" in done.stdout
    failed = await peerd(home, "task", "show", tasks["bad"]["taskId"], "--wait", "30")
    assert failed.returncode == EXIT_RUN_FAILED, (failed.stdout, failed.stderr)
    shown = await peerd(home, "task", "show", tasks["bad"]["taskId"])  # showing is not waiting: 0
    assert shown.returncode == EXIT_OK
