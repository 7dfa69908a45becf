"""The `peerd orchestrate` command line, run as a subprocess against a real daemon."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from peerd.config import ProviderConfig
from tests.helpers import client_for, git, running_daemon
from tests.support.orchestrate import CHECK_ADD, FIX_ADD, peerd_in, project_repo, settings, steps

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)


def plan_dir(root: Path) -> Path:
    """One markdown file per packet with TOML front matter (the --plan format)."""
    root.mkdir()
    (root / "01-fix-add.md").write_text(
        f'+++\nfiles = ["calc.py"]\nverify = "{CHECK_ADD}"\n+++\nFix add().\n\n{steps(FIX_ADD)}\n'
    )
    (root / "02-docs.md").write_text(
        '+++\nfiles = ["docs"]\nverify = "test -f docs/usage.md"\ndepends_on = ["01-fix-add"]\n+++\n'
        "Document add().\n\n" + steps({"write": {"path": "docs/usage.md", "content": "add\n"}}) + "\n"
    )
    (root / "README.md").write_text("Not a packet: no front matter.\n")
    return root


async def test_orchestrate_from_a_plan_directory_in_the_project(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    plan = plan_dir(tmp_path / "plan")
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon:
        home = daemon.paths.home
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        done = await peerd_in(
            home, repo, "orchestrate", "--plan", str(plan), "--coder", "script", "--reviewer", "reviewer",
            "--verify", CHECK_ADD, "--non-interactive",
        )  # fmt: skip
        assert done.returncode == EXIT_OK, done.stdout + done.stderr
        text = done.stdout
        assert "integration branch orchestrate/" in text and "full check: passed" in text
        assert "01-fix-add" in text and "02-docs" in text
        # live progress: a time on every line, the attempt and the coder
        assert re.search(r"^\d\d:\d\d:\d\d  run running$", text, re.MULTILINE), text
        assert re.search(r"^\d\d:\d\d:\d\d  01-fix-add +implementing +attempt 1, script ", text, re.MULTILINE)
        assert "reviewer: reviewer (its default model, here) - --reviewer" in text  # the report
        assert "README.md: no +++ front matter" in done.stderr
        run_id = text.split("orchestration ", 1)[1].split(":", 1)[0]
        status = await peerd_in(home, repo, "orchestrate", "status", run_id, "--json")
        info: dict[str, Any] = json.loads(status.stdout)
        listed = await peerd_in(home, repo, "orchestrate", "list")
    assert info["status"] == "completed" and [p["state"] for p in info["packets"]] == [
        "integrated",
        "integrated",
    ]
    assert run_id in listed.stdout
    assert git(repo, "show", f"{info['branch']}:docs/usage.md") == "add\n"


async def test_a_packet_beyond_its_files_is_held_unless_the_command_allows_it(tmp_path: Path) -> None:
    """Case 3 at the command line: the report names the paths and the flag; --allow-out-of-scope
    integrates it (and --json carries the paths)."""
    repo = project_repo(tmp_path / "repo")
    plan = tmp_path / "plan"
    plan.mkdir()
    beyond = steps(FIX_ADD, {"write": {"path": "docs/index.md", "content": "# calc, by the coder\n"}})
    (plan / "01-fix-add.md").write_text(
        f'+++\nfiles = ["calc.py"]\nverify = "{CHECK_ADD}"\n+++\nFix add().\n\n{beyond}\n'
    )
    args = (
        "orchestrate",
        "--plan",
        str(plan),
        "--coder",
        "script",
        "--reviewer",
        "reviewer",
        "--non-interactive",
    )
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon:
        home = daemon.paths.home
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        held = await peerd_in(home, repo, *args)
        allowed = await peerd_in(home, repo, *args, "--allow-out-of-scope", "--json")
    assert held.returncode == EXIT_RUN_FAILED, held.stdout + held.stderr  # nothing integrated
    assert "outside the packet's files: docs/index.md" in held.stdout
    assert "held: out_of_scope" in held.stdout and "--allow-out-of-scope" in held.stdout
    assert allowed.returncode == EXIT_OK, allowed.stdout + allowed.stderr
    info: dict[str, Any] = json.loads(allowed.stdout)
    assert info["allowOutOfScope"] and [p["state"] for p in info["packets"]] == ["integrated"]
    impl = [r["body"] for r in info["receipts"] if r["kind"] == "implementation"][-1]
    assert impl["outOfScope"] == ["docs/index.md"]
    assert git(repo, "show", f"{info['branch']}:docs/index.md") == "# calc, by the coder\n"


async def test_orchestrate_refuses_bad_input_clearly(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon:
        home = daemon.paths.home
        outside = await peerd_in(home, tmp_path, "orchestrate", "do it", "--coder", "script")
        assert outside.returncode == EXIT_USAGE and "not a registered project" in outside.stderr
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        no_dir = await peerd_in(home, repo, "orchestrate", "--plan", str(tmp_path / "none"))
        assert no_dir.returncode == EXIT_USAGE and "not a directory" in no_dir.stderr
        bad_spec = await peerd_in(
            home, repo, "orchestrate", "x", "--coder", "nowhere/script", "--non-interactive"
        )
        assert bad_spec.returncode != EXIT_OK and "nowhere" in bad_spec.stderr
        assert "Traceback" not in outside.stderr + no_dir.stderr + bad_spec.stderr


async def test_an_interactive_run_shows_a_custom_command_and_asks_first(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    command = "sed -i s/a-b/a+b/ {WORKTREE}/calc.py"
    config = settings(tmp_path)
    config = config.model_copy(
        update={"providers": {**config.providers, "mine": ProviderConfig(command=command)}}
    )
    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "fix.md").write_text(f'+++\nfiles = ["calc.py"]\nverify = "{CHECK_ADD}"\n+++\nFix add().\n')
    (repo / "calc.py").write_text((repo / "calc.py").read_text().replace("a - b", "a-b"))
    git(repo, "commit", "-qam", "compact")
    async with running_daemon(tmp_path / "home", settings=config) as daemon:
        home = daemon.paths.home
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        args = ("orchestrate", "--plan", str(plan), "--coder", "mine", "--reviewer", "reviewer")
        declined = await peerd_in(home, repo, *args, stdin="n\n")
        accepted = await peerd_in(home, repo, *args, stdin="y\n")
    assert command in declined.stdout and "Run mine as a coder?" in declined.stdout
    assert declined.returncode != EXIT_OK  # not confirmed: nothing ran
    assert accepted.returncode == EXIT_OK, accepted.stdout + accepted.stderr
    assert "fix" in accepted.stdout and "integrated" in accepted.stdout
