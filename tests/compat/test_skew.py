"""This release against the previous one (tests/compat/PREVIOUS_RELEASE), both as real daemons on
loopback with the scripted provider: both skews, upgrades in place in both orders, a task open
across an upgrade, and a downgrade refused.

- The box upgraded first: an old laptop delegates to a new box and gets its result (the new box
  sends an item's default-valued fields to a peer that does not say it can do without them); a
  task the old laptop delegated, still open when the laptop is upgraded in place, ends with its
  result and wakes its parent, resuming the session the old release made. The previous release
  then refuses the upgraded home, and this one a home newer than itself, in one sentence.
- The laptop upgraded first: a new laptop delegates to an old box (no change feed there): the
  link, the task and doctor show a typed `version_skew` naming the box to update, and the task is
  followed through the old box's `POST /v1/watch` (counted: a request per chunk, not hundreds a
  second) and ends with its result. Once the box is upgraded in place the link is reachable, and
  the box's thread the old release made resumes its session (a link's run is confined, and reads
  its sessions from providers/script/threads/<thread>/: the old file is moved there).

Waiting is on long-polls and events; `eventually` polls only what no event reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd import contracts as c
from peerd.doctor.network import check_link
from peerd.paths import Paths
from tests.compat.release import OldDaemon, Release, new_peerd
from tests.helpers import client_for, free_port, git, items, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.delegation import READ_AND_REPORT, delegate, runs_script, tasks_of
from tests.support.delegation import wait_task as wait_task_unbounded
from tests.support.eventually import eventually

CHUNK_S = 2.0
WAIT_S = 30.0


def repos(tmp: Path) -> None:
    make_repo(tmp / "seed", origin=None)
    git(tmp, "clone", "-q", "--bare", str(tmp / "seed"), str(tmp / "origin.git"))
    for side in ("laptop", "box"):
        git(tmp, "clone", "-q", str(tmp / "origin.git"), str(tmp / f"{side}-repo"))


async def link(lc: Any, bc: Any) -> str:
    code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
    linked = await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    return str(linked.get("environmentId") or linked["envId"])  # an older laptop says only `envId`


async def delegating_parent(lc: Any, project: str, box_id: str, there: str, child: str, key: str) -> str:
    """A parent whose first run delegates `child` to the box and whose wake reports the result."""
    step = delegate(task=child, target={"environmentId": box_id, "projectId": there}, clientRequestId=key)
    launched = await lc.call(
        "POST", "/v1/threads", body={"projectId": project, "prompt": runs_script([step], READ_AND_REPORT)}
    )
    assert (await wait_terminal(lc, launched["threadId"], launched["runId"]))["status"] == "completed"
    return str(launched["threadId"])


async def reported(lc: Any, parent: str) -> dict[str, Any]:
    """The parent's task once it ended, and the parent's wake once it ended."""
    [task] = await tasks_of(lc, parent)
    for status in ("pending", "running"):
        task = await asyncio.wait_for(
            wait_task_unbounded(lc, parent, task["taskId"], while_status=status), WAIT_S
        )
    thread = await lc.call("GET", f"/v1/threads/{parent}")
    await wait_terminal(lc, parent, thread["latestRun"]["id"])
    return dict(task)


async def last_reply(client: Any, thread: str) -> str:
    return [i["text"] for i in await items(client, thread) if i["kind"] == "assistant_message"][-1]


def schema_version(home: Path) -> int:
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


@contextlib.asynccontextmanager
async def old(release: Release, home: Path, label: str, listen: str = "127.0.0.1:0") -> AsyncIterator[Any]:
    daemon = OldDaemon(release, home, label=label, listen=listen)
    try:
        await daemon.start()
        async with client_for(home) as client:
            yield client
    finally:
        daemon.stop()


@contextlib.asynccontextmanager
async def new(home: Path, label: str, **kw: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with running_daemon(home, label=label, **kw) as daemon, client_for(home) as client:
        yield daemon, client


@pytest.mark.slow
async def test_the_box_first_then_the_laptop_with_a_task_open_across_it(
    previous_release: Release, tmp_path: Path
) -> None:
    repos(tmp_path)
    laptop_home, box_listen = tmp_path / "laptop", f"127.0.0.1:{free_port()}"
    with signal_dir() as signals:
        hold = signals / "hold"
        async with new(tmp_path / "box", "box", listen=box_listen) as (_box, bc):
            there = (await bc.call("POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")}))["id"]
            async with old(previous_release, laptop_home, "laptop") as lc:
                here = (await lc.call("POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")}))[
                    "id"
                ]
                box_id = await link(lc, bc)
                # Old laptop, new box: the delegated task ends with its result, the parent is woken.
                quick = await delegating_parent(lc, here, box_id, there, script({"reply": "CHILD DONE"}), "q")
                task = await reported(lc, quick)
                assert (task["status"], task["result"]) == ("completed", "CHILD DONE"), task
                assert await last_reply(lc, quick) == "PARENT GOT CHILD DONE"
                # A task still open when the laptop is upgraded.
                held = script({"wait_for_file": str(hold)}, {"reply": "HELD DONE"})
                parent = await delegating_parent(lc, here, box_id, there, held, "h")
                [open_task] = await tasks_of(lc, parent)
                assert open_task["status"] == "running", open_task
            hold.write_text("go")  # the child ends on the box while the laptop is being upgraded
            child = open_task["remoteChild"]
            assert (await wait_terminal(bc, child["threadId"], child["runId"]))["status"] == "completed"
            async with new(laptop_home, "laptop", watch_chunk_s=CHUNK_S) as (_laptop, lc):
                task = await reported(lc, parent)
                assert (task["status"], task["result"]) == ("completed", "HELD DONE"), task
                # The wake resumed the session the old release made: its steps ran, not "No session".
                assert await last_reply(lc, parent) == "PARENT GOT HELD DONE"
                thread = await lc.call("GET", f"/v1/threads/{parent}")
                assert (thread["latestRun"]["number"], thread["latestRun"]["status"]) == (2, "completed")
    upgraded = schema_version(laptop_home)
    assert (laptop_home / "home-format").read_text().strip() == "2"

    # The downgrade: the previous release refuses the upgraded home (its own way) and changes nothing.
    with open(laptop_home / "old.log", "wb") as out:
        proc = await asyncio.to_thread(
            subprocess.run,
            previous_release.command("--home", str(laptop_home), "serve", "--listen", "127.0.0.1:0"),
            stdout=out,
            stderr=out,
            env=previous_release.env(),
            cwd=laptop_home,
            timeout=60,
        )
    assert proc.returncode != 0
    assert "newer" in (laptop_home / "old.log").read_text()
    assert schema_version(laptop_home) == upgraded

    # This release refuses a home a newer one used, in one sentence, exit 2, before opening anything.
    (laptop_home / "home-format").write_text("3\n")
    done = await asyncio.to_thread(new_peerd, "serve", "--listen", "127.0.0.1:0", home=laptop_home)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "was last used by a newer peerd (home format 3" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
async def test_the_laptop_first_then_the_box(previous_release: Release, tmp_path: Path) -> None:
    repos(tmp_path)
    box_home, box_listen = tmp_path / "box", f"127.0.0.1:{free_port()}"
    with signal_dir() as signals:
        hold = signals / "hold"
        async with new(tmp_path / "laptop", "laptop", watch_chunk_s=CHUNK_S) as (laptop, lc):
            here = (await lc.call("POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")}))["id"]
            async with old(previous_release, box_home, "box", listen=box_listen) as bc:
                there = (await bc.call("POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")}))[
                    "id"
                ]
                box_id = await link(lc, bc)
                child = runs_script(
                    [{"wait_for_file": str(hold)}, {"reply": "CHILD DONE"}], [{"reply": "CHILD AGAIN"}]
                )
                parent = await delegating_parent(lc, here, box_id, there, child, "s")
                [task] = await tasks_of(lc, parent)
                assert task["status"] == "running", task
                assert laptop.followers is not None
                follower = laptop.followers._followers[box_id]

                async def watching() -> bool:
                    return laptop.followers is not None and laptop.followers.feed.watching(box_id)

                await eventually(watching, what="the follower watching the old box", within=20)
                # Followed through the old box's watch: a long-poll at a time, never a busy loop
                # (each waits the chunk less its margin, 1 s here; the busy loop sent hundreds).
                sent = follower.syncs + follower.requests
                await asyncio.sleep(3.0)  # the quantity measured is requests per unit of idle time
                assert follower.syncs + follower.requests - sent <= 6, (
                    "the follower is not waiting on the box"
                )

                # The typed skew, where people look: the link, the task, doctor.
                env = await lc.call("GET", f"/v1/environments/{box_id}", params={"probe": "false"})
                assert env["status"] == "version_skew", env
                assert "update peerd on box" in env["lastError"]
                doctor = check_link(c.LinkInfo.model_validate(env), time.time())
                assert doctor.status == "warn" and "Update peerd on box" in (doctor.fix or ""), doctor
                shown = await asyncio.to_thread(
                    new_peerd, "task", "show", task["taskId"], home=tmp_path / "laptop"
                )
                assert "version_skew: box runs an older peerd" in shown.stdout, shown

                # Delegation works meanwhile: the task ends with its result, the parent is woken.
                hold.write_text("go")
                task = await reported(lc, parent)
                assert (task["status"], task["result"]) == ("completed", "CHILD DONE"), task
                assert await last_reply(lc, parent) == "PARENT GOT CHILD DONE"

            # The box upgraded in place: the link is reachable again, and the thread the old
            # release made there resumes its session on its next (confined) run.
            async with new(box_home, "box", listen=box_listen) as (_box, bc):
                env = await lc.call("GET", f"/v1/environments/{box_id}")  # asks the box now
                assert env["status"] == "reachable", env
                assert not laptop.followers.feed.watching(box_id)
                # The follower that followed the old box's watch now follows the feed.
                after = await delegating_parent(lc, here, box_id, there, script({"reply": "FED"}), "f")
                fed = await reported(lc, after)
                assert (fed["status"], fed["result"]) == ("completed", "FED"), fed
                assert not laptop.followers.feed.watching(box_id)
                thread_there = task["remoteChild"]["threadId"]
                sent_run = await bc.call("POST", f"/v1/threads/{thread_there}/runs", body={"text": "again"})
                again = await wait_terminal(bc, thread_there, sent_run["runId"])
                assert again["status"] == "completed", await items(bc, thread_there)
                assert await last_reply(bc, thread_there) == "CHILD AGAIN"


@pytest.mark.parametrize("format_text", ["3\n", "future\n"])
def test_a_home_newer_than_this_release_is_refused_in_one_sentence(tmp_path: Path, format_text: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "home-format").write_text(format_text)
    done = new_peerd("serve", "--listen", "127.0.0.1:0", home=home)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert "was last used by a newer peerd" in line and "upgrade peerd" in line
    assert not Paths(home).db.exists(), "nothing is made in a home this release refuses"
