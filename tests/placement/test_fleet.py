"""Placement with three real daemons: a laptop linked to "box" and "studio", each with its own
load, memory, max_runs and preference (the load and memory readers are given per daemon home
through `capacity.OVERRIDES`, which each daemon reads when it starts)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, PlacementConfig, ProviderConfig
from peerd.daemon import Daemon
from peerd.errors import PeerdError
from peerd.placement import capacity
from peerd.placement.service import Placement
from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal
from tests.support.delegation import delegate, runs_script, tasks_of
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # two daemons

GIB = 2**30
NO_CODEX = {"codex": ProviderConfig(binary="/nonexistent/codex")}  # codex is installed nowhere


@dataclasses.dataclass(frozen=True)
class Box:
    label: str
    load: float
    cpus: int
    free_gib: float
    total_gib: float
    max_runs: int = 4
    preference: str = "normal"
    access: str = "auto"  # the laptop's link to it
    project: bool = True


LAPTOP = Box("laptop", load=3.6, cpus=4, free_gib=1, total_gib=16)
BOX = Box("box", load=0.4, cpus=8, free_gib=12, total_gib=32, max_runs=8, preference="prefer")
STUDIO = Box("studio", load=0.1, cpus=4, free_gib=8, total_gib=16, max_runs=2)


@dataclasses.dataclass
class Fleet:
    daemons: dict[str, Daemon]
    clients: dict[str, LocalClient]
    projects: dict[str, dict[str, Any]]

    @property
    def lc(self) -> LocalClient:
        return self.clients["laptop"]

    def env(self, label: str) -> str:
        identity = self.daemons[label].identity
        assert identity is not None
        return identity.env_id

    def placement(self, label: str) -> Placement:
        followers = self.daemons[label].followers
        assert followers is not None and followers.delegation.ops.placement is not None
        return followers.delegation.ops.placement

    async def launch(self, **body: Any) -> dict[str, Any]:
        base = {"projectId": self.projects["laptop"]["id"], "prompt": script({"reply": "hi"})}
        result: dict[str, Any] = await self.lc.call(
            "POST", "/v1/threads", body={**base, "environmentId": "auto", **body}
        )
        return result


def readers(spec: Box) -> capacity.Readers:
    return capacity.Readers(
        load=lambda: (spec.load, spec.cpus),
        memory=lambda: (int(spec.free_gib * GIB), int(spec.total_gib * GIB)),
    )


@asynccontextmanager
async def fleet(
    tmp_path: Path, *specs: Box, links: tuple[tuple[str, str], ...] | None = None
) -> AsyncIterator[Fleet]:
    """The laptop (the first spec) linked to each other one (or these `links`, from -> to), with a
    clone of one origin each."""
    homes = {spec.label: tmp_path / spec.label for spec in specs}
    for spec in specs:
        capacity.OVERRIDES[str(homes[spec.label])] = readers(spec)
    try:
        async with AsyncExitStack() as stack:
            daemons: dict[str, Daemon] = {}
            clients: dict[str, LocalClient] = {}
            projects: dict[str, dict[str, Any]] = {}
            for spec in specs:
                placement = PlacementConfig(max_runs=spec.max_runs, preference=spec.preference)
                settings = Config(placement=placement, providers=NO_CODEX)
                daemon = await stack.enter_async_context(
                    running_daemon(homes[spec.label], label=spec.label, settings=settings)
                )
                daemons[spec.label] = daemon
                clients[spec.label] = await stack.enter_async_context(client_for(daemon.paths.home))
                if spec.project:
                    repo = make_repo(tmp_path / f"{spec.label}-repo")  # one origin: one repository key
                    projects[spec.label] = await clients[spec.label].call(
                        "POST", "/v1/projects", body={"path": str(repo)}
                    )
            by_label = {spec.label: spec for spec in specs}
            for source, target in links or [(specs[0].label, spec.label) for spec in specs[1:]]:
                access = by_label[target].access
                code = await clients[target].call("POST", "/v1/pair", body={"access": access})
                await clients[source].call("POST", "/v1/links", body={"code": code["code"], "access": access})
            yield Fleet(daemons, clients, projects)
    finally:
        for home in homes.values():
            capacity.OVERRIDES.pop(str(home), None)


async def peerd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), *args]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_auto_picks_the_least_loaded_weighted_by_preference_and_says_why(tmp_path: Path) -> None:
    async with fleet(tmp_path, LAPTOP, BOX, STUDIO) as f:
        launched = await f.launch(clientRequestId="one")
        placed = launched["placement"]
        # studio is a little less loaded than box, but box prefers work: box.
        assert placed["environmentId"] == f.env("box") and placed["label"] == "box"
        assert placed["projectId"] == f.projects["box"]["id"]
        reason = placed["reason"]
        assert reason.startswith("box: 0 of 8 runs, load 0.4, 12.0 GiB free, prefers; "), reason
        assert "laptop: 0 of 4 runs, load 3.6, 1.0 GiB free, normal" in reason
        assert "studio: 0 of 2 runs, load 0.1, 8.0 GiB free, normal" in reason

        # The thread runs on box, and thread show (here, --env box) says why it is there.
        there = await f.clients["box"].call("GET", f"/v1/threads/{launched['threadId']}")
        assert there["linkLabel"] == "laptop"
        shown = await f.lc.call(
            "GET", f"/v1/threads/{launched['threadId']}", params={"environmentId": f.env("box")}
        )
        assert shown["placement"] == reason

        # A retry with the same key lands where the first try went, however the loads changed.
        box_placement = f.placement("box")
        box_placement.readers = readers(dataclasses.replace(BOX, load=80.0))
        box_placement._own = None  # its report now, not the one it kept for a second
        laptop_db = f.daemons["laptop"].db
        assert laptop_db is not None
        async with laptop_db.write() as tx:  # stale: the laptop reads every box again
            await tx.execute("DELETE FROM link_capacity")
        assert (await f.launch())["placement"]["label"] == "studio"  # a new launch goes elsewhere now
        again = await f.launch(clientRequestId="one")
        assert (again["threadId"], again["placement"]["environmentId"]) == (
            launched["threadId"],
            f.env("box"),
        )
        assert again["replayed"] is True

        # The CLI: --env auto, waits where the thread went, and shows the placement.
        home = f.daemons["laptop"].paths.home
        out = ok(
            await peerd(
                home, "thread", "launch", "--env", "auto", "--project", f.projects["laptop"]["id"],
                "--prompt", script({"reply": "hi"}), "--wait", "30",
            )
        )  # fmt: skip
        assert "placed on studio: " in out and "run_" in out and "completed" in out, out
        shown_cli = ok(await peerd(home, "thread", "show", launched["threadId"], "--env", "box"))
        assert any(
            line.split()[:1] == ["placement"] and line.endswith(reason) for line in shown_cli.splitlines()
        )


async def test_a_full_box_is_passed_by(tmp_path: Path) -> None:
    full = dataclasses.replace(BOX, max_runs=1)
    async with fleet(tmp_path, LAPTOP, full, STUDIO) as f:
        bc = f.clients["box"]
        busy = await bc.call(
            "POST",
            "/v1/threads",
            body={"projectId": f.projects["box"]["id"], "prompt": script({"wait_for_file": "go"})},
        )
        await eventually(
            lambda: bc.call("GET", f"/v1/threads/{busy['threadId']}"),
            what="the box's one run running",
            until=lambda thread: thread["latestRun"]["status"] == "running",
        )
        placed = (await f.launch())["placement"]
        assert placed["label"] == "studio", placed
        assert "box: full: 1 of 1 runs, load 0.4" in placed["reason"]
        Path(busy["worktreePath"], "go").write_text("")
        await wait_terminal(bc, busy["threadId"], busy["runId"])


async def test_a_box_without_the_project_or_the_provider_is_passed_by_with_its_reason(tmp_path: Path) -> None:
    bare = dataclasses.replace(STUDIO, project=False, preference="prefer")
    async with fleet(tmp_path, LAPTOP, BOX, bare) as f:
        placed = (await f.launch())["placement"]
        assert placed["label"] == "box"
        assert "studio: no project with this repository" in placed["reason"]

        with pytest.raises(PeerdError) as err:
            await f.launch(provider="codex")
        assert err.value.code == "no_placement"
        message = err.value.message
        for label in ("laptop", "box", "studio"):
            assert f"{label}: no provider codex" in message, message


async def test_auto_under_a_read_only_link_is_refused(tmp_path: Path) -> None:
    manual = dataclasses.replace(LAPTOP, preference="manual-only")
    read_only = dataclasses.replace(BOX, access="read-only")
    async with fleet(tmp_path, manual, read_only) as f:
        with pytest.raises(PeerdError) as err:
            await f.launch()
        assert err.value.code == "no_placement"
        assert "laptop: manual only" in err.value.message
        assert "box: the link is read-only, so it cannot start work there" in err.value.message
        threads = await f.clients["box"].call("GET", "/v1/threads")
        assert threads["items"] == []  # nothing was started anywhere


async def test_a_delegated_auto_task_records_its_placement_and_the_feed_brings_capacity(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path, LAPTOP, BOX, STUDIO) as f:
        child = script({"reply": "BOX DONE"})
        parent_prompt = runs_script(
            [delegate(task=child, target={"environmentId": "auto"}, clientRequestId="t1")],
            [{"reply": "woken"}],
        )
        launched = await f.lc.call(
            "POST", "/v1/threads", body={"projectId": f.projects["laptop"]["id"], "prompt": parent_prompt}
        )
        [task] = await eventually(
            lambda: tasks_of(f.lc, launched["threadId"]), what="the parent's delegated task", within=20
        )
        assert task["remoteChild"]["label"] == "box"
        laptop_db = f.daemons["laptop"].db
        assert laptop_db is not None
        async with laptop_db.write() as tx:  # forget what the check read: the feed must bring it
            await tx.execute("DELETE FROM link_capacity")
        # ... and what each side remembers sending and keeping (a report goes and is written at
        # most every 10 s per link: the next answer would otherwise carry none).
        laptop_followers, box_followers = f.daemons["laptop"].followers, f.daemons["box"].followers
        assert laptop_followers is not None and box_followers is not None
        placement = laptop_followers.delegation.ops.placement
        assert placement is not None
        placement._fed.clear()
        for link in box_followers.delegation.ender.watcher.hub._links.values():
            link.capacity_sent = None
        shown = await eventually(
            lambda: f.lc.call("GET", f"/v1/tasks/{task['taskId']}"),
            what="the task completed",
            until=lambda t: t["status"] == "completed",
            within=20,
        )
        assert shown["placement"].startswith("box: 0 of 8 runs"), shown["placement"]
        out = ok(await peerd(f.daemons["laptop"].paths.home, "task", "show", task["taskId"]))
        assert "placement" in out and "box: 0 of 8 runs" in out
        row = await eventually(
            lambda: laptop_db.fetchone(
                "SELECT body FROM link_capacity WHERE environment_id = ?", (f.env("box"),)
            ),
            what="the box's capacity stored on the laptop",
            until=lambda row: row is not None and row["body"] is not None,
        )
        assert row is not None and json.loads(row["body"])["maxRuns"] == 8  # from the feed's answer


async def test_fleet_lists_every_environment(tmp_path: Path) -> None:
    async with fleet(tmp_path, LAPTOP, BOX, STUDIO) as f:
        answer = await f.lc.call("GET", "/v1/fleet")
        envs = answer["environments"]
        assert [e["label"] for e in envs] == ["laptop", "box", "studio"]
        assert envs[0]["here"] and envs[0]["status"] == "here"
        assert [e["capacity"]["maxRuns"] for e in envs] == [4, 8, 2]
        assert envs[1]["capacity"]["preference"] == "prefer" and envs[1]["status"] == "reachable"
        assert envs[1]["capacity"]["projects"][0]["repositoryKey"] == f.projects["box"]["repositoryKey"]
        assert (
            "script" in envs[2]["capacity"]["providers"] and "codex" not in envs[2]["capacity"]["providers"]
        )
        assert all(e["ageS"] is not None and e["ageS"] < 60 for e in envs)

        home = f.daemons["laptop"].paths.home
        table = ok(await peerd(home, "fleet")).splitlines()
        assert table[0].split()[:3] == ["ENVIRONMENT", "STATUS", "RUNS"], table[0]
        rows = {line.split()[0]: line for line in table[1:]}
        assert set(rows) == {"laptop", "box", "studio"}
        assert "0/8" in rows["box"] and "prefers" in rows["box"] and "0.4 (8 CPU)" in rows["box"]
        assert "here" in rows["laptop"] and "3.6 (4 CPU)" in rows["laptop"]
        assert " live" in rows["laptop"] and re.search(r"just now|\d+ s ago", rows["box"]), rows
        listed = json.loads(ok(await peerd(home, "fleet", "--json", "label,status")))
        assert listed == [
            {"label": "laptop", "status": "here"},
            {"label": "box", "status": "reachable"},
            {"label": "studio", "status": "reachable"},
        ]


async def test_an_unreachable_box_is_passed_by_with_its_reason(tmp_path: Path) -> None:
    preferred = dataclasses.replace(STUDIO, preference="prefer")
    async with fleet(tmp_path, LAPTOP, BOX, preferred) as f:
        laptop_db = f.daemons["laptop"].db
        assert laptop_db is not None
        await f.lc.call("GET", "/v1/environments")  # the live link check brings each box's report
        rows = await laptop_db.fetchall("SELECT environment_id FROM link_capacity WHERE body IS NOT NULL")
        assert {r["environment_id"] for r in rows} == {f.env("box"), f.env("studio")}
        assert (await f.launch())["placement"]["label"] == "studio"

        await f.daemons["studio"].shutdown()
        async with laptop_db.write() as tx:  # older than the bound: read again before choosing
            await tx.execute("UPDATE link_capacity SET seen_at = seen_at - 3600")
        placed = (await f.launch())["placement"]
        assert placed["label"] == "box"
        assert "studio: not reachable: " in placed["reason"], placed["reason"]
        envs = {e["label"]: e for e in (await f.lc.call("GET", "/v1/fleet"))["environments"]}
        assert envs["studio"]["status"] == "unreachable" and envs["studio"]["error"].startswith(
            "not reachable"
        )
        assert envs["studio"]["capacity"]["maxRuns"] == 2 and envs["studio"]["ageS"] > 3000  # the last report


async def test_auto_in_a_links_work_never_uses_the_boxs_own_links(tmp_path: Path) -> None:
    """A run the laptop started on box delegates with `auto`: box may not lend its link to studio,
    however much studio would suit; the task stays on box and says why."""
    idle = dataclasses.replace(STUDIO, preference="prefer", load=0.0)
    async with fleet(tmp_path, LAPTOP, BOX, idle, links=(("laptop", "box"), ("box", "studio"))) as f:
        parent_prompt = runs_script(
            [
                delegate(
                    task=script({"reply": "child"}), target={"environmentId": "auto"}, clientRequestId="t"
                )
            ],
            [{"reply": "woken"}],
        )
        launched = await f.lc.call(
            "POST",
            "/v1/threads",
            body={"projectId": f.projects["box"]["id"], "prompt": parent_prompt, "environmentId": "box"},
        )
        bc = f.clients["box"]
        [task] = await eventually(
            lambda: tasks_of(bc, launched["threadId"]), what="the box thread's delegated task", within=20
        )
        shown = await eventually(  # the task is recorded before its child is launched: wait for the child
            lambda: bc.call("GET", f"/v1/tasks/{task['taskId']}"),
            what="the task's child launched",
            until=lambda t: t["childThreadId"] is not None or t["remoteChild"] is not None,
            within=20,
        )
        assert shown["remoteChild"] is None and shown["childThreadId"] is not None  # here, on box
        assert shown["placement"].startswith("box: "), shown["placement"]
        assert (
            "studio: work that came in through a link cannot use this environment's links"
            in shown["placement"]
        )


async def test_launches_at_once_split_over_equal_boxes(tmp_path: Path) -> None:
    """Issue 33's herd, through real daemons: launches placed at once all read the same reports
    (none arrives during the burst), yet each counts the runs the ones before it reserved, so
    two equal boxes take half each."""
    manual = dataclasses.replace(LAPTOP, preference="manual-only")
    east = Box("east", load=0.2, cpus=4, free_gib=8, total_gib=16, max_runs=8)
    west = dataclasses.replace(east, label="west")
    async with fleet(tmp_path, manual, east, west) as f:
        await f.lc.call("GET", "/v1/environments")  # the live link check brings each box's report
        launched = await asyncio.gather(*(f.launch(clientRequestId=f"burst-{i}") for i in range(12)))
        split = Counter(answer["placement"]["label"] for answer in launched)
        assert split == {"east": 6, "west": 6}, split
        assert any("just placed" in answer["placement"]["reason"] for answer in launched)
        for answer in launched:
            label = answer["placement"]["label"]
            await wait_terminal(f.clients[label], answer["threadId"], answer["runId"])
