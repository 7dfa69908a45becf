"""The sweep of open work in a real daemon (peerd/runtime/sweep.py): records left open with
nothing owning them (a lost write, a question whose run ended, a queue nobody started) are found
and ended or re-owned through the feature that owns each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd.approvals import store as approvals_store
from peerd.approvals.rules import Approval
from peerd.core.liveness import ORPHAN_QUESTION, ORPHAN_RUN
from peerd.store.threads.writes import new_run
from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)


async def test_the_sweep_ends_or_reowns_what_nothing_owns(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home") as daemon, client_for(daemon.paths.home) as c:
        assert daemon.db is not None and daemon.sweeper is not None
        project = await c.call("POST", "/v1/projects", body={"path": str(repo)})

        async def done_thread(reply: str) -> tuple[str, str]:
            body = {"projectId": project["id"], "prompt": script({"reply": reply})}
            launched = await c.call("POST", "/v1/threads", body=body)
            await wait_terminal(c, launched["threadId"], launched["runId"])
            return launched["threadId"], launched["runId"]

        lost, lost_run = await done_thread("one")
        asked, asked_run = await done_thread("two")
        idle, _ = await done_thread("three")
        async with daemon.db.write() as tx:
            # A run whose end was lost: recorded running, no process of this daemon runs it.
            await tx.execute("UPDATE runs SET status = 'running', ended_at = NULL WHERE id = ?", (lost_run,))
            # A queued run nobody asked the run manager to start, queued a minute ago.
            queued = await new_run(tx, idle, script({"reply": "queued and started"}), daemon.sweeper.clock())
            await tx.execute("UPDATE runs SET created_at = created_at - 60 WHERE id = ?", (queued,))
        # A question left pending by a run that ended.
        now = daemon.sweeper.clock()
        orphan = Approval(
            id="ap_orphan",
            run_id=asked_run,
            thread_id=asked,
            ask_key="s0",
            kind="command",
            tool="run",
            summary="run `true`",
            detail={"command": "true"},
            digest="d",
            created_at=now,
            deadline_at=now + 600,
        )
        await approvals_store.insert(daemon.db, orphan)

        fixes = await daemon.sweeper.once()
        assert sorted((f.action, f.id) for f in fixes) == [
            ("cut_run", lost_run),
            ("start_queue", idle),
            ("withdraw_approval", "ap_orphan"),
        ]
        cut = (await c.call("GET", f"/v1/threads/{lost}"))["latestRun"]
        assert cut["id"] == lost_run and cut["status"] == "interrupted" and cut["reason"] == ORPHAN_RUN
        record = await c.call("GET", "/v1/approvals/ap_orphan")
        assert record["status"] == "cancelled" and record["reason"] == ORPHAN_QUESTION
        started = await wait_terminal(c, idle, queued)
        assert started["status"] == "completed", started
        # Fixed once: the next sweep finds nothing.
        assert await daemon.sweeper.once() == []
