"""Issue 32, "the report and progress a person can trust": where every hop ran (never "on auto"),
an end state of its own for a run that integrated nothing or whose full check failed, the coder's
failed commands in a parked packet, the sandbox notice and each failure output said once, plain
wording, and a check in a fresh checkout that starts with the checkout's tool caches."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from peerd import contracts as c
from peerd.cli.common import EXIT_RUN_FAILED
from peerd.core.usage import Budget, Usage, exceeded_by
from peerd.errors import InvalidRequest
from peerd.orchestrate import checks, deliver, steps, views
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import RunOutcome, _problem
from peerd.orchestrate.report import progress, render, succeeded, who
from peerd.orchestrate.states import TERMINAL_RUN, end_state
from peerd.store.db import Database
from tests.helpers import client_for, git, make_repo, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    peerd_in,
    project_repo,
    receipts_of,
    settings,
    start,
)
from tests.support.orchestrate import (
    steps as script_steps,
)
from tests.unit.test_orchestrate_steps import packet as a_packet

REJECT = {"verdict": "reject", "summary": "No.", "evidence": [{"file": "calc.py", "reason": "wrong"}]}
NOTICE = (
    "notice: peerd confines this run (bubblewrap): it sees the system's programs and libraries "
    "(read-only), its worktree (writable), and nothing else of this machine."
)
FAILED = "command pytest -q failed (exit 1): E   AssertionError: add(2, 3) == -1\n1 failed in 0.02s"


# --- where every hop ran ------------------------------------------------------------------------


def test_a_hop_placed_by_auto_is_shown_where_it_ran_never_on_auto() -> None:
    auto = {"spec": "auto/script", "backend": "script", "environment": "auto", "reason": "--on auto"}
    placed = {**auto, "spec": "box/script", "environment": "box", "reason": "--on auto; placed by auto: box"}
    assert "on auto" not in who(auto) and who(auto).startswith("script (its default model, placed by auto")
    assert who(placed) == "box/script (its default model, on box)"
    seen: dict[str, Any] = {}
    base = {"id": "p1", "state": "reviewing", "hop": "review", "attempt": 1, "coder": placed, "retries": {}}
    lines = progress({"status": "running", "updatedAt": 1.0, "packets": [{**base, "reviewer": auto}]}, seen)
    lines += progress(
        {"status": "running", "updatedAt": 2.0, "packets": [{**base, "reviewer": placed}]}, seen
    )
    assert not any("on auto" in line for line in lines), lines
    assert lines[-1].endswith("reviewer box/script (its default model, on box)"), lines
    planner = {"kind": "thread", "packetId": None, "body": {"role": "planner", "coder": placed}}
    planned = {"status": "planning", "updatedAt": 0.5, "packets": [], "receipts": [planner]}
    assert progress(planned, {})[-1].endswith("planner box/script (its default model, on box)")


# --- an end state of its own --------------------------------------------------------------------


def test_a_run_that_merged_nothing_or_failed_its_full_check_has_its_own_end_state() -> None:
    assert end_state(0, None) == end_state(0, True) == "not_integrated"
    assert end_state(2, False) == "check_failed"
    assert end_state(2, True) == end_state(1, None) == "completed"
    assert {"not_integrated", "check_failed"} <= TERMINAL_RUN
    info = {"id": "orc_1", "status": "check_failed", "reason": "1 packet(s) integrated (check FAILED)",
            "task": "t", "baseCommit": "abc", "packets": [], "receipts": []}  # fmt: skip
    assert render(info).startswith(
        "Orchestration orc_1: check_failed (the full check failed on the integrated result) - 1 packet"
    )
    assert not succeeded(info)


async def test_a_run_an_older_peerd_ended_completed_with_nothing_merged_reads_as_written(
    tmp_path: Path,
) -> None:
    """Old stores: before these end states, such a run was recorded `completed`; it still reads,
    shows and reports, and its exit code was and stays 5 (not everything was integrated)."""
    db = await Database.open(tmp_path / "peerd.db")
    try:
        async with db.write() as tx:
            await tx.execute(
                "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', 0)"
            )
        run = await ostore.create(db, project_id="prj_1", task="t", request={}, base_commit="c" * 40, now=1.0)
        await ostore.add_packets(db, run.id, [{"id": "a"}], now=1.0)
        await ostore.update_packet(
            db, run.id, "a", now=2.0, state="parked", failure="The coder changed nothing."
        )
        integration: dict[str, Any] = {
            "branch": run.branch,
            "merged": [],
            "conflicts": {},
            "verification": None,
        }
        await ostore.add_receipt(db, run.id, None, "integration", integration, now=3.0)
        async with db.write() as tx:  # as the release before wrote it
            await tx.execute(
                "UPDATE orchestrations SET status = 'completed', reason = ?, ended_at = 4 WHERE id = ?",
                ("0 packet(s) integrated (no full check); parked: a", run.id),
            )
        info = await views.describe(db, run.id)
        assert (await ostore.get(db, run.id)).terminal
    finally:
        await db.close()
    assert info["status"] == "completed" and not succeeded(info)
    assert render(info).startswith(f"Orchestration {run.id}: completed - 0 packet(s) integrated")


@pytest.mark.slow
async def test_a_run_that_integrates_nothing_ends_not_integrated_everywhere(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path, {"fix": [REJECT]})) as daemon:
        home = daemon.paths.home
        async with client_for(home) as client:
            await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = tmp_path / "plan"
        plan.mkdir()
        (plan / "fix.md").write_text(
            f'+++\nid = "fix"\nfiles = ["calc.py"]\nverify = "{CHECK_ADD}"\n+++\nFix add().\n\n'
            + script_steps(FIX_ADD)
        )
        done = await peerd_in(
            home, repo, "orchestrate", "--plan", str(plan), "--coder", "script", "--reviewer", "reviewer",
            "--verify", CHECK_ADD, "--non-interactive",
        )  # fmt: skip
        listed = await peerd_in(home, repo, "orchestrate", "list", "--json")
        run_id = json.loads(listed.stdout)[0]["id"]
        status = await peerd_in(home, repo, "orchestrate", "status", run_id)
        table = await peerd_in(home, repo, "orchestrate", "list")
        async with client_for(home) as client:
            info = await client.call("GET", f"/v1/orchestrations/{run_id}")
    assert done.returncode == EXIT_RUN_FAILED, done.stdout + done.stderr
    assert re.search(r"^\d\d:\d\d:\d\d  run not_integrated$", done.stdout, re.MULTILINE), done.stdout
    assert f"Orchestration {run_id}: not_integrated (nothing was integrated) - 0 packet(s)" in done.stdout
    assert json.loads(listed.stdout)[0]["status"] == info["status"] == "not_integrated"
    assert re.search(rf"^{run_id} +not_integrated ", table.stdout, re.MULTILINE), table.stdout
    assert (
        "fix                  parked       script (its default model, here); reviewer reviewer (its default"
        in (status.stdout)
    ), status.stdout
    assert info["endedAt"] is not None


@pytest.mark.slow
async def test_a_run_whose_full_check_fails_ends_check_failed(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix", "Fix add().\n\n" + script_steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], verify="exit 3")
        done = await finished(client, info["id"])
        listed = (await client.call("GET", "/v1/orchestrations"))["items"]
    assert done["status"] == "check_failed", done["reason"]
    assert [p["state"] for p in done["packets"]] == ["integrated"]
    assert [i["status"] for i in listed] == ["check_failed"]
    assert "check_failed (the full check failed on the integrated result)" in render(done)


# --- the coder's failed commands, each said once ------------------------------------------------


def _item(kind: str, text: str, **data: Any) -> c.Item:
    return c.Item(
        id="itm_1", thread_id="thr_1", run_id="run_1", position=1, kind=kind, text=text,
        text_length=len(text), data=data, created_at=1.0,
    )  # fmt: skip


def test_a_command_that_exited_non_zero_is_reported_with_its_exit_code_and_output_tail() -> None:
    output = "x" * 2000 + "\nE   AssertionError: add(2, 3) == -1"
    line, denied = _problem(_item("command", "pytest -q", exit_code=1, output=output))
    assert line is not None and not denied
    assert line.startswith("command pytest -q failed (exit 1): ") and line.endswith(
        "AssertionError: add(2, 3) == -1"
    )
    assert len(line) < 400
    assert _problem(_item("command", "ls", exit_code=0, output="ok")) == (None, False)
    assert _problem(_item("command", "ls", exit_code=True, output="ok")) == (None, False)
    declined = _problem(_item("command", "rm -rf /", status="declined", exit_code=None))
    assert declined == ("command rm -rf / declined", True)


def _attempt(attempt: int, problems: list[str], detail: str) -> dict[str, Any]:
    return {
        "kind": "implementation",
        "packetId": "fix",
        "body": {
            "attempt": attempt,
            "coder": {"spec": "script", "backend": "script", "reason": "r"},
            "coderErrors": problems,
            "verification": {"classification": "empty_diff", "outputTail": detail, "evidence": "no change"},
            "startedAt": float(attempt),
            "endedAt": float(attempt) + 0.5,
        },
    }


def test_the_report_says_the_sandbox_notice_once_and_each_failure_output_once() -> None:
    problems = [NOTICE, FAILED]
    detail = "The coder changed nothing." + steps.quoted(
        RunOutcome("I could not make the test pass.", problems, [])
    )
    info = {
        "id": "orc_1", "status": "not_integrated", "reason": "0 packet(s) integrated", "task": "t",
        "baseCommit": "abc",
        "packets": [{"id": "fix", "state": "parked", "coder": None, "reviewer": None,
                     "failure": f"{detail} (already re-dispatched once)"}],
        "receipts": [_attempt(1, problems, detail), _attempt(2, problems, detail)],
    }  # fmt: skip
    text = render(info)
    assert text.count("peerd confines this run") == 1, text
    assert text.count("AssertionError: add(2, 3) == -1") == 1, text
    assert text.count("I could not make the test pass.") == 2, text  # each attempt's own reply
    assert "the coder's run reported:\n      - command pytest -q failed (exit 1): E   AssertionError" in text
    assert "the coder's run reported again 1 problem(s) shown above" in text
    assert "  parked: as attempt 2 above (already re-dispatched once)" in text, text


@pytest.mark.slow
async def test_a_packet_that_changed_nothing_is_parked_with_the_coders_failed_commands(
    tmp_path: Path,
) -> None:
    repo = project_repo(tmp_path / "repo")
    failing = "python3 -c \"import sys; print('add(2, 3) gave', 2 - 3); sys.exit(3)\""  # says -1 when run
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        goal = "Fix add().\n\n" + script_steps({"run": failing}, {"reply": "The test still fails."})
        plan = [packet("fix", goal, ["calc.py"], CHECK_ADD)]
        done = await finished(client, (await start(client, project, plan=plan, coders=["script"]))["id"])
    assert done["status"] == "not_integrated"
    (fix,) = done["packets"]
    assert fix["state"] == "parked"
    assert "failed (exit 3): add(2, 3) gave -1" in fix["failure"], fix["failure"]
    (receipt,) = receipts_of(done, "implementation", "fix")
    assert any("failed (exit 3): add(2, 3) gave -1" in line for line in receipt["coderErrors"])
    text = render(done)
    assert text.count("add(2, 3) gave -1") == 1, text
    assert "the coder's run reported:" in text and "outcome empty_diff: The coder changed nothing." in text
    assert text.count("peerd confines this run") <= 1, text


# --- wording ------------------------------------------------------------------------------------


async def test_push_to_a_remote_the_checkout_lacks_says_so_plainly(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", origin=None)
    with pytest.raises(InvalidRequest) as none:
        await deliver.check_remote(repo, "origin")
    assert none.value.message == (
        f"--push origin: the checkout {repo} has no remotes. Add one with `git remote add origin URL`."
    )
    git(repo, "remote", "add", "upstream", str(tmp_path / "elsewhere.git"))
    with pytest.raises(InvalidRequest) as other:
        await deliver.check_remote(repo, "origin")
    assert other.value.message == (
        f"--push origin: the checkout {repo} has no remote called origin. Its remotes are upstream: "
        "name one of them, or add it with `git remote add origin URL`."
    )


def test_a_time_budgets_evidence_says_peerd_measured_elapsed_time() -> None:
    assert exceeded_by(Budget(seconds=30), None, 31.0) == "seconds"
    assert exceeded_by(Budget(tokens=10, seconds=30), Usage(input_tokens=11), 31.0) == "tokens"
    assert exceeded_by(Budget(seconds=30), None, 30.0) is None
    timed = steps.TurnEnded("completed", "budget exceeded: 31.0 of 30 seconds", "seconds")
    record = steps.decide_implement(a_packet(), timed)[0]
    assert isinstance(record, steps.RecordImpl) and record.verification is not None
    evidence = record.verification.evidence
    assert "elapsed time" in evidence and "whether or not the coder reports usage" in evidence
    assert "usage its runs reported" not in evidence
    tokens = steps.decide_implement(a_packet(), steps.TurnEnded("completed", "budget exceeded", "tokens"))[0]
    assert isinstance(tokens, steps.RecordImpl) and tokens.verification is not None
    assert tokens.verification.evidence == "the usage its runs reported, summed by peerd, passed the budget"


# --- checks in a fresh checkout start with the checkout's tool caches ---------------------------


def _cache(root: Path, name: str, size: int = 10, *, tagged: bool = True) -> Path:
    cache = root / name
    cache.mkdir(parents=True)
    if tagged:
        (cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n# a cache\n")
    (cache / "data").write_bytes(b"x" * size)
    return cache


async def test_a_fresh_checkout_for_a_check_starts_with_the_checkouts_tool_caches(tmp_path: Path) -> None:
    checkout, fresh = tmp_path / "checkout", tmp_path / "fresh"
    _cache(checkout, ".mypy_cache")
    _cache(checkout, ".ruff_cache")
    _cache(checkout, "target", size=checks.SEED_MAX_BYTES + 1)  # a build tree, tagged too: too big
    _cache(checkout, "build", tagged=False)  # not a cache by its own word
    (_cache(checkout, ".venv") / "pyvenv.cfg").write_text("home = /usr/bin\n")  # uv tags its venv: not copied
    (checkout / "notes.txt").write_text("a file")
    _cache(fresh, ".ruff_cache", size=3)  # the commit's own: kept as it is
    assert checks.cache_dirs(checkout) == [".mypy_cache", ".ruff_cache"]
    assert await checks.seed_caches(checkout, fresh) == [".mypy_cache"]
    assert (fresh / ".mypy_cache" / "data").read_bytes() == b"x" * 10
    assert (fresh / ".ruff_cache" / "data").read_bytes() == b"xxx"
    assert (
        not (fresh / "target").exists() and not (fresh / "build").exists() and not (fresh / ".venv").exists()
    )
    seen = await checks.run_check(fresh, "cat .mypy_cache/data")
    assert seen.passed and seen.output == "x" * 10


@pytest.mark.slow
async def test_a_packets_check_and_the_full_check_start_with_the_checkouts_caches(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    _cache(repo, ".tool_cache")  # a tool's cache in the person's checkout, not in git
    warm = "test -f .tool_cache/data"
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [
            packet("fix", "Fix add().\n\n" + script_steps(FIX_ADD), ["calc.py"], f"{CHECK_ADD} && {warm}")
        ]
        done = await finished(
            client, (await start(client, project, plan=plan, coders=["script"], verify=warm))["id"]
        )
    assert done["status"] == "completed", render(done)
    (impl,) = receipts_of(done, "implementation", "fix")
    assert impl["verification"]["passed"] and impl["verification"]["exitCode"] == 0
    assert receipts_of(done, "integration")[-1]["verification"]["passed"]
