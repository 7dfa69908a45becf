"""Failures are classified by evidence peerd has (its own re-run of the check, the coder's structured
events), never by words in a check's output; each receipt states its evidence; an empty diff's
park quotes what the coder's run reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from peerd.config import ProviderConfig
from tests.helpers import client_for, running_daemon
from tests.support.orchestrate import (
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

# A real test failure whose own assertion message says the words the old rule matched.
CHECK_WORDY = "python3 -c 'import calc; assert calc.add(2, 3) == 5, \"permission denied: add() is wrong\"'"


async def test_a_real_failure_that_says_permission_denied_gets_the_coders_fix(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        goal = "Fix add().\n\n" + runs([WRONG_ADD], [FIX_ADD_AFTER_WRONG])
        info = await start(
            client, project, plan=[packet("fix-add", goal, ["calc.py"], CHECK_WORDY)], coders=["script"]
        )
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix["failure"]
    assert fix["retries"].get("content") == 1 and not fix["retries"].get("environmental")
    first, second = receipts_of(done, "implementation", "fix-add")
    assert first["verification"]["classification"] == "content"
    assert "permission denied" in first["verification"]["outputTail"]
    # the evidence: peerd ran it twice on that commit, outside any coder sandbox, and it failed twice
    assert "again when peerd re-ran it" in first["verification"]["evidence"]
    assert first["verification"]["firstRun"]["classification"] == "content"
    assert first["hop"] == "implement" and second["hop"] == "fix" and second["verification"]["passed"]


async def test_a_failure_that_does_not_repeat_is_environmental_by_peerds_rerun(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    marker = tmp_path / "flaky-ran-once"
    flaky = f"test -e {marker} || {{ touch {marker}; echo 'disk hiccup' >&2; exit 3; }}"
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        goal = "Fix add().\n\n" + steps(FIX_ADD)
        info = await start(
            client, project, plan=[packet("fix-add", goal, ["calc.py"], flaky)], coders=["script"]
        )
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix["failure"]
    assert fix["retries"].get("environmental") == 1 and not fix["retries"].get("content")
    (impl,) = receipts_of(done, "implementation", "fix-add")
    verification = impl["verification"]
    assert verification["passed"] and "re-run of the same commit" in verification["evidence"]
    first = verification["firstRun"]
    assert first["classification"] == "environmental" and first["exitCode"] == 3
    assert "disk hiccup" in first["outputTail"]  # the first run's output is kept


FAKE_CODEX = """\
import json, sys
def say(event):
    print(json.dumps(event), flush=True)
say({"type": "thread.started", "thread_id": "fake-1"})
say({"type": "turn.started"})
say({"type": "item.completed", "item": {"type": "command_execution", "command": "apply_patch calc.py",
     "aggregated_output": "", "exit_code": None, "status": "declined"}})
say({"type": "item.completed", "item": {"type": "error",
     "message": "Failed to write file calc.py: Read-only file system (os error 30)"}})
say({"type": "item.completed", "item": {"type": "agent_message", "text": "Done: add() is fixed."}})
say({"type": "turn.completed", "usage": {}})
"""


async def test_a_sandbox_denial_in_the_coders_events_is_environmental_and_its_park_quotes_the_errors(
    tmp_path: Path,
) -> None:
    repo = project_repo(tmp_path / "repo")
    home = tmp_path / "boxed-home"  # a custom coder's HOME stays visible inside peerd's confinement
    home.mkdir()
    fake = home / "fake_codex.py"
    fake.write_text(FAKE_CODEX)
    config = settings(tmp_path)
    boxed = ProviderConfig(
        command=f"{sys.executable} {fake} {{SPEC}}", format="codex-jsonl", env={"HOME": str(home)}
    )
    config = config.model_copy(
        update={"providers": {**config.providers, "boxed": boxed}, "approved_commands": ["reviewer", "boxed"]}
    )
    (repo / ".peerd").mkdir()
    (repo / ".peerd" / "orchestrate.toml").write_text('coders = ["boxed"]\n')
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().", ["calc.py"], "true")]
        done = await finished(client, (await start(client, project, plan=plan, coders=["boxed"]))["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "parked"
    # the park says why: the coder's own error items, not only its claim of success
    assert "Failed to write file calc.py" in fix["failure"] and "declined" in fix["failure"]
    assert "Done: add() is fixed." in fix["failure"]
    (impl,) = receipts_of(done, "implementation", "fix-add")
    assert impl["verification"]["classification"] == "environmental"
    assert "the coder's own events report that its sandbox declined" in impl["verification"]["evidence"]
    assert any("Failed to write file" in line for line in impl["coderErrors"])
    assert json.dumps(impl)  # a plain receipt
