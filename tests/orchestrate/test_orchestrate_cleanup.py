"""A run removes what it made, whether it completed, failed or was cancelled: every thread's
worktree, the planner's and reviewers' `peerd/<thread>` branches, and the empty
`worktrees/orchestrate/<run>/` directory; `--keep` keeps them. The packets' branches stay."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    runs,
    settings,
    start,
    steps,
)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Daemon, LocalClient, dict[str, Any], Path]]:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        yield daemon, client, project, repo


def planned(*packets: dict[str, Any]) -> str:
    """A task whose scripted planner answers with these packets."""
    reply = "```json\n" + json.dumps({"packets": list(packets)}) + "\n```"
    return "Fix the calculator.\n\n" + runs([{"reply": reply}], [{"reply": reply}])


def worktrees(repo: Path) -> list[str]:
    listed = git(repo, "worktree", "list", "--porcelain").splitlines()
    return [line.removeprefix("worktree ") for line in listed if line.startswith("worktree ")][1:]


def branches(repo: Path, prefix: str) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", f"refs/heads/{prefix}").split()


async def run_threads(client: LocalClient, run_id: str) -> list[dict[str, Any]]:
    items = (await client.call("GET", "/v1/threads", params={"includeArchived": True, "limit": 100}))["items"]
    return [t for t in items if t["title"].startswith(run_id)]


async def test_a_completed_run_leaves_no_worktrees_thread_branches_or_empty_dirs(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    daemon, client, project, repo = env
    task = planned(packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD))
    # planner, implementer and reviewer: three threads, two of them on peerd/<thread> branches
    done = await finished(
        client, (await start(client, project, task=task, coders=["script"], reviewer="script"))["id"]
    )
    assert packets_of(done)["fix-add"]["state"] == "integrated", done
    threads = await run_threads(client, done["id"])
    assert len(threads) == 3 and all(t["status"] == "archived" for t in threads)
    assert worktrees(repo) == []
    assert branches(repo, "peerd/") == []
    assert sorted(branches(repo, "orchestrate/")) == [f"orchestrate/{done['id']}/fix-add", done["branch"]]
    assert not (daemon.paths.worktrees / "orchestrate" / done["id"]).exists()


async def test_keep_leaves_them_for_a_look(env: tuple[Daemon, LocalClient, dict[str, Any], Path]) -> None:
    _, client, project, repo = env
    plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
    info = await start(client, project, plan=plan, coders=["script"], reviewer="script", keep=True)
    done = await finished(client, info["id"])
    assert packets_of(done)["fix-add"]["state"] == "integrated"
    assert len(worktrees(repo)) == 2  # the packet's and its reviewer's
    assert len(branches(repo, "peerd/")) == 1  # the reviewer's thread branch


async def test_a_cancelled_run_cleans_up_too(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path], tmp_path: Path
) -> None:
    daemon, client, project, repo = env
    hold = tmp_path / "never-released"
    plan = [
        packet("slow-a", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["calc.py"], CHECK_ADD),
        packet("slow-b", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["docs"], "true"),
    ]
    info = await start(client, project, plan=plan, coders=["script"], concurrency=2)
    while not all(p["threadId"] for p in packets_of(info).values()) or len(worktrees(repo)) < 2:
        info = await client.call(
            "GET", f"/v1/orchestrations/{info['id']}", params={"after": info["updatedAt"], "timeout": 1}
        )
    cancelled = await client.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={})
    assert cancelled["status"] == "cancelled"
    assert worktrees(repo) == []  # the packets' worktrees are gone from the user's repository
    assert all(t["status"] == "archived" for t in await run_threads(client, info["id"]))
    assert not (daemon.paths.worktrees / "orchestrate" / info["id"]).exists()


async def test_a_failed_run_cleans_up_its_planner(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    bad = {"id": "x", "goal": "g", "files": ["a.py"], "verify": "true", "dependsOn": ["nope"]}
    done = await finished(client, (await start(client, project, task=planned(bad), coders=["script"]))["id"])
    assert done["status"] == "failed"
    assert worktrees(repo) == [] and branches(repo, "peerd/") == []
