"""The report says everything the receipts hold, the integration line is accurate, and live
progress shows times, attempts, re-dispatches, retries and reviewers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from peerd.config import ProviderConfig
from peerd.orchestrate.report import pr_body, progress, render
from tests.helpers import client_for, running_daemon
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    WRONG_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    runs,
    settings,
    start,
    steps,
)

TIMES = re.compile(r"\d\d:\d\d:\d\d -> \d\d:\d\d:\d\d \(\d+\.\d s\)")
CHANGES = {"verdict": "request_changes", "summary": "Needs a docstring.",
           "evidence": [{"file": "calc.py", "line": 4, "reason": "add a docstring"}]}  # fmt: skip
APPROVE = {"verdict": "approve", "evidence": [], "summary": "Good now."}
REJECT = {"verdict": "reject", "summary": "No.", "evidence": [{"file": "calc.py", "reason": "wrong"}]}
DOCSTRING = {
    "edit": {"path": "calc.py", "old": "    return a + b", "new": '    """Sum."""\n    return a + b'}
}


async def test_the_full_check_line_says_nothing_merged_when_verify_was_given(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path, {"fix-add": [REJECT]})) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix-add", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        done = await finished(
            client, (await start(client, project, plan=plan, coders=["script"], verify=CHECK_ADD))["id"]
        )
    text = render(done)
    assert "full check: not run (nothing was merged)" in text
    assert "no --verify" not in text
    assert "nothing merged" in done["reason"]


async def test_the_report_says_everything(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    marker = tmp_path / "flaky"
    flaky = f"test -e {marker} || {{ touch {marker}; echo 'disk hiccup' >&2; exit 3; }}; {CHECK_ADD}"
    verdicts: dict[str, list[Any]] = {"fix-add": [CHANGES, APPROVE], "never": [CHANGES, CHANGES]}
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path, verdicts)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        # an unconfined coder's escape (the owner's full-access run): its edit in the user's
        # checkout, proven by its own run, and a stray file outside the packet's files
        fixed = (repo / "calc.py").read_text().replace("return a - b", "return a + b")
        escape = [
            {"write": {"path": str(repo / "calc.py"), "content": fixed}},
            {"write": {"path": str(repo / "stray.txt"), "content": "left behind\n"}},
            {"reply": "fixed"},
        ]
        goal = "Fix add().\n\n" + runs(escape, [DOCSTRING])
        info = await start(
            client,
            project,
            plan=[packet("fix-add", goal, ["calc.py"], flaky)],
            coders=["script"],
            access="full-access",
        )
        done = await finished(client, info["id"])
        # a second run: a packet parked by a second request_changes, one by a failing check
        plan = [
            packet("never", "Fix add().\n\n" + runs([FIX_ADD], [DOCSTRING]), ["calc.py"], CHECK_ADD),
            packet("broken", "Fix add().\n\n" + runs([WRONG_ADD], [{"reply": "it is fine"}]), ["calc.py"], CHECK_ADD),
        ]  # fmt: skip
        parked = await finished(
            client, (await start(client, project, plan=plan, coders=["script"], concurrency=2))["id"]
        )
    assert packets_of(done)["fix-add"]["state"] == "integrated", packets_of(done)["fix-add"]["failure"]
    text = render(done)
    for needed in (
        "implementer: script (its default model, here) - round-robin",
        "reviewer: reviewer (its default model, here) - --reviewer",
        "recovered from your checkout (the coder's own edits, proven by its run): calc.py",
        "changed in your checkout during the run, outside this packet's files, left as it is: stray.txt",
        "verification passed",
        "first run (environmental, exit 3), its output:",
        "disk hiccup",
        "the failure was the environment's",
        "review round 1 by reviewer (its default model, here)",
        "verdict request_changes: Needs a docstring.",
        "- calc.py:4: add a docstring",
        "attempt 1 (changes) by script",
        "review round 2 by reviewer",
        "verdict approve: Good now.",
        f"integration branch {done['branch']}: merged fix-add",
    ):
        assert needed in text, f"{needed!r} not in:\n{text}"
    assert len(TIMES.findall(text)) >= 5  # per attempt, per review round, and the integration
    text = render(parked)
    never = text[text.index("never: parked") :]
    assert "requested changes again" in never and "- calc.py:4: add a docstring" in never
    broken = text[text.index("broken: parked") :]
    assert "verification content" in broken and "AssertionError" in broken and "output:" in broken
    assert "exit 1, and exit 1 again when peerd re-ran it" in broken
    assert "full check: not run (no --verify)" in text


def test_a_pr_body_fences_the_report_whatever_it_holds() -> None:
    info = {"id": "orc_1", "status": "completed", "reason": None, "task": "x ```` y", "baseCommit": "abc",
            "packets": [], "receipts": []}  # fmt: skip
    body = pr_body(info)
    assert "`````text\n" in body and body.rstrip().endswith("`````")


def _info(updated: float, status: str, **packet: Any) -> dict[str, Any]:
    base = {"id": "p1", "state": "queued", "hop": None, "attempt": 0, "coder": None, "reviewer": None,
            "retries": {}, "updatedAt": updated}  # fmt: skip
    return {"status": status, "updatedAt": updated, "packets": [{**base, **packet}]}


def test_live_progress_shows_times_attempts_redispatches_retries_and_reviewers() -> None:
    idle = {"spec": "idle", "backend": "idle", "reason": "round-robin"}
    script = {"spec": "script", "backend": "script", "reason": "re-dispatched after empty_diff from idle"}
    reviewer = {
        "spec": "codex:gpt-5.5",
        "backend": "codex",
        "model": "gpt-5.5",
        "environment": "box",
        "reason": "r",
    }
    seen: dict[str, Any] = {}
    review = {"state": "reviewing", "hop": "review", "attempt": 2, "coder": script, "reviewer": reviewer}
    sequence = [
        _info(1.0, "running"),
        _info(2.0, "running", state="implementing", hop="implement", attempt=1, coder=idle),
        _info(3.0, "running", state="implementing", hop="implement", attempt=2, coder=script),
        _info(4.0, "running", state="implementing", hop="fix", attempt=2, coder=script, retries={"content": 1}),
        _info(5.0, "running", **review, retries={"content": 1}),
        _info(5.5, "running", **review, retries={"content": 1}),
    ]  # fmt: skip
    lines = [line for info in sequence for line in progress(info, seen)]
    assert all(re.match(r"\d\d:\d\d:\d\d  ", line) for line in lines)
    assert any("run running" in line for line in lines)
    assert any("attempt 1, idle (its default model, here)" in line for line in lines)
    assert any(
        "attempt 2, script" in line and "re-dispatched after empty_diff from idle" in line for line in lines
    )
    assert any("implementing (fix)" in line and "[retries: content 1/1]" in line for line in lines)
    assert any("reviewer codex:gpt-5.5 (model gpt-5.5, on box)" in line for line in lines)
    assert any(line.endswith("p1               queued") for line in lines)
    assert len(lines) == 6  # nothing repeated when nothing changed


async def test_a_model_configured_for_a_provider_is_the_one_reported(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    config = settings(tmp_path)
    codex = ProviderConfig(binary="/bin/true", model="gpt-configured-1")  # found, never run here
    config = config.model_copy(update={"providers": {**config.providers, "codex": codex}})
    async with (
        running_daemon(tmp_path / "home", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        preview = await start(client, project, task="x", coders=["codex"], dryRun=True)
        hold = tmp_path / "never"
        plan = [packet("p", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["calc.py"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], reviewer="codex")
        await client.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={})
    (coder,) = preview["coders"]
    assert (
        coder["model"] == "gpt-configured-1"
        and "model gpt-configured-1 from peerd's config" in coder["reason"]
    )
    reviewer = packets_of(info)["p"]["reviewer"]
    assert reviewer["backend"] == "codex" and reviewer["model"] == "gpt-configured-1"
    assert "reviewer: codex (model gpt-configured-1, here)" in render(info)
