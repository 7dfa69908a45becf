"""`peerd wait list|show|cancel`, the real command line against a daemon holding a wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peerd.config import Config, WaitsConfig
from tests.helpers import client_for, make_repo, running_daemon, wait_terminal
from tests.support.cli import ok, peerd
from tests.support.delegation import runs_script
from tests.support.eventually import eventually
from tests.support.stubgh import StubGh, pending

pytestmark = pytest.mark.slow  # a few `peerd` processes, over half a second


async def test_wait_list_show_and_cancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gh = StubGh.install(tmp_path / "bin", monkeypatch)
    gh.play(pending())
    settings = Config(waits=WaitsConfig(poll_seconds=0.05))
    async with (
        running_daemon(tmp_path / "home", listen=None, settings=settings) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        home = daemon.paths.home
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        step = {
            "tool": {"name": "wait_for_github", "arguments": {"pr": "7", "until": "review"}, "check": True}
        }
        prompt = runs_script([step, {"reply": "ok"}], [{"reply": "WOKEN"}])
        thread = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
        await wait_terminal(client, thread["threadId"], thread["runId"])
        await eventually(lambda: gh.views() >= 1, what="a first poll")

        [wait_id] = ok(await peerd(home, "wait", "list", "-q")).split()
        table = ok(await peerd(home, "wait", "list", "--status", "watching"))
        assert wait_id in table and "review" in table and "watching" in table
        shown = ok(await peerd(home, "wait", "show", wait_id))
        assert "pull request" in shown and "build" in shown  # the checks at the last poll
        listed = json.loads(ok(await peerd(home, "wait", "list", "--json", "waitId,status")))
        assert listed == [{"waitId": wait_id, "status": "watching"}]
        done = ok(await peerd(home, "wait", "cancel", wait_id, "--reason", "merged by hand", "--yes"))
        assert f"{wait_id} cancelled: merged by hand" in done
        bad = await peerd(home, "wait", "list", "--status", "sleeping")
        assert bad.returncode == 2 and "is not a wait status" in bad.stderr
        missing = await peerd(home, "wait", "show", "wt_nope")
        assert missing.returncode != 0 and "wait_not_found" in missing.stderr
