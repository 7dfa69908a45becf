"""Reviews out of the box: with only scripted coders the default reviewer is peerd's scripted
reviewer (which answers what a packet scripts in a ```peerd-review block); a reviewer whose run
fails is reported as such, with its error; parked verdicts keep their evidence."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from peerd.config import ProviderConfig
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
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
)

DOCSTRING = {
    "edit": {"path": "calc.py", "old": "    return a + b", "new": '    """Sum."""\n    return a + b'}
}


def review_block(*answers: dict[str, object]) -> str:
    return "```peerd-review\n" + json.dumps(list(answers)) + "\n```"


async def test_with_only_scripted_coders_the_default_reviewer_works(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], reviewer=None, verify=CHECK_ADD)
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert done["status"] == "completed" and fix["state"] == "integrated", fix["failure"]
    (review,) = receipts_of(done, "review", "fix-add")
    assert review["reviewer"]["backend"] == "script" and review["verdict"] == "approve"
    assert "scripted reviewer" in review["reviewer"]["reason"]  # the choice is explained
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")


async def test_the_scripted_reviewer_answers_the_verdicts_a_packet_scripts(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    changes = {"verdict": "request_changes", "summary": "Needs a docstring.",
               "evidence": [{"file": "calc.py", "line": 4, "reason": "add a docstring"}]}  # fmt: skip
    approve = {"verdict": "approve", "evidence": [], "summary": "Good now."}
    reject = {"verdict": "reject", "summary": "Wrong approach.",
              "evidence": [{"file": "calc.py", "line": 5, "reason": "subtracts in another way"}]}  # fmt: skip
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [
            packet("twice", "Fix add().\n\n" + runs([FIX_ADD], [DOCSTRING]) + "\n" + review_block(changes, approve),
                   ["calc.py"], CHECK_ADD),
            packet("rejected", "Fix add().\n\n" + steps(FIX_ADD) + "\n" + review_block(reject), ["calc.py"], CHECK_ADD),
        ]  # fmt: skip
        info = await start(client, project, plan=plan, coders=["script"], reviewer="script", concurrency=2)
        done = await finished(client, info["id"])
    packets = packets_of(done)
    assert packets["twice"]["state"] == "integrated", packets["twice"]["failure"]
    rounds = receipts_of(done, "review", "twice")
    assert [(r["verdict"], r["round"]) for r in rounds] == [("request_changes", 1), ("approve", 2)]
    assert all(r["startedAt"] <= r["endedAt"] for r in rounds)
    assert '"""Sum."""' in git(repo, "show", f"{done['branch']}:calc.py")
    # a parked verdict keeps its evidence in the failure the report shows
    assert packets["rejected"]["state"] == "parked"
    assert "rejected it: Wrong approach." in packets["rejected"]["failure"]
    assert "calc.py:5: subtracts in another way" in packets["rejected"]["failure"]


async def test_a_reviewer_whose_run_fails_is_reported_with_its_error(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    crash = "import sys; print('reviewer: cannot reach its model server', file=sys.stderr); sys.exit(2)"
    config = settings(tmp_path)
    crasher = ProviderConfig(command=f"{sys.executable} -c {json.dumps(crash)}")
    config = config.model_copy(
        update={
            "providers": {**config.providers, "crasher": crasher},
            "approved_commands": ["reviewer", "crasher"],
        }
    )
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], reviewer="crasher")
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "parked"
    assert "The reviewer's run (crasher, here) ended failed" in fix["failure"]
    assert "cannot reach its model server" in fix["failure"]
    assert "no valid verdict" not in fix["failure"]
