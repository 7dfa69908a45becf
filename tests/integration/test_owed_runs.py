"""Owed until done: runs a stop or a crash of the daemon cut go on after the restart; a store that
cannot be written holds a run instead of ending it; SIGTERM answers every request, typed.

Real daemons (`peerd serve` subprocesses for kill -9 and SIGTERM, in-process ones for the link),
the scripted provider. Runs are held with `wait_for_file` on a file in their worktree and
followed through long-polls; `wait_status` follows a thread's events. Each test names the rule it
guards in its docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config
from peerd.core.runs import CONTINUE_NOTE, DAEMON_STOPPED
from peerd.errors import PeerdError
from peerd.paths import Paths
from tests.helpers import (
    DaemonProcess,
    client_for,
    events_until,
    running_daemon,
    script,
    wait_status,
    wait_terminal,
)
from tests.realcli import signal_dir
from tests.support.delegation import delegate, runs_script
from tests.support.machines import Machines, link, setup_repos, started_file, wait_file

Json = dict[str, Any]
WAIT_S = 30.0  # a broken rule fails a test after this long instead of hanging it


def runs_of(home: Path, thread_id: str) -> list[sqlite3.Row]:
    """The thread's runs as stored (origin and `continues` are not on the wire)."""
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute("SELECT * FROM runs WHERE thread_id = ? ORDER BY number", (thread_id,)).fetchall()


async def run_items(client: LocalClient, thread_id: str, run_id: str) -> list[Json]:
    page = await client.call("GET", f"/v1/threads/{thread_id}/items", params={"runId": run_id})
    return list(page["items"])


async def wait_run(client: LocalClient, thread_id: str, number: int) -> Json:
    """Until the thread's run `number` exists and ended; that run as the thread shows it."""

    def found(event: Json) -> bool:
        return event["type"] == "run.updated" and event["data"].get("number") == number

    async def follow() -> Json:
        thread = await client.call("GET", f"/v1/threads/{thread_id}")
        if thread["latestRun"]["number"] < number:
            await events_until(client, thread_id, found, total=WAIT_S)
            thread = await client.call("GET", f"/v1/threads/{thread_id}")
        latest = thread["latestRun"]
        assert latest["number"] == number, latest
        done = await wait_terminal(client, thread_id, latest["id"])
        assert done["terminal"], done
        return dict((await client.call("GET", f"/v1/threads/{thread_id}"))["latestRun"])

    return await asyncio.wait_for(follow(), WAIT_S)


async def steps_started(client: LocalClient, thread_id: str, *, not_run: str | None = None) -> None:
    """Until a run of the thread (not `not_run`) reported a command: its agent is at its steps."""

    def found(event: Json) -> bool:
        data = event["data"]
        return event["type"] == "item.added" and data["kind"] == "command" and data["runId"] != not_run

    await events_until(client, thread_id, found, total=WAIT_S)


def reap(pgid: int | None) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


async def stop_daemon(proc: DaemonProcess, how: str, pgid: int | None) -> None:
    if how == "kill":
        proc.kill()  # SIGKILL: no shutdown code runs
        reap(pgid)  # the orphaned scripted coder must not leak
    else:
        proc.signal(signal.SIGTERM)
        assert await proc.exited() == 0


@pytest.fixture
def signals() -> Iterator[Path]:
    """Files a box's confined runs can see (read-only): outside /tmp and peerd's homes."""
    with signal_dir() as path:
        yield path


@pytest.fixture
async def proc(tmp_path: Path) -> AsyncIterator[DaemonProcess]:
    daemon = DaemonProcess(tmp_path / "proc-home")
    try:
        yield daemon
    finally:
        daemon.kill()


# --- 1. a cut wake runs again -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["kill", "sigterm"])
async def test_a_wake_run_cut_by_a_crash_or_a_stop_runs_again_in_its_session_once(
    proc: DaemonProcess, repo: Path, how: str
) -> None:
    """Rule: a wake is owed until a wake run finishes. The cut wake run is interrupted, saying
    whose daemon stopped; a continuation (origin `continue`, naming it) is recorded with the cut,
    carries the wake's message, resumes the session (the script's next entry) and completes; no
    later restart runs it again."""
    parent_script = runs_script(
        [delegate(task=script({"reply": "CHILD DONE"}), clientRequestId="k1"), {"reply": "delegated"}],
        # The wake run: says it started its steps (a command item), then is held until it is cut.
        [{"run": "printf started > wake-started"}, {"wait_for_file": "release-wake"}],
        [
            {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
            {"reply": "CONTINUED WITH ${result}"},
        ],
    )
    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        launched = await client.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": parent_script}
        )
        parent = launched["threadId"]
        assert (await wait_terminal(client, parent, launched["runId"]))["status"] == "completed"
        await steps_started(client, parent, not_run=launched["runId"])
    wake = runs_of(proc.home, parent)[1]
    assert (wake["origin"], wake["status"]) == ("wake", "running")
    await stop_daemon(proc, how, wake["pgid"])

    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        continued = await wait_run(client, parent, 3)
        assert continued["status"] == "completed", continued
        cut = runs_of(proc.home, parent)[1]
        verb = "stopped" if how == "kill" else "shut down"
        assert cut["status"] == "interrupted"
        assert cut["reason"] == (
            f"The daemon of proc {verb} while this run was live; it goes on in a new run after the restart."
        )
        cut_items = await run_items(client, parent, cut["id"])
        assert cut_items[-1]["kind"] == "error" and cut_items[-1]["data"] == {"code": DAEMON_STOPPED}
        row = runs_of(proc.home, parent)[2]
        assert (row["origin"], row["continues"]) == ("continue", cut["id"])
        items = await run_items(client, parent, continued["id"])
        prompt = items[0]["text"]
        assert prompt.startswith(CONTINUE_NOTE) and prompt.endswith(wake["prompt"]), prompt
        assert items[-1]["text"] == "CONTINUED WITH CHILD DONE"
    proc.signal(signal.SIGTERM)
    assert await proc.exited() == 0

    proc.start()  # nothing is owed any more: nothing runs again
    await proc.ready()
    async with client_for(proc.home) as client:
        assert (await client.call("GET", f"/v1/threads/{parent}"))["latestRun"]["number"] == 3
    assert len(runs_of(proc.home, parent)) == 3


# --- 2. a cut delegated child goes on (a box setting) -------------------------------------------


@pytest.mark.parametrize(("setting", "how"), [(True, "sigterm"), (True, "kill"), (False, "sigterm")])
async def test_a_local_child_cut_by_a_stop_goes_on_after_the_restart_unless_the_setting_is_off(
    proc: DaemonProcess, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: bool, how: str
) -> None:
    """Rules: a delegated child cut by a daemon stop is continued in its session
    (`continue_cut_runs`, on by default) and its task completes with the continuation's reply,
    waking the parent once; with the setting off the task ends interrupted, naming whose daemon
    stopped."""
    config = tmp_path / "config.toml"
    config.write_text(f"continue_cut_runs = {str(setting).lower()}\n")
    monkeypatch.setenv("PEERD_CONFIG", str(config))
    child = runs_script(
        [{"run": "printf started > started"}, {"wait_for_file": "release-child"}],
        [{"reply": "CHILD WENT ON"}],
    )
    parent_script = runs_script(
        [delegate(task=child, clientRequestId="k1"), {"reply": "delegated"}],
        [
            {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
            {"reply": "PARENT GOT ${status}: ${result}"},
        ],
    )
    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        launched = await client.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": parent_script}
        )
        parent = launched["threadId"]
        assert (await wait_terminal(client, parent, launched["runId"]))["status"] == "completed"
        [task] = (await client.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
        child_thread = task["childThreadId"]
        await steps_started(client, child_thread)
    await stop_daemon(proc, how, runs_of(proc.home, child_thread)[0]["pgid"])

    proc.start()
    await proc.ready()
    async with client_for(proc.home) as client:
        woken = await wait_run(client, parent, 2)
        assert woken["status"] == "completed"
        done = await client.call("GET", f"/v1/tasks/{task['taskId']}")
        children = runs_of(proc.home, child_thread)
        if setting:
            assert (done["status"], done["result"]) == ("completed", "CHILD WENT ON")
            assert [(r["origin"], r["status"]) for r in children] == [
                ("user", "interrupted"),
                ("continue", "completed"),
            ]
        else:
            why = "The daemon of proc shut down while this run was live; it was interrupted."
            assert (done["status"], done["result"]) == ("interrupted", why)
            assert [(r["origin"], r["status"]) for r in children] == [("user", "interrupted")]
        assert len(runs_of(proc.home, parent)) == 2, "the parent is woken once"


class BoxSettings(Machines):
    """Machines whose box runs with these settings (the laptop with the defaults)."""

    def __init__(self, tmp: Path, box: Config) -> None:
        super().__init__(tmp)
        self.box_settings = box

    async def start(self, side: str) -> None:
        if side == "laptop":
            await super().start(side)
            return
        stack = contextlib.AsyncExitStack()
        try:
            cm = running_daemon(
                self.home(side), label="box", listen=self.box_listen, settings=self.box_settings
            )
            self._daemons[side] = await stack.enter_async_context(cm)
            self._clients[side] = await stack.enter_async_context(client_for(self.home(side)))
        except BaseException:
            await stack.aclose()
            raise
        self._stacks[side] = stack


@pytest.mark.parametrize("setting", [True, False])
async def test_a_remote_child_cut_by_the_box_goes_on_and_the_laptop_follows_it(
    tmp_path: Path, signals: Path, setting: bool
) -> None:
    """Rules: a child cut by a stop of the box's daemon is continued there after the restart and
    the laptop's follower takes the continuation as the child's work (its reply is the result);
    with `continue_cut_runs = false` on the box the task ends interrupted, saying the box stopped."""
    await setup_repos(tmp_path)
    m = BoxSettings(tmp_path, Config(continue_cut_runs=setting))
    try:
        await m.start("box")
        await m.start("laptop")
        m.here = await m.lc.call("POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")})
        m.there = await m.bc.call("POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")})
        m.box_id = await link(m.lc, m.bc)
        child = runs_script(
            [{"run": "printf started > started"}, {"wait_for_file": str(signals / "never")}],
            [{"reply": "BOX WENT ON"}],
        )
        parent, run = await m.parent(
            runs_script(
                [delegate(task=child, target={"environmentId": m.box_id}, clientRequestId="r1")],
                [
                    {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
                    {"reply": "PARENT GOT ${result}"},
                ],
            )
        )
        assert (await wait_terminal(m.lc, parent, run))["status"] == "completed"
        [task] = (await m.lc.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
        there = task["remoteChild"]
        await wait_file(m.bc, there["threadId"], await started_file(m, there["threadId"]))

        await m.stop("box")
        await m.start("box")
        woken = await wait_run(m.lc, parent, 2)
        assert woken["status"] == "completed"
        done = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
        if setting:
            assert (done["status"], done["result"]) == ("completed", "BOX WENT ON")
        else:
            why = "The daemon of box shut down while this run was live; it was interrupted."
            assert (done["status"], done["result"]) == ("interrupted", why)
        assert len(runs_of(m.home("laptop"), parent)) == 2, "the parent is woken once"
    finally:
        await m.close()


# --- 3. a store that cannot be written holds a run, never ends it ------------------------------


async def test_a_run_whose_writes_fail_is_finished_when_the_store_works_again(
    tmp_path: Path, repo: Path
) -> None:
    """Rule: nothing stays `running` forever. With the store full (SQLite's `max_page_count`),
    the run's next writes (its reply, its end) fail; the runner retries them with backoff and the
    run ends completed, with its reply, once the store has room again, without a restart."""
    async with running_daemon(tmp_path / "home") as daemon, client_for(daemon.paths.home) as client:
        assert daemon.runs is not None and daemon.db is not None
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        reply = {"reply_repeat": {"text": "full ", "times": 60_000}}  # 300 KB: many new pages
        launched = await client.call(
            "POST",
            "/v1/threads",
            body={"projectId": project["id"], "prompt": script({"wait_for_file": "go"}, reply)},
        )
        thread_id, run_id = launched["threadId"], launched["runId"]
        await wait_status(client, thread_id, run_id, "running")
        writer = daemon.db._w
        pages = (await (await writer.execute("PRAGMA page_count")).fetchone())[0]  # type: ignore[index]
        await writer.execute(f"PRAGMA max_page_count = {pages}")
        worktree = Path((await client.call("GET", f"/v1/threads/{thread_id}"))["worktreePath"])
        (worktree / "go").write_text("go")

        await asyncio.wait_for(daemon.runs.store_fault.wait(), WAIT_S)
        shown = await client.call(
            "GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": 0}
        )
        assert shown["status"] == "running", "held, not ended, while the store is full"
        await writer.execute("PRAGMA max_page_count = 1073741823")

        done = await wait_terminal(client, thread_id, run_id)
        assert done["status"] == "completed", done
        items = await run_items(client, thread_id, run_id)
        assert [i["kind"] for i in items][-1] == "assistant_message"
        assert items[-1]["textLength"] == 300_000
        assert daemon.runs.store_retries >= 1


# --- 4. SIGTERM answers every request, typed -----------------------------------------------------


async def test_sigterm_answers_a_forwarded_wait_with_shutting_down_and_exits_fast(
    tmp_path: Path, repo: Path, signals: Path
) -> None:
    """Rule: on SIGTERM a forwarded long-poll (a wait on the box, through the laptop) is answered
    with the typed `shutting_down` error within a second, and the laptop, with no live runs,
    exits at once."""
    loop = asyncio.get_running_loop()
    laptop = DaemonProcess(tmp_path / "laptop", label="laptop")
    async with running_daemon(tmp_path / "box", label="box") as box, client_for(box.paths.home) as bc:
        try:
            laptop.start()
            await laptop.ready()
            async with client_for(laptop.home) as lc, client_for(laptop.home) as poller:
                box_id = await link(lc, bc)
                project = await bc.call("POST", "/v1/projects", body={"path": str(repo)})
                prompt = script({"wait_for_file": str(signals / "never")})
                held = await lc.call(
                    "POST",
                    "/v1/threads",
                    body={"projectId": project["id"], "prompt": prompt, "environmentId": box_id},
                )
                waiting = asyncio.create_task(
                    poller.call(
                        "GET",
                        f"/v1/threads/{held['threadId']}/wait",
                        params={"run": held["runId"], "timeout": 40, "environmentId": box_id},
                    )
                )
                # Requests are answered in order on one loop: two round trips on another
                # connection after the wait was sent let it reach the laptop first.
                await lc.call("GET", "/v1/status")
                await lc.call("GET", "/v1/status")
                assert not waiting.done()

                signalled = loop.time()
                laptop.signal(signal.SIGTERM)
                with pytest.raises(PeerdError) as answer:
                    await asyncio.wait_for(waiting, 10)
                answered = loop.time() - signalled
                assert answer.value.code == "shutting_down"
                assert await laptop.exited(10) == 0
                exited = loop.time() - signalled
            print(
                f"\nSIGTERM with a forwarded wait: answered after {answered:.2f} s, exited after {exited:.2f} s"
            )
            assert answered < 1.0, f"the forwarded wait was answered {answered:.2f} s after SIGTERM"
            assert exited < 2.0, f"the laptop took {exited:.2f} s to exit"
            assert (await bc.call("GET", f"/v1/threads/{held['threadId']}"))["latestRun"][
                "status"
            ] == "running"
        finally:
            laptop.kill()
