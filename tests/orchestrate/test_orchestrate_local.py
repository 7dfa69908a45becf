"""`peerd orchestrate` on one machine: scripted coders, a scripted reviewer, real git worktrees."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import ProviderConfig
from peerd.daemon import Daemon
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import (
    ADD_MUL,
    CHECK_ADD,
    CHECK_MUL,
    FIX_ADD,
    FIX_ADD_AFTER_WRONG,
    WRONG_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
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


async def test_three_packets_with_a_dependency_two_coders_round_robin(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    plan = [
        packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD, {"reply": "fixed add"}), ["calc.py"], CHECK_ADD),
        packet(
            "add-mul",
            "Add mul().\n\n" + steps(ADD_MUL, {"reply": "added mul"}),
            ["calc.py"],
            CHECK_MUL,
            dependsOn=["fix-add"],
        ),
        packet(
            "docs",
            "Document it.\n\n"
            + steps({"write": {"path": "docs/usage.md", "content": "add, mul\n"}}, {"reply": "ok"}),
            ["docs"],
            "test -f docs/usage.md",
        ),
    ]
    head_before = git(repo, "rev-parse", "HEAD")
    info = await start(
        client, project, plan=plan, coders=["script", "script:second"], verify=f"{CHECK_ADD} && {CHECK_MUL}"
    )
    done = await finished(client, info["id"])
    packets = packets_of(done)
    assert done["status"] == "completed", done
    assert {p["state"] for p in packets.values()} == {"integrated"}, packets
    # round-robin over the two coders (the docs packet may go by its nature; the reason says so)
    specs = {pid: p["coder"]["spec"] for pid, p in packets.items()}
    assert set(specs.values()) == {"script", "script:second"}
    # every hop left its receipt
    assert len(receipts_of(done, "plan")) == 1
    for pid in packets:
        impl = receipts_of(done, "implementation", pid)[-1]
        assert impl["verification"]["passed"] and impl["filesChanged"]
        assert receipts_of(done, "review", pid)[-1]["verdict"] == "approve"
    integration = receipts_of(done, "integration")[-1]
    assert integration["merged"] == ["fix-add", "add-mul", "docs"]
    assert integration["verification"]["passed"]
    # the dependent packet started from its dependency's commit
    assert packets["add-mul"]["commit"] != packets["fix-add"]["commit"]
    assert (
        git(repo, "merge-base", "--is-ancestor", packets["fix-add"]["commit"], packets["add-mul"]["commit"])
        == ""
    )
    # the integration branch holds all of it; the user's branch and checkout are untouched
    branch = done["branch"]
    assert "return a * b" in git(repo, "show", f"{branch}:calc.py")
    assert git(repo, "show", f"{branch}:docs/usage.md") == "add, mul\n"
    assert git(repo, "rev-parse", "HEAD") == head_before
    assert git(repo, "status", "--porcelain") == ""


async def test_a_content_failure_goes_back_once_then_parks(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, _ = env
    plan = [
        # wrong, then right when told the failure: approved after one content retry
        packet(
            "recovers", "Fix add().\n\n" + runs([WRONG_ADD], [FIX_ADD_AFTER_WRONG]), ["calc.py"], CHECK_ADD
        ),
        # wrong twice: parked with the failure output, never a third try
        packet(
            "stubborn",
            "Fix add().\n\n" + runs([WRONG_ADD], [{"reply": "I think it is fine"}], [FIX_ADD_AFTER_WRONG]),
            ["calc.py"],
            CHECK_ADD,
        ),
    ]
    info = await start(client, project, plan=plan, coders=["script"], concurrency=2)
    done = await finished(client, info["id"])
    packets = packets_of(done)
    assert packets["recovers"]["state"] == "integrated", packets["recovers"]
    assert packets["recovers"]["retries"].get("content") == 1
    assert packets["stubborn"]["state"] == "parked"
    assert "AssertionError" in packets["stubborn"]["failure"]
    assert packets["stubborn"]["retries"].get("content") == 1
    tries = receipts_of(done, "implementation", "stubborn")
    assert [r["verification"]["classification"] for r in tries] == ["content", "content"]


async def test_an_empty_diff_is_redispatched_to_another_coder(
    tmp_path: Path,
) -> None:
    repo = project_repo(tmp_path / "repo")
    config = settings(tmp_path)
    idle = ProviderConfig(command=f"{sys.executable} -c pass")  # does nothing: an empty diff
    config = config.model_copy(
        update={"providers": {**config.providers, "idle": idle}, "approved_commands": ["reviewer", "idle"]}
    )
    # Non-interactive runs use only the custom commands the project's own config lists.
    (repo / ".peerd").mkdir()
    (repo / ".peerd" / "orchestrate.toml").write_text('coders = ["idle", "script"]\n')
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["idle", "script"])
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix
    assert fix["coder"]["backend"] == "script" and "re-dispatched" in fix["coder"]["reason"]
    first, second = receipts_of(done, "implementation", "fix-add")[:2]
    assert first["verification"]["classification"] == "empty_diff" and first["coder"]["backend"] == "idle"
    assert second["verification"]["passed"]
    assert git(repo, "status", "--porcelain") == ""  # .peerd/ was excluded from git, as the seed says


async def test_an_edit_that_escaped_into_the_checkout_is_recovered_in_scope_only(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    # The user's own uncommitted work, outside the packet's scope: it must stay exactly as it is.
    (repo / "README.md").write_text("# demo\n\nmy own notes\n")
    (repo / "scratch.txt").write_text("mine\n")
    # An unconfined coder (the owner's full-access run) writes into the user's checkout instead of
    # its worktree: its own run's items name the files and what it wrote, which is the proof.
    fixed = (repo / "calc.py").read_text().replace("return a - b", "return a + b")
    escape = [
        {"write": {"path": str(repo / "calc.py"), "content": fixed}},
        {"write": {"path": str(repo / "notes.txt"), "content": "left by the coder\n"}},
    ]
    plan = [packet("fix-add", "Fix add().\n\n" + steps(*escape), ["calc.py"], CHECK_ADD)]
    done = await finished(
        client, (await start(client, project, plan=plan, coders=["script"], access="full-access"))["id"]
    )
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["recoveredPaths"] == ["calc.py"]
    assert {"path": "calc.py", "moved": True, "reason": "proven"} in impl["checkoutChanges"]
    assert impl["strayPaths"] == ["notes.txt"]  # outside the packet's files: left, even the coder's
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")
    # the checkout: calc.py back as committed, the user's own changes untouched
    assert "return a - b" in (repo / "calc.py").read_text()
    assert (repo / "README.md").read_text() == "# demo\n\nmy own notes\n"
    assert (repo / "scratch.txt").read_text() == "mine\n"
    assert sorted(git(repo, "status", "--porcelain").splitlines()) == [
        " M README.md",
        "?? notes.txt",
        "?? scratch.txt",
    ]


async def test_request_changes_goes_back_to_the_implementer_once(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    verdicts = {
        "fix-add": [
            {"verdict": "request_changes", "evidence": [{"file": "calc.py", "line": 4, "reason": "add a docstring"}],
             "summary": "Needs a docstring."},
            {"verdict": "approve", "evidence": [], "summary": "Good now."},
        ],
        "never": [
            {"verdict": "request_changes", "evidence": [{"file": "calc.py", "line": 4, "reason": "no"}],
             "summary": "No."}
        ],
    }  # fmt: skip
    docstring = {
        "edit": {"path": "calc.py", "old": "    return a + b", "new": '    """Sum."""\n    return a + b'}
    }
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path, verdicts)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [
            packet("fix-add", "Fix add().\n\n" + runs([FIX_ADD], [docstring]), ["calc.py"], CHECK_ADD),
            packet("never", "Fix add().\n\n" + runs([FIX_ADD], [docstring]), ["calc.py"], CHECK_ADD),
        ]
        info = await start(client, project, plan=plan, coders=["script"], concurrency=2)
        done = await finished(client, info["id"])
    packets = packets_of(done)
    assert packets["fix-add"]["state"] == "integrated", packets["fix-add"]
    assert [r["verdict"] for r in receipts_of(done, "review", "fix-add")] == ["request_changes", "approve"]
    assert '"""Sum."""' in git(repo, "show", f"{done['branch']}:calc.py")
    assert packets["never"]["state"] == "parked"  # a second request_changes parks; no third round
    assert [r["verdict"] for r in receipts_of(done, "review", "never")] == [
        "request_changes",
        "request_changes",
    ]


async def test_a_merge_conflict_parks_the_later_packet_and_shows_it(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    other = {"edit": {"path": "calc.py", "old": "return a - b", "new": "return b + a"}}
    plan = [
        packet("first", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD),
        packet("second", "Fix add() too.\n\n" + steps(other), ["calc.py"], CHECK_ADD),
    ]
    info = await start(client, project, plan=plan, coders=["script"], concurrency=2)
    done = await finished(client, info["id"])
    packets = packets_of(done)
    assert packets["first"]["state"] == "integrated"
    assert packets["second"]["state"] == "parked"
    assert "Merge conflict in calc.py" in packets["second"]["failure"]
    assert "<<<<<<<" in packets["second"]["failure"] or "conflict" in packets["second"]["failure"].lower()
    assert receipts_of(done, "integration")[-1]["conflicts"] == {"second": ["calc.py"]}
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")


async def test_cancel_stops_every_packet(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path], tmp_path: Path
) -> None:
    _, client, project, _ = env
    hold = tmp_path / "never-released"
    plan = [
        packet("slow-a", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["calc.py"], CHECK_ADD),
        packet("slow-b", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["docs"], "true"),
    ]
    info = await start(client, project, plan=plan, coders=["script"], concurrency=2)
    while not all(p["threadId"] for p in packets_of(info).values()):
        info = await client.call(
            "GET", f"/v1/orchestrations/{info['id']}", params={"after": info["updatedAt"], "timeout": 10}
        )
    cancelled = await client.call(
        "POST", f"/v1/orchestrations/{info['id']}/cancel", body={"reason": "enough"}
    )
    assert cancelled["status"] == "cancelled"
    assert {p["state"] for p in cancelled["packets"]} == {"cancelled"}
    for p in cancelled["packets"]:
        waited = await client.call("GET", f"/v1/threads/{p['threadId']}/wait", params={"timeout": 30})
        assert waited["status"] == "interrupted"


def plan_reply(packets: list[dict[str, Any]]) -> str:
    return "Here is the plan.\n```json\n" + json.dumps({"packets": packets}) + "\n```"


async def test_a_planner_coder_makes_the_plan_and_an_invalid_plan_goes_back_once(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, repo = env
    good = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
    bad = [{"id": "fix-add", "goal": "Fix add().", "files": ["/etc/passwd"]}]  # no verify, absolute path
    task = "Fix the calculator.\n\n" + runs([{"reply": plan_reply(bad)}], [{"reply": plan_reply(good)}])
    info = await start(client, project, task=task, coders=["script"])
    done = await finished(client, info["id"])
    assert done["status"] == "completed", done
    plan = receipts_of(done, "plan")[-1]
    assert plan["source"] == "planner" and [p["id"] for p in plan["packets"]] == ["fix-add"]
    assert packets_of(done)["fix-add"]["state"] == "integrated"
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")


async def test_a_plan_invalid_twice_stops_the_run_with_the_reason(
    env: tuple[Daemon, LocalClient, dict[str, Any], Path],
) -> None:
    _, client, project, _ = env
    bad = [{"id": "x", "goal": "g", "files": ["a.py"], "verify": "true", "dependsOn": ["nope"]}]
    task = "Plan.\n\n" + runs(
        [{"reply": plan_reply(bad)}], [{"reply": plan_reply(bad)}], [{"reply": "never"}]
    )
    info = await start(client, project, task=task, coders=["script"])
    done = await finished(client, info["id"])
    assert done["status"] == "failed"
    assert "not valid after one send-back" in done["reason"] and "nope" in done["reason"]
    assert done["packets"] == []


async def test_a_coder_past_the_packet_time_limit_is_stopped_and_replaced(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    config = settings(tmp_path)
    sleeper = ProviderConfig(command=f"{sys.executable} -c 'import time; time.sleep(600)'")
    config = config.model_copy(
        update={
            "providers": {**config.providers, "sleeper": sleeper},
            "approved_commands": ["reviewer", "sleeper"],
        }
    )
    (repo / ".peerd").mkdir()
    (repo / ".peerd" / "orchestrate.toml").write_text('coders = ["sleeper", "script"]\n')
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["sleeper", "script"], packetTimeoutS=1)
        done = await finished(client, info["id"])
        first = receipts_of(done, "implementation", "fix-add")[0]
        threads = (await client.call("GET", "/v1/threads", params={"includeArchived": True}))["items"]
        stopped = next(t for t in threads if t["provider"] == "sleeper")
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix["failure"]
    assert first["coder"]["backend"] == "sleeper" and first["verification"]["classification"] == "timeout"
    assert "ran past its 1 s limit" in first["verification"]["outputTail"]
    assert fix["coder"]["backend"] == "script" and fix["retries"]["redispatch"] == 1
    assert stopped["latestRun"]["status"] == "interrupted"  # the slow coder was stopped, not left running
