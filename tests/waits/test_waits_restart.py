"""A wait is owed until delivered: it survives kill -9 of the daemon that holds it (`peerd serve`
subprocesses on one home, a stub `gh` on PATH) and is delivered once after the restart; and the
delivery itself is one fenced transaction (`waits/store.py:deliver`): a second delivery, a stale
watcher or a cancelled wait wakes nobody."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, WaitsConfig
from peerd.paths import Paths
from peerd.waits import store
from tests.helpers import DaemonProcess, client_for, make_repo, running_daemon, wait_terminal
from tests.support.delegation import runs_script, wait_run_number
from tests.support.eventually import eventually
from tests.support.stubgh import StubGh, failing, pending

Json = dict[str, Any]


def wait_for(**arguments: Any) -> Json:
    return {"tool": {"name": "wait_for_github", "arguments": arguments, "check": True}}


def runs_of(home: Path, thread_id: str) -> list[sqlite3.Row]:
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute("SELECT * FROM runs WHERE thread_id = ? ORDER BY number", (thread_id,)).fetchall()


@pytest.fixture
async def proc(tmp_path: Path) -> AsyncIterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path / "proc-home")
    try:
        yield daemon
    finally:
        daemon.kill()


@pytest.mark.slow  # a `peerd serve` started twice
async def test_a_wait_survives_kill_9_and_is_delivered_once_after_the_restart(
    proc: DaemonProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gh = StubGh.install(tmp_path / "bin", monkeypatch)
    config = tmp_path / "config.toml"
    config.write_text("[waits]\npoll_seconds = 0.1\n")
    monkeypatch.setenv("PEERD_CONFIG", str(config))
    repo = make_repo(tmp_path / "repo")
    gh.play(pending())
    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        prompt = runs_script([wait_for(pr="7", until="checks"), {"reply": "waiting"}], [{"reply": "WOKEN"}])
        thread = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
        thread_id = thread["threadId"]
        await wait_terminal(client, thread_id, thread["runId"])
        [wait] = (await client.call("GET", "/v1/waits"))["items"]
        await eventually(lambda: gh.views() >= 2, what="the daemon polled the pull request")
    proc.kill()  # kill -9 while the wait is watching
    gh.play(failing())  # CI failed while the daemon was down

    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        woken = await wait_run_number(client, thread_id, 2)
        assert woken["status"] == "completed"
        done = await client.call("GET", f"/v1/waits/{wait['waitId']}")
        assert done["status"] == "delivered" and done["outcome"] == "failed"
        assert done["wokenRunId"] == woken["runId"]
        views = gh.views()
        await asyncio.sleep(0.5)  # a window in which no further poll or wake may happen
        assert gh.views() == views
        assert [r["origin"] for r in runs_of(proc.home, thread_id)] == ["user", "wake"]


async def test_a_delivery_is_one_fenced_transaction(tmp_path: Path) -> None:
    async with (
        running_daemon(
            tmp_path / "home", listen=None, settings=Config(waits=WaitsConfig(poll_seconds=3600))
        ) as d,
        client_for(d.paths.home) as client,
    ):
        thread_id, project_id = await _idle_thread(client, tmp_path)
        new = store.NewWait(
            thread_id=thread_id, run_id=None, project_id=project_id, namespace="t", request_key=None,
            request_hash="h", pr="7", until="checks", deadline_at=d.clock() + 60,
        )  # fmt: skip
        row, _ = await store.record(d.db, new, now=d.clock())
        stale = await store.claim(d.db, row.id, now=d.clock())
        token = await store.claim(d.db, row.id, now=d.clock())
        assert stale is not None and token is not None and stale != token
        assert (
            await store.deliver(d.db, row.id, stale, "passed", "", "late", snapshot=None, now=d.clock())
            is None
        )
        first = await store.deliver(d.db, row.id, token, "passed", "", "WAKE", snapshot=None, now=d.clock())
        again = await store.deliver(d.db, row.id, token, "passed", "", "WAKE", snapshot=None, now=d.clock())
        assert first is not None and first.woken_run_id is not None and again is None
        assert await store.cancel(d.db, row.id, "late", now=d.clock()) is None  # it ended once
        other, _ = await store.record(d.db, new, now=d.clock())
        claim = await store.claim(d.db, other.id, now=d.clock())
        assert claim is not None and await store.cancel(d.db, other.id, "no", now=d.clock()) is not None
        assert (
            await store.deliver(d.db, other.id, claim, "passed", "", "X", snapshot=None, now=d.clock())
            is None
        )
        wakes = [r for r in runs_of(d.paths.home, thread_id) if r["origin"] == "wake"]
        assert [w["id"] for w in wakes] == [first.woken_run_id]


async def _idle_thread(client: LocalClient, tmp_path: Path) -> tuple[str, str]:
    repo = make_repo(tmp_path / "repo")
    project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
    thread = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": "hello", "inPlace": True}
    )
    await wait_terminal(client, thread["threadId"], thread["runId"])
    return str(thread["threadId"]), str(project["id"])
