"""Ids resolve across the fleet (issue 30): the laptop knows where each thread it started elsewhere
lives, and `peerd thread show|wait|send|interrupt|events|archive ID` follow it there through the link;
a whole id it never saw is asked of the links; `thread list --env all` lists the fleet with an ON
column. Real CLI subprocesses against two real daemons."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.common import EXIT_ERROR, EXIT_OK
from peerd.store import thread_homes
from tests.helpers import make_repo, script, two_daemons, wait_terminal
from tests.support.approvals import launch_on_box, set_up
from tests.support.cli import peerd
from tests.support.delegation import delegate, runs_script, tasks_of

pytestmark = pytest.mark.slow  # CLI subprocesses against two real daemons

Json = dict[str, Any]


async def test_a_thread_launched_on_the_box_is_followed_there_by_its_id_or_a_start_of_it(
    tmp_path: Path,
) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair, access="auto")
        launched = await launch_on_box(pair, project, script({"reply": "first"}))
        tid = launched["threadId"]
        laptop = pair.laptop.paths.home

        shown = await peerd(laptop, "thread", "show", tid[:9])  # thr_ and 5 hex digits
        assert shown.returncode == EXIT_OK, shown.stderr
        assert re.search(rf"^thread +{tid}$", shown.stdout, re.MULTILINE), shown.stdout
        assert re.search(r"^on +box$", shown.stdout, re.MULTILINE), shown.stdout

        waited = await peerd(laptop, "thread", "wait", tid, "--timeout", "30")
        assert waited.returncode == EXIT_OK, (waited.stdout, waited.stderr)
        assert f"thread {tid} is on box" in waited.stderr  # said where, on stderr: stdout stays the answer

        sent = await peerd(laptop, "thread", "send", tid[:10], script({"reply": "second"}))
        assert sent.returncode == EXIT_OK, sent.stderr
        again = await peerd(laptop, "thread", "wait", tid, "--timeout", "30", "--json")
        assert again.returncode == EXIT_OK and '"status": "completed"' in again.stdout
        events = await peerd(laptop, "thread", "events", tid)
        assert events.returncode == EXIT_OK and "thread.created" in events.stdout, events.stdout
        stopped = await peerd(laptop, "thread", "interrupt", tid)
        assert stopped.returncode == EXIT_OK and "no active run" in stopped.stdout, stopped.stdout
        archived = await peerd(laptop, "thread", "archive", tid[:9], "--yes")
        assert archived.returncode == EXIT_OK, archived.stderr
        assert archived.stdout.startswith(f"archived {tid}") and f"thread {tid} is on box" in archived.stderr
        there = await pair.bc.call("GET", f"/v1/threads/{tid}")
        assert there["status"] == "archived"  # archived on the box, where it lives

        # The box itself never follows ids to the laptop: its own lookup says not found.
        on_box = await peerd(pair.box.paths.home, "thread", "show", "thr_" + "0" * 20)
        assert on_box.returncode == EXIT_ERROR


async def test_a_whole_id_the_laptop_never_saw_is_asked_of_the_links_and_remembered(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        await set_up(tmp_path, pair, access="auto")
        # The box's owner starts a thread there: the laptop has no record of it.
        box_project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]
        theirs = await pair.bc.call(
            "POST", "/v1/threads", body={"projectId": box_project["id"], "prompt": script({"reply": "x"})}
        )
        tid = theirs["threadId"]
        laptop = pair.laptop.paths.home
        prefix = await peerd(laptop, "thread", "show", tid[:12])
        assert prefix.returncode == EXIT_ERROR
        assert "give the whole id" in prefix.stderr, prefix.stderr
        whole = await peerd(laptop, "thread", "show", tid)
        assert whole.returncode == EXIT_OK, whole.stderr
        assert re.search(r"^on +box$", whole.stdout, re.MULTILINE)
        assert pair.laptop.db is not None
        [home] = await thread_homes.elsewhere(pair.laptop.db, tid, limit=5)
        assert (home.environment_id, home.via) == (pair.box_id, "found")
        now_prefix = await peerd(laptop, "thread", "show", tid[:12])  # remembered: a start works now
        assert now_prefix.returncode == EXIT_OK, now_prefix.stderr
        missing = await peerd(laptop, "thread", "show", "thr_" + "f" * 20)
        assert missing.returncode == EXIT_ERROR
        assert "nor on the linked machines (asked: box)" in missing.stderr, missing.stderr


async def test_thread_list_env_all_lists_the_fleet_newest_first_with_where_each_lives(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair, access="auto")
        await pair.lc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "laptop-repo"))})
        on_box = await launch_on_box(pair, project, script({"reply": "b"}))
        here = await pair.lc.call(
            "POST", "/v1/threads", body={"projectId": "laptop-repo", "prompt": script({"reply": "l"})}
        )
        listed = await peerd(pair.laptop.paths.home, "thread", "list", "--env", "all")
        assert listed.returncode == EXIT_OK, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split()[:2] == ["ID", "ON"], lines[0]
        rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
        assert rows == {here["threadId"]: "here", on_box["threadId"]: "box"}
        assert lines[1].startswith(here["threadId"]), "newest first across machines"
        ids = await peerd(pair.laptop.paths.home, "thread", "list", "--env", "all", "-q", "--limit", "1")
        assert ids.stdout.split() == [here["threadId"]]


async def test_a_start_of_an_id_shared_here_and_elsewhere_is_refused_naming_both(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        await pair.link("auto")
        repo = make_repo(tmp_path / "laptop-repo")
        await pair.lc.call("POST", "/v1/projects", body={"path": str(repo)})
        here = await pair.lc.call(
            "POST", "/v1/threads", body={"projectId": "laptop-repo", "prompt": script({"reply": "l"})}
        )
        tid = here["threadId"]
        twin = tid[:8] + ("0" if tid[8] != "0" else "1") + tid[9:]
        assert pair.laptop.db is not None
        await thread_homes.record(pair.laptop.db, twin, pair.box_id, "launched", 0.0)
        shared = await peerd(pair.laptop.paths.home, "thread", "show", tid[:8])
        assert shared.returncode == EXIT_ERROR, (shared.stdout, shared.stderr)
        assert (
            "ambiguous_id" in shared.stderr and tid in shared.stderr and f"{twin} (on box)" in shared.stderr
        )
        exact = await peerd(pair.laptop.paths.home, "thread", "show", tid[:9])
        assert exact.returncode == EXIT_OK, exact.stderr


async def test_task_list_env_all_lists_the_boxs_tasks_beside_these_and_approval_list_takes_env(
    tmp_path: Path,
) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair, access="auto")
        await pair.lc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "laptop-repo"))})
        # On the box, a thread the laptop started delegates there: the task is the box's.
        box_parent = await launch_on_box(
            pair, project, runs_script([delegate(task=script({"reply": "child"}), title="on the box")])
        )
        await wait_terminal(pair.bc, box_parent["threadId"], box_parent["runId"])
        here_parent = await pair.lc.call(
            "POST",
            "/v1/threads",
            body={"projectId": "laptop-repo", "prompt": runs_script([delegate(task=script({"reply": "c"}))])},
        )
        await wait_terminal(pair.lc, here_parent["threadId"], here_parent["runId"])
        [box_task] = await tasks_of(pair.bc, box_parent["threadId"])
        [here_task] = await tasks_of(pair.lc, here_parent["threadId"])

        laptop = pair.laptop.paths.home
        listed = await peerd(laptop, "task", "list", "--env", "all")
        assert listed.returncode == EXIT_OK, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split()[:3] == ["ID", "ON", "STATUS"], lines[0]
        rows = {line.split()[0]: line.split()[1] for line in lines[1:]}
        assert rows == {here_task["taskId"]: "here", box_task["taskId"]: "box"}, (
            listed.stdout,
            listed.stderr,
        )
        assert lines[1].startswith(here_task["taskId"]), "newest first across machines"
        only_here = await peerd(laptop, "task", "list", "-q")
        assert only_here.stdout.split() == [here_task["taskId"]]  # without --env: this machine's own

        assert (await peerd(laptop, "approval", "list", "--env", "all")).returncode == EXIT_OK
        for machine in ("here", "box", pair.box_id):
            assert (await peerd(laptop, "approval", "list", "--env", machine)).returncode == EXIT_OK
        unknown = await peerd(laptop, "approval", "list", "--env", "nowhere")
        assert (
            unknown.returncode == 2 and "no linked machine is named 'nowhere' (linked: box)" in unknown.stderr
        )
