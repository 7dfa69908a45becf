"""Per-thread state that must not outlive its work (issue 26 case 11: memory grew with every
delegation). The run manager's kick locks are made per thread; an entry is kept only while a kick
holds or waits for it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)


async def test_the_run_manager_keeps_no_lock_for_a_thread_once_its_runs_ended(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home", listen=None) as daemon, client_for(daemon.paths.home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        launched = await asyncio.gather(
            *(
                c.call(
                    "POST",
                    "/v1/threads",
                    body={"projectId": project["id"], "prompt": script({"reply": str(n)})},
                )
                for n in range(6)
            )
        )
        for one in launched:
            assert (await wait_terminal(c, one["threadId"], one["runId"]))["status"] == "completed"
        await c.call(
            "POST", f"/v1/threads/{launched[0]['threadId']}/runs", body={"text": script({"reply": "again"})}
        )
        thread = await c.call("GET", f"/v1/threads/{launched[0]['threadId']}")
        assert (await wait_terminal(c, thread["id"], thread["latestRun"]["id"]))["status"] == "completed"
        assert daemon.runs is not None
        assert daemon.runs._locks == {}, "a lock kept per thread ever run grows the daemon with each one"
