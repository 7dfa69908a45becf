"""Delivery: `--push REMOTE` pushes the integration branch (peerd's safe git), `--pr` opens a pull
request through `gh` with the report as its body (a stub `gh` on PATH records what it was asked),
or says exactly what is missing. Plan time: packets that share files are warned about, and
`--serialize-overlaps` runs them one after the other."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.errors import PeerdError
from peerd.orchestrate.report import render
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import (
    ADD_MUL,
    CHECK_ADD,
    CHECK_MUL,
    FIX_ADD,
    GH_STUB,
    finished,
    gh_calls,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
)


@pytest.fixture
def gh_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory first on PATH with a stub `gh` that records each call (and any body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "gh"
    stub.write_text(GH_STUB.format(python=sys.executable))
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[LocalClient, dict[str, Any], Path, Path]]:
    repo = project_repo(tmp_path / "repo")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "set-url", "origin", str(origin))
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        yield client, project, repo, origin


PLAN = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]


@pytest.mark.slow
async def test_pr_pushes_to_a_local_bare_origin_and_opens_a_draft_with_the_report(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh_bin: Path
) -> None:
    client, project, _, origin = env
    info = await start(client, project, plan=PLAN, coders=["script"], verify=CHECK_ADD, pr=True)
    done = await finished(client, info["id"])
    assert done["status"] == "completed", done
    integration = receipts_of(done, "integration")[-1]
    # the bare origin received the integration branch, at its tip
    assert git(origin, "rev-parse", f"refs/heads/{done['branch']}").strip() == integration["commit"]
    delivery = receipts_of(done, "delivery")[-1]
    assert delivery["pushed"] and delivery["remote"] == "origin"
    assert delivery["prUrl"] == "https://github.com/peerd/demo/pull/7" and delivery["prDraft"]
    created = next(c for c in gh_calls(gh_bin) if c["argv"][:2] == ["pr", "create"])
    argv = created["argv"]
    assert argv[argv.index("--head") + 1] == done["branch"] and argv[argv.index("--base") + 1] == "main"
    assert "--draft" in argv and "--title" in argv
    body = created["body"]
    assert f"Orchestration {done['id']}: completed" in body and "fix-add" in body
    assert "full check: passed" in body and "verdict approve" in body
    text = render(done)
    assert f"pushed: {done['branch']} to origin" in text
    assert "pull request: https://github.com/peerd/demo/pull/7 (draft)" in text
    # --ready: the same, not a draft
    again = await finished(
        client, (await start(client, project, plan=PLAN, coders=["script"], pr=True, ready=True))["id"]
    )
    last = [c for c in gh_calls(gh_bin) if c["argv"][:2] == ["pr", "create"]][-1]["argv"]
    assert "--draft" not in last and last[last.index("--head") + 1] == again["branch"]


@pytest.mark.slow
async def test_pr_says_exactly_what_is_missing(
    env: tuple[LocalClient, dict[str, Any], Path, Path], gh_bin: Path
) -> None:
    client, project, _, origin = env
    (gh_bin / "logged-out").write_text("")
    preview = await start(client, project, plan=PLAN, coders=["script"], pr=True, dryRun=True)
    assert any("not logged in: run `gh auth login`" in w for w in preview["warnings"])
    done = await finished(client, (await start(client, project, plan=PLAN, coders=["script"], pr=True))["id"])
    delivery = receipts_of(done, "delivery")[-1]
    assert delivery["pushed"]  # the push needs no gh
    assert git(origin, "rev-parse", f"refs/heads/{done['branch']}").strip()
    assert "not logged in: run `gh auth login`" in delivery["prProblem"]
    assert f"gh pr create --head {done['branch']}" in delivery["prProblem"]
    assert not [c for c in gh_calls(gh_bin) if c["argv"][:2] == ["pr", "create"]]


@pytest.mark.slow
async def test_pr_without_gh_installed_says_so(
    env: tuple[LocalClient, dict[str, Any], Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, project, _, _ = env
    monkeypatch.setenv(
        "PATH",
        os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "gh").exists()),
    )
    done = await finished(client, (await start(client, project, plan=PLAN, coders=["script"], pr=True))["id"])
    problem = receipts_of(done, "delivery")[-1]["prProblem"]
    assert "gh (the GitHub CLI) is not installed" in problem and "https://cli.github.com" in problem
    assert "no pull request: gh (the GitHub CLI) is not installed" in render(done)


async def test_push_to_an_unknown_remote_is_refused_at_start(
    env: tuple[LocalClient, dict[str, Any], Path, Path],
) -> None:
    client, project, _, _ = env
    with pytest.raises(PeerdError) as refused:
        await start(client, project, plan=PLAN, coders=["script"], push="upstream")
    assert refused.value.code == "invalid_request"
    assert "has no remote called upstream. Its remotes are origin: name one of them" in refused.value.message


SHARED = [
    packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD),
    packet("add-mul", "Add mul().\n\n" + steps(ADD_MUL), ["calc.py", "docs/"], CHECK_MUL),
]


@pytest.mark.slow
async def test_packets_sharing_files_are_warned_about_and_can_be_serialized(
    env: tuple[LocalClient, dict[str, Any], Path, Path],
) -> None:
    client, project, repo, _ = env
    preview = await start(client, project, plan=SHARED, coders=["script"], dryRun=True)
    (warning,) = preview["warnings"]
    assert "fix-add and add-mul both touch calc.py" in warning and "--serialize-overlaps" in warning
    # serialized: add-mul waits for fix-add and starts from its work, so its edit applies
    info = await start(client, project, plan=SHARED, coders=["script"], serializeOverlaps=True)
    done = await finished(client, info["id"])
    assert {p["state"] for p in done["packets"]} == {"integrated"}, done
    assert packets_of(done)["add-mul"]["dependsOn"] == ["fix-add"]
    assert any("add-mul runs after fix-add" in note for note in receipts_of(done, "plan")[-1]["notes"])
    assert "return a * b" in git(repo, "show", f"{done['branch']}:calc.py")
