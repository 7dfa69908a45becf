"""Approvals with the real CLIs across a link (issue 17's end-to-end test): a run on the box,
launched by the laptop through an `approval-required` link, asks to run commands; the laptop's
`peerd approval list` shows each one, on box; approve -> the command runs; deny -> the model reads
the reason; the deadline -> denied; the box daemon restarting while a question waits -> the
question is withdrawn (its run is gone), and the laptop's decision on it is refused. Claude Code
(stdio), Codex (app-server) and Gemini CLI (ACP), each
against the scripted fake model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from peerd.approvals import store as approvals_store
from peerd.config import ApprovalsConfig, Config
from peerd.errors import PeerdError
from tests.fakemodel import FakeModel
from tests.helpers import Pair, client_for, free_port, make_repo, running_daemon
from tests.realcli import fake_marker, offline_settings, secure_dir
from tests.support.approvals import new_approval
from tests.support.eventually import eventually

CLIS = ("claude", "codex", "gemini")


def shell(n: int) -> dict[str, Any]:
    command = f"python3 -c \"open('ran-{n}.txt', 'a').write('x')\" && echo OUT-{n}"
    return {
        "per_dialect": {
            "anthropic": {
                "tool_call": {"name": "Bash", "arguments": {"command": command, "description": "run"}}
            },
            "responses": {"tool_call": {"name": "exec_command", "arguments": {"cmd": command}}},
            "gemini": {"tool_call": {"name": "run_shell_command", "arguments": {"command": command}}},
        }
    }


SCRIPTS: dict[str, dict[str, Any]] = {
    # approved, denied, left to its deadline
    "three": {"steps": [shell(1), shell(2), shell(3), {"text": "Done."}], "fallback_text": "side request"},
    # asked before the box restarts, asked again by the run after it (Claude Code and Codex keep
    # the cut tool call in the session, so the resumed model is at step 1; Gemini CLI 0.61.0 does
    # not keep a call whose permission was pending, so its resumed model is at step 0 again)
    "again": {
        "steps": [
            shell(1),
            {"per_dialect": {"gemini": {"text": "Done."}, "default": shell(1)}},
            {"text": "Done."},
        ],
        "fallback_text": "side request",
    },
}
REASON = "DENIED-BY-ALICE: not on Fridays"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(SCRIPTS, default="three") as model:
        yield model


@asynccontextmanager
async def linked(
    tmp_path: Path,
    fake: FakeModel,
    box_home: Path,
    laptop_home: Path,
    deadline_min: float,
    listen: str = "127.0.0.1:0",
) -> AsyncIterator[Pair]:
    settings = offline_settings(tmp_path / "clis", fake)
    box_settings = settings.model_copy(update={"approvals": ApprovalsConfig(deadline_minutes=deadline_min)})
    async with (
        running_daemon(laptop_home, label="laptop", settings=Config()) as laptop,
        running_daemon(box_home, label="box", settings=box_settings, listen=listen) as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        yield Pair(laptop, box, lc, bc)


async def on_box(pair: Pair, repo: Path, cli: str, marker: str) -> dict[str, Any]:
    await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    await pair.link("approval-required")
    project = (await pair.lc.call("GET", "/v1/projects", params={"environmentId": pair.box_id}))["items"][0]
    body = {
        "projectId": project["id"],
        "prompt": f"{fake_marker(marker)} Run them.",
        "provider": cli,
        "environmentId": pair.box_id,
    }
    launched: dict[str, Any] = await pair.lc.call("POST", "/v1/threads", body=body)
    return launched


async def box_run_ended(
    pair: Pair, thread_id: str, after: str | None = None, seconds: float = 90
) -> dict[str, Any]:
    def ended(thread: dict[str, Any]) -> bool:
        run = thread["latestRun"]
        return bool(run["id"] != after and run["status"] in ("completed", "failed", "interrupted"))

    thread: dict[str, Any] = await eventually(
        lambda: pair.bc.call("GET", f"/v1/threads/{thread_id}"),
        what="the box's run ended",
        until=ended,
        within=seconds,
        every=0.2,
    )
    return thread


def model_saw(fake: FakeModel, text: str) -> bool:
    return any(text in json.dumps(r["body"]) for r in fake.requests)


@pytest.mark.parametrize("cli", CLIS)
async def test_approve_deny_and_deadline_from_the_laptop(cli: str, tmp_path: Path, fake: FakeModel) -> None:
    repo = make_repo(tmp_path / "repo")
    with secure_dir() as box_home, secure_dir() as laptop_home:
        async with linked(
            tmp_path, fake, box_home, laptop_home, deadline_min=0.12
        ) as pair:  # 7 s: the third question expires
            launched = await on_box(pair, repo, cli, "three")
            seen: set[str] = set()
            first = await new_approval(pair.lc, seen, seconds=60)
            assert first["onBox"] is True and first["environmentLabel"] == "box"
            assert "ran-1.txt" in first["detail"]["command"]
            await pair.lc.call("POST", f"/v1/approvals/{first['id']}/decision", body={"decision": "approve"})
            second = await new_approval(pair.lc, seen, seconds=60)
            assert "ran-2.txt" in second["detail"]["command"]
            await pair.lc.call(
                "POST", f"/v1/approvals/{second['id']}/decision", body={"decision": "deny", "reason": REASON}
            )
            third = await new_approval(pair.lc, seen, seconds=60)
            assert "ran-3.txt" in third["detail"]["command"]  # left alone: its deadline denies it
            thread = await box_run_ended(pair, launched["threadId"])
            worktree = Path(thread["worktreePath"])
            assert (worktree / "ran-1.txt").read_text() == "x"
            assert not (worktree / "ran-2.txt").exists() and not (worktree / "ran-3.txt").exists()
            assert model_saw(fake, REASON), "the model never read the person's reason"
            assert model_saw(fake, "before its deadline"), "the model never read why the third was refused"
            everything = (await pair.bc.call("GET", "/v1/approvals", params={"all": "true"}))["items"]
            assert sorted(a["status"] for a in everything) == ["approved", "denied", "expired"]


@pytest.mark.parametrize("cli", CLIS)
async def test_a_box_restart_while_a_question_waits_withdraws_it(
    cli: str, tmp_path: Path, fake: FakeModel
) -> None:
    """Issue 26, case 7: a question outlives no run. The box restarts while its question waits:
    the run is cut (a link's plain launch is not continued) and the question withdrawn before the
    box serves anything; a decision on it is refused there with `approval_withdrawn`, and the
    laptop's list and copy no longer hold it."""
    repo = make_repo(tmp_path / "repo")
    with secure_dir() as box_home, secure_dir() as laptop_home:
        settings = offline_settings(tmp_path / "clis", fake)
        listen = f"127.0.0.1:{free_port()}"  # the box comes back where the laptop's link knows it
        async with linked(tmp_path, fake, box_home, laptop_home, deadline_min=30, listen=listen) as pair:
            launched = await on_box(pair, repo, cli, "again")
            asked = await new_approval(pair.lc, set(), seconds=60)
        # Both daemons stopped with the question pending; the box comes back first, then the laptop.
        async with (
            running_daemon(box_home, label="box", settings=settings, listen=listen) as box,
            running_daemon(laptop_home, label="laptop", settings=Config()) as laptop,
            client_for(laptop.paths.home) as lc,
            client_for(box.paths.home) as bc,
        ):
            record = await bc.call("GET", f"/v1/approvals/{asked['id']}")
            assert record["status"] == "cancelled" and "withdrawn" in record["reason"]
            with pytest.raises(PeerdError) as refused:
                await bc.call("POST", f"/v1/approvals/{asked['id']}/decision", body={"decision": "approve"})
            assert refused.value.code == "approval_withdrawn"
            # The laptop learns it from the box: its list and its copy no longer hold the question.
            assert (await lc.call("GET", "/v1/approvals"))["items"] == []
            assert laptop.db is not None and box.identity is not None
            assert await approvals_store.mirrored(laptop.db, box.identity.env_id) == []
            with pytest.raises(PeerdError) as refused:
                await lc.call("POST", f"/v1/approvals/{asked['id']}/decision", body={"decision": "approve"})
            assert refused.value.code == "approval_not_found"
            thread = await bc.call("GET", f"/v1/threads/{launched['threadId']}")
            assert thread["latestRun"]["status"] == "interrupted"
            assert not (Path(thread["worktreePath"]) / "ran-1.txt").exists()
