"""`peerd orchestrate` on one machine: scripted coders, a scripted reviewer, real git worktrees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.client import LocalClient
from peerd.daemon import Daemon
from tests.helpers import client_for, git, running_daemon
from tests.orchestrate.support import (
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
)

FIX_ADD = {"edit": {"path": "calc.py", "old": "return a - b", "new": "return a + b"}}
ADD_MUL = {
    "edit": {
        "path": "calc.py",
        "old": "    return a + b\n",
        "new": "    return a + b\n\n\ndef mul(a: int, b: int) -> int:\n    return a * b\n",
    }
}
CHECK_ADD = "python3 -c 'import calc; assert calc.add(2, 3) == 5'"
CHECK_MUL = "python3 -c 'import calc; assert calc.mul(2, 3) == 6'"


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
