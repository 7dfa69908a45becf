"""The user's own work in their checkout is never taken: refused at plan time, started from with
--include-dirty, and never mistaken for a coder's escaped edits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from peerd.errors import PeerdError
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
    CHECK_STATS,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    runs,
    settings,
    start,
    steps,
    textkit_repo,
    worktree_of,
)

USER_EDIT = "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return total(xs) / len(xs)\n"


def dirty_the_users_way(repo: Path) -> dict[str, str]:
    """The issue's case: an uncommitted edit and an untracked file inside the packet's `textkit/`."""
    (repo / "textkit" / "stats.py").write_text(USER_EDIT)
    (repo / "textkit" / "scratch_user.py").write_text("# my scratch, not committed\n")
    return {
        "stats": (repo / "textkit" / "stats.py").read_text(),
        "scratch": (repo / "textkit" / "scratch_user.py").read_text(),
        "status": git(repo, "status", "--porcelain"),
    }


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Daemon, LocalClient, dict[str, Any], Path]]:
    repo = textkit_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        yield daemon, client, project, repo


def untouched(repo: Path, before: dict[str, str]) -> None:
    assert (repo / "textkit" / "stats.py").read_text() == before["stats"]
    assert (repo / "textkit" / "scratch_user.py").read_text() == before["scratch"]
    assert git(repo, "status", "--porcelain") == before["status"]


async def test_a_packet_over_the_users_uncommitted_work_is_refused_at_plan_time(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    before = dirty_the_users_way(repo)
    plan = [packet("stats", "Add median.\n\n" + steps({"reply": "x"}), ["textkit/"], CHECK_STATS)]
    with pytest.raises(PeerdError) as refused:
        await start(client, project, plan=plan, coders=["script"])
    assert refused.value.code == "checkout_dirty"
    message = refused.value.message
    assert "textkit/scratch_user.py" in message and "textkit/stats.py" in message and "stats:" in message
    assert "git commit" in message and "git stash" in message and "--include-dirty" in message
    assert (await client.call("GET", "/v1/orchestrations"))["items"] == []  # nothing was started
    untouched(repo, before)


async def test_a_planners_packet_over_the_users_work_ends_the_run_with_the_paths(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    before = dirty_the_users_way(repo)
    planned = packet("stats", "Add median.", ["textkit/stats.py"], CHECK_STATS)
    task = "Improve textkit.\n\n" + steps({"reply": '```json\n{"packets": [' + _json(planned) + "]}\n```"})
    done = await finished(client, (await start(client, project, task=task, coders=["script"]))["id"])
    assert done["status"] == "failed" and done["packets"] == []
    assert "textkit/stats.py" in done["reason"] and "--include-dirty" in done["reason"]
    assert "textkit/scratch_user.py" not in done["reason"]  # not in that packet's files
    untouched(repo, before)


def _json(value: Any) -> str:
    import json  # noqa: PLC0415

    return json.dumps(value)


async def test_include_dirty_starts_from_the_working_state_and_leaves_the_checkout_alone(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    before = dirty_the_users_way(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    # The coder's edit needs the user's uncommitted `mean`: it can only apply on the working state.
    mean_line = "    return total(xs) / len(xs)\n"
    median_def = "\n\ndef median(xs):\n    return sorted(xs)[len(xs) // 2]\n"
    median = {"edit": {"path": "textkit/stats.py", "old": mean_line, "new": mean_line + median_def}}
    plan = [
        packet(
            "stats", "Add median.\n\n" + steps(median, {"reply": "added median"}), ["textkit/"], CHECK_STATS
        )
    ]
    info = await start(client, project, plan=plan, coders=["script"], includeDirty=True)
    assert info["includeDirty"] and info["baseCommit"] != head
    done = await finished(client, info["id"])
    stats = packets_of(done)["stats"]
    assert stats["state"] == "integrated", stats["failure"]
    impl = receipts_of(done, "implementation", "stats")[-1]
    # the user's paths are the base, not "recovered" edits of the coder's
    assert impl["recoveredPaths"] == [] and impl["userPaths"] == [] and impl["strayPaths"] == []
    assert impl["notRecovered"] == [] and impl["recoveryProblem"] is None  # never even tried
    assert impl["filesChanged"] == ["textkit/stats.py"]
    branch = done["branch"]
    assert "def median" in git(repo, "show", f"{branch}:textkit/stats.py")
    assert "def mean" in git(repo, "show", f"{branch}:textkit/stats.py")
    assert git(repo, "show", f"{branch}:textkit/scratch_user.py") == before["scratch"]
    assert git(repo, "rev-parse", "HEAD").strip() == head
    untouched(repo, before)  # the checkout: exactly as the user left it


async def test_an_escaped_edit_that_does_not_apply_is_left_and_reported_not_parked(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        # An unconfined coder fixes add() in its worktree and also writes another edit of the same
        # line into the user's checkout (proven its own: it cannot apply on the worktree's).
        escaped = (repo / "calc.py").read_text().replace("return a - b", "return a * b")
        script = steps(
            FIX_ADD, {"write": {"path": str(repo / "calc.py"), "content": escaped}}, {"reply": "fixed add"}
        )
        plan = [packet("fix-add", "Fix add().\n\n" + script, ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], access="full-access")
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix["failure"]
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["recoveredPaths"] == [] and impl["notRecovered"] == ["calc.py"]
    assert {"path": "calc.py", "moved": False, "reason": "does_not_apply"} in impl["checkoutChanges"]
    # a typed outcome in peerd's words, never git's
    assert "conflict with the coder's own work" in impl["recoveryProblem"]
    assert "error" not in impl["recoveryProblem"] and "patch" not in impl["recoveryProblem"]
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")
    # left where it was: peerd moved nothing it could not move cleanly
    assert "return a * b" in (repo / "calc.py").read_text()


async def test_the_users_own_edit_during_a_run_is_not_recovered_when_it_was_theirs_before(
    tmp_path: Path,
) -> None:
    """With --include-dirty, a user file in the packet's files that changes during the run is the
    user's: reported, never moved."""
    repo = textkit_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        dirty_the_users_way(repo)
        edit = {"write": {"path": "textkit/extra.py", "content": "X = 1\n"}}
        plan = [
            packet(
                "stats", "Extra.\n\n" + runs([{"wait_for_file": "go"}, edit]), ["textkit/", "go"], CHECK_STATS
            )
        ]
        info = await start(client, project, plan=plan, coders=["script"], includeDirty=True)
        worktree = await worktree_of(client, info, "stats")
        (repo / "textkit" / "stats.py").write_text(USER_EDIT + "\n# still typing\n")
        (worktree / "go").write_text("")
        done = await finished(client, info["id"])
    impl = receipts_of(done, "implementation", "stats")[-1]
    assert impl["userPaths"] == ["textkit/stats.py"] and impl["recoveredPaths"] == []
    assert (repo / "textkit" / "stats.py").read_text().endswith("# still typing\n")
    assert "# still typing" not in git(repo, "show", f"{done['branch']}:textkit/stats.py")
