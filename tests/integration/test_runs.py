"""Runs against real daemons: long-polls, interrupts, queues, restarts, shutdown, tools, archive, events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api.localclient import LocalClient
from peerd.core.runs import DAEMON_STOPPED, stop_reason
from peerd.daemon import Daemon
from peerd.errors import Conflict, InvalidRequest, PeerdError
from peerd.paths import Paths
from tests.helpers import (
    DaemonProcess,
    client_for,
    events_until,
    git,
    running_daemon,
    script,
    wait_status,
    wait_terminal,
)
from tests.support.eventually import eventually
from tests.support.inflight import awaiting

Json = dict[str, Any]


# --- helpers ------------------------------------------------------------------------------------


async def launch(client: LocalClient, project: Json, prompt: str, **extra: Any) -> Json:
    result: Json = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt, **extra}
    )
    return result


async def send(client: LocalClient, thread_id: str, text: str) -> Json:
    result: Json = await client.call("POST", f"/v1/threads/{thread_id}/runs", body={"text": text})
    return result


async def show_run(client: LocalClient, thread_id: str, run_id: str) -> Json:
    """The run's current status, through a zero-timeout wait."""
    result: Json = await client.call(
        "GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": 0}
    )
    return result


def held(flag: Path, *after: dict[str, Any]) -> str:
    """A script that stays live until `flag` exists, then does `after`."""
    return script({"wait_for_file": str(flag)}, *after)


def db_run(home: Path, run_id: str) -> sqlite3.Row:
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert row is not None
    return row


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command) of the non-zombie processes in a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            members.append((int(entry.name), comm))
    return members


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_handlers() -> list[asyncio.Task[Any]]:
    """Tasks of this loop currently inside `Operations.thread_wait` (the long-poll handler)."""
    return awaiting("Operations.thread_wait")


# --- 1. long-poll wait --------------------------------------------------------------------------


async def test_wait_returns_at_once_for_a_terminal_run(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"reply": "done"}))
    await wait_terminal(client, launched["threadId"], launched["runId"])
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await client.call(
        "GET", f"/v1/threads/{launched['threadId']}/wait", params={"run": launched["runId"], "timeout": 30}
    )
    assert loop.time() - start < 1.0
    assert result == {
        "threadId": launched["threadId"],
        "runId": launched["runId"],
        "status": "completed",
        "terminal": True,
        "timedOut": False,
        "hint": None,
        "awaitingApproval": None,
    }


async def test_wait_returns_when_the_run_completes(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    flag = tmp_path / "release"
    launched = await launch(client, project, held(flag, {"reply": "released"}))
    thread_id, run_id = launched["threadId"], launched["runId"]
    await wait_status(client, thread_id, run_id, "running")
    loop = asyncio.get_running_loop()
    waiting = asyncio.create_task(
        client.call("GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": 30})
    )
    await eventually(
        lambda: bool(wait_handlers()), what="the long-poll to reach the daemon", within=5.0, every=0.02
    )
    assert not waiting.done()
    released = loop.time()
    flag.touch()
    result = await asyncio.wait_for(waiting, 10)
    assert loop.time() - released < 5.0, "the wait returned with the run, not at its 30 s timeout"
    assert result["terminal"] is True and result["timedOut"] is False
    assert result["status"] == "completed" and result["runId"] == run_id


@pytest.mark.slow
async def test_wait_times_out_while_the_run_stays_live(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    flag = tmp_path / "release"
    launched = await launch(client, project, held(flag))
    thread_id, run_id = launched["threadId"], launched["runId"]
    await wait_status(client, thread_id, run_id, "running")
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await client.call("GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": 0.3})
    elapsed = loop.time() - start
    assert 0.25 <= elapsed < 3.0
    assert result["timedOut"] is True and result["terminal"] is False
    assert result["status"] == "running" and result["runId"] == run_id
    flag.touch()
    assert (await wait_terminal(client, thread_id, run_id))["status"] == "completed"


async def test_wait_longer_than_50_seconds_is_refused(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"reply": "x"}))
    with pytest.raises(InvalidRequest) as err:
        await client.call("GET", f"/v1/threads/{launched['threadId']}/wait", params={"timeout": 51})
    assert err.value.code == "invalid_request"
    assert "timeout" in err.value.message


@pytest.mark.slow
async def test_a_disconnected_long_poll_is_cancelled_on_the_server(tmp_path: Path, repo: Path) -> None:
    flag = tmp_path / "release"
    home = tmp_path / "home"
    loop = asyncio.get_running_loop()
    async with running_daemon(home) as daemon:
        async with client_for(home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            launched = await launch(client, project, held(flag))
            thread_id, run_id = launched["threadId"], launched["runId"]
            await wait_status(client, thread_id, run_id, "running")

            connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
            async with aiohttp.ClientSession(connector=connector) as raw:

                async def long_poll() -> None:
                    url = f"http://peerd/v1/threads/{thread_id}/wait"
                    async with raw.get(url, params={"run": run_id, "timeout": "10"}) as resp:
                        await resp.read()

                pending = asyncio.create_task(long_poll())
                await eventually(
                    lambda: bool(wait_handlers()),
                    what="the long-poll handler to start",
                    within=5.0,
                    every=0.02,
                )
                pending.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await pending
                await eventually(
                    lambda: not wait_handlers(),
                    what="the server to cancel the abandoned handler",
                    within=3.0,
                    every=0.02,
                )

            # The daemon still serves, long-polls included.
            status = await client.call("GET", "/v1/status")
            assert status["counts"]["liveRuns"] == 1
            short = await client.call(
                "GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": 0.1}
            )
            assert short["timedOut"] is True
            flag.touch()
            assert (await wait_terminal(client, thread_id, run_id))["status"] == "completed"
        assert not wait_handlers()
        stopping = loop.time()
    assert loop.time() - stopping < 3.0, "shutdown had no leftover handler to wait for"


# --- 2. interrupt kills the group ---------------------------------------------------------------


@pytest.mark.slow
async def test_interrupt_kills_the_whole_process_group(
    daemon: Daemon, client: LocalClient, project: Json
) -> None:
    launched = await launch(client, project, script({"run": "sleep 30"}, {"reply": "never"}))
    thread_id, run_id = launched["threadId"], launched["runId"]
    await wait_status(client, thread_id, run_id, "running")
    pgid = db_run(daemon.paths.home, run_id)["pgid"]
    assert isinstance(pgid, int) and pgid > 1
    await eventually(
        lambda: any(comm == "sleep" for _, comm in group_members(pgid)),
        what="`sleep 30` to start",
        within=5.0,
        every=0.02,
    )

    answer = await client.call("POST", f"/v1/threads/{thread_id}/interrupt", body={})
    assert answer["status"] == "interrupt_requested" and answer["runId"] == run_id
    assert answer["queueHeld"] is False
    done = await wait_terminal(client, thread_id, run_id, total=15)
    assert done["status"] == "interrupted"

    await eventually(
        lambda: not group_members(pgid), what=f"every process of group {pgid} to die", within=5.0, every=0.02
    )
    # Zombies still count for kill(2) until they are reaped (an orphaned one by init): allow for it.
    await eventually(lambda: group_gone(pgid), what=f"process group {pgid} to vanish", within=5.0, every=0.02)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    items = await client.call("GET", f"/v1/threads/{thread_id}/items")
    assert "never" not in [i["text"] for i in items["items"]]
    last = items["items"][-1]  # the interrupt leaves an item where the run stopped
    assert (last["kind"], last["text"], last["data"]) == (
        "notice",
        "Interrupted.",
        {"code": "run_interrupted"},
    )


# --- 3. the queue -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_send_during_a_live_run_queues_and_starts_after_it(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    flag = tmp_path / "release"
    first = await launch(client, project, held(flag, {"reply": "first"}))
    thread_id = first["threadId"]
    await wait_status(client, thread_id, first["runId"], "running")

    second = await send(client, thread_id, "second")
    assert second["status"] == "queued" and second["queueHeld"] is False
    assert (await show_run(client, thread_id, second["runId"]))["status"] == "queued"

    flag.touch()
    assert (await wait_terminal(client, thread_id, second["runId"]))["status"] == "completed"
    items = await client.call("GET", f"/v1/threads/{thread_id}/items")
    # Items keep the order they were written: the second prompt is recorded when it is sent.
    by_run = [(i["runId"], i["kind"], i["text"]) for i in items["items"]]
    assert by_run[1:] == [
        (second["runId"], "user_message", "second"),
        (first["runId"], "assistant_message", "first"),
        (second["runId"], "assistant_message", "(script) second"),
    ]
    page = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"limit": 100})
    order = [(e["data"]["runId"], e["data"]["status"]) for e in page["events"] if e["type"] == "run.updated"]
    assert order == [
        (first["runId"], "queued"),
        (first["runId"], "starting"),
        (first["runId"], "running"),
        (second["runId"], "queued"),
        (first["runId"], "completed"),
        (second["runId"], "starting"),
        (second["runId"], "running"),
        (second["runId"], "completed"),
    ]


@pytest.mark.slow
async def test_stop_holds_the_queue_until_the_next_send(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    flag = tmp_path / "release"
    first = await launch(client, project, held(flag))
    thread_id = first["threadId"]
    await wait_status(client, thread_id, first["runId"], "running")
    second = await send(client, thread_id, "second")
    assert second["status"] == "queued"

    stopped = await client.call("POST", f"/v1/threads/{thread_id}/interrupt", body={"stop": True})
    assert stopped["status"] == "interrupt_requested" and stopped["queueHeld"] is True
    assert (await wait_terminal(client, thread_id, first["runId"]))["status"] == "interrupted"

    # Nothing may start now: any start would be an event within milliseconds of the first run's end.
    _, cursor = await events_until(
        client,
        thread_id,
        lambda e: e["type"] == "run.updated" and e["data"]["status"] == "interrupted",
    )
    quiet = await client.call(
        "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 0.5}
    )
    assert quiet["events"] == []
    thread = await client.call("GET", f"/v1/threads/{thread_id}")
    assert thread["queueHeld"] is True
    assert (await show_run(client, thread_id, second["runId"]))["status"] == "queued"

    third = await send(client, thread_id, "third")
    assert third["queueHeld"] is False
    assert (await wait_terminal(client, thread_id, third["runId"]))["status"] == "completed"
    assert (await show_run(client, thread_id, second["runId"]))["status"] == "completed"
    page = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor})
    starts = [e["data"]["runId"] for e in page["events"] if e["data"].get("status") == "starting"]
    assert starts == [second["runId"], third["runId"]]
    thread = await client.call("GET", f"/v1/threads/{thread_id}")
    assert thread["queueHeld"] is False


@pytest.mark.slow
async def test_interrupt_without_a_live_run(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"reply": "x"}))
    await wait_terminal(client, launched["threadId"], launched["runId"])
    answer = await client.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
    assert answer["status"] == "no_active_run" and answer["runId"] is None
    assert (await show_run(client, launched["threadId"], launched["runId"]))["status"] == "completed"


# --- 4. restart after a crash -------------------------------------------------------------------


@pytest.mark.slow
async def test_a_restart_after_a_crash_marks_live_runs_interrupted(tmp_path: Path, repo: Path) -> None:
    """A person's own thread cut by a crash is interrupted, saying whose daemon stopped, with an
    error item carrying the code `daemon_stopped`; it is not continued (only owed work is)."""
    home = tmp_path / "proc-home"
    flag = tmp_path / "release"
    first = DaemonProcess(home)
    second = DaemonProcess(home)
    pgid: int | None = None
    try:
        first.start()
        await first.ready()
        async with client_for(home) as client:
            env_before = (await client.call("GET", "/v1/status"))["environmentId"]
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            launched = await launch(client, project, held(flag))
            thread_id, run_id = launched["threadId"], launched["runId"]
            await wait_status(client, thread_id, run_id, "running")
        pgid = db_run(home, run_id)["pgid"]
        assert pgid is not None and not group_gone(pgid)

        first.kill()  # SIGKILL: no shutdown code runs
        os.killpg(pgid, signal.SIGKILL)  # the orphaned scripted coder must not leak
        second.start()
        await second.ready()
        async with client_for(home) as client:
            assert (await client.call("GET", "/v1/status"))["environmentId"] == env_before
            thread = await client.call("GET", f"/v1/threads/{thread_id}")
            run = thread["latestRun"]
            assert run["id"] == run_id, "not continued: the thread is no one's delegated work"
            why = stop_reason("proc", "crash", continued=False)
            assert why == "The daemon of proc stopped while this run was live; it was interrupted."
            assert run["status"] == "interrupted" and run["reason"] == why
            items = await client.call("GET", f"/v1/threads/{thread_id}/items")
            last = items["items"][-1]
            assert (last["kind"], last["text"], last["runId"]) == ("error", why, run_id)
            assert last["data"] == {"code": DAEMON_STOPPED}
        second.signal(signal.SIGTERM)
        assert await second.exited(10) == 0
    finally:
        first.kill()
        second.kill()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


# --- 5. graceful shutdown -----------------------------------------------------------------------


@pytest.mark.slow
async def test_sigterm_answers_long_polls_interrupts_runs_and_exits_cleanly(
    tmp_path: Path, repo: Path
) -> None:
    home = tmp_path / "proc-home"
    flag = tmp_path / "never"
    first = DaemonProcess(home)
    second = DaemonProcess(home)
    pgid: int | None = None
    loop = asyncio.get_running_loop()
    try:
        first.start()
        await first.ready()
        async with client_for(home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            launched = await launch(client, project, held(flag))
            thread_id, run_id = launched["threadId"], launched["runId"]
            await wait_status(client, thread_id, run_id, "running")
            # The agent's session is its last event until the flag: after it, nothing changes.
            _, cursor = await events_until(
                client, thread_id, lambda e: e["type"] == "thread.updated" and "providerSession" in e["data"]
            )
            pgid = db_run(home, run_id)["pgid"]

            async with client_for(home) as poller:
                waiting = asyncio.create_task(
                    poller.call(
                        "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 40}
                    )
                )
                # The daemon answers requests in order on one loop: a round trip on another
                # connection after the long-poll was sent lets it arrive before the signal.
                await client.call("GET", "/v1/status")
                await client.call("GET", "/v1/status")
                assert not waiting.done()

                signalled = loop.time()
                first.signal(signal.SIGTERM)
                with pytest.raises(PeerdError) as answer:
                    await asyncio.wait_for(waiting, 10)
                assert answer.value.code == "shutting_down", "a typed answer, not a dropped connection"
                assert loop.time() - signalled < 1.0
                assert await first.exited(10) == 0
                assert loop.time() - signalled < 8.0
        assert not Paths(home).socket.exists(), "the socket file is removed on exit"
        assert group_gone(pgid)

        second.start()
        await second.ready()
        async with client_for(home) as client:
            run = (await client.call("GET", f"/v1/threads/{thread_id}"))["latestRun"]
            assert run["id"] == run_id
            assert run["status"] == "interrupted"
            assert (
                run["reason"] == "The daemon of proc shut down while this run was live; it was interrupted."
            )
        second.signal(signal.SIGTERM)
        assert await second.exited(10) == 0
    finally:
        first.kill()
        second.kill()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


# --- 6. agent tools -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_run_lists_projects_through_its_tool(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"tool": {"name": "project_list", "arguments": {}}}))
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    assert done["status"] == "completed"
    items = await client.call("GET", f"/v1/threads/{launched['threadId']}/items")
    calls = [i for i in items["items"] if i["kind"] == "tool_call"]
    assert len(calls) == 1
    assert calls[0]["text"] == "project_list"
    assert calls[0]["data"]["error"] is None
    assert [p["id"] for p in calls[0]["data"]["result"]["items"]] == [project["id"]]


async def test_a_made_up_run_token_is_refused(daemon: Daemon) -> None:
    connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as raw,
        raw.post(
            "http://peerd/v1/tools/project_list", json={}, headers={"Authorization": "Bearer nope"}
        ) as resp,
    ):
        body = await resp.json()
    assert resp.status == 403
    assert body["code"] == "parent_not_active"


@pytest.mark.slow
async def test_tool_launch_retries_are_scoped_to_the_calling_thread(
    client: LocalClient, project: Json
) -> None:
    args = {"projectId": project["id"], "prompt": "child", "clientRequestId": "c-1"}
    tool = {"tool": {"name": "thread_launch", "arguments": args, "check": True}}
    parent = await launch(client, project, script(tool, tool))
    done = await wait_terminal(client, parent["threadId"], parent["runId"])
    assert done["status"] == "completed"
    items = await client.call("GET", f"/v1/threads/{parent['threadId']}/items")
    results = [i["data"]["result"] for i in items["items"] if i["kind"] == "tool_call"]
    assert len(results) == 2
    assert results[0]["threadId"] == results[1]["threadId"]
    assert [r["replayed"] for r in results] == [False, True]
    child_id = results[0]["threadId"]

    local = await launch(client, project, "child", clientRequestId="c-1")
    assert local["threadId"] != child_id
    assert local["replayed"] is False
    listed = await client.call("GET", "/v1/threads")
    assert sorted(t["id"] for t in listed["items"]) == sorted(
        [parent["threadId"], child_id, local["threadId"]]
    )
    for thread_id in (child_id, local["threadId"]):
        assert (await wait_terminal(client, thread_id))["status"] == "completed"


# --- 7. archive ---------------------------------------------------------------------------------


async def test_archive_removes_the_worktree_and_hides_the_thread(
    client: LocalClient, project: Json, repo: Path
) -> None:
    launched = await launch(client, project, script({"write": {"path": "a.txt", "content": "a"}}))
    thread_id = launched["threadId"]
    await wait_terminal(client, thread_id, launched["runId"])
    worktree = Path(launched["worktreePath"])
    assert worktree.is_dir()

    # The run's file is untracked: archiving discards it only when forced (and says so).
    archived = await client.call("POST", f"/v1/threads/{thread_id}/archive", body={"force": True})
    assert archived == {
        "threadId": thread_id,
        "status": "archived",
        "worktreeRemoved": True,
        "branchDeleted": False,
        "discarded": ["a.txt"],
    }
    assert not worktree.exists()
    assert git(repo, "branch", "--list", f"peerd/{thread_id}").strip() != "", "the branch is kept"
    assert (await client.call("GET", f"/v1/threads/{thread_id}"))["status"] == "archived"
    default = await client.call("GET", "/v1/threads")
    assert thread_id not in [t["id"] for t in default["items"]]
    everything = await client.call("GET", "/v1/threads", params={"includeArchived": True})
    assert thread_id in [t["id"] for t in everything["items"]]

    with pytest.raises(InvalidRequest):
        await send(client, thread_id, "more")


async def test_archive_with_a_live_run_is_refused(client: LocalClient, project: Json, tmp_path: Path) -> None:
    flag = tmp_path / "release"
    launched = await launch(client, project, held(flag))
    thread_id = launched["threadId"]
    await wait_status(client, thread_id, launched["runId"], "running")
    with pytest.raises(Conflict) as err:
        await client.call("POST", f"/v1/threads/{thread_id}/archive")
    assert err.value.code == "conflict"
    thread = await client.call("GET", f"/v1/threads/{thread_id}")
    assert thread["status"] == "active"
    assert Path(launched["worktreePath"]).is_dir()
    flag.touch()
    assert (await wait_terminal(client, thread_id, launched["runId"]))["status"] == "completed"


# --- 8. the event cursor ------------------------------------------------------------------------


@pytest.mark.slow
async def test_events_read_in_order_from_a_cursor(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"reply": "hi"}))
    thread_id, run_id = launched["threadId"], launched["runId"]
    await wait_terminal(client, thread_id, run_id)

    page = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": 0})
    events = page["events"]
    assert [e["type"] for e in events] == [
        "thread.created",
        "run.updated",
        "item.added",
        "run.updated",
        "run.updated",
        "thread.updated",
        "item.added",
        "run.updated",
    ]
    statuses = [e["data"]["status"] for e in events if e["type"] == "run.updated"]
    assert statuses == ["queued", "starting", "running", "completed"]
    assert [e["data"]["kind"] for e in events if e["type"] == "item.added"] == [
        "user_message",
        "assistant_message",
    ]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert page["nextCursor"] == seqs[-1]

    # Paging by cursor gives the same events, and the cursor advances with each page.
    cursor, paged = 0, []
    while True:
        part = await client.call(
            "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "limit": 3}
        )
        if not part["events"]:
            assert part["nextCursor"] == cursor
            break
        assert part["nextCursor"] > cursor
        paged.extend(part["events"])
        cursor = part["nextCursor"]
    assert paged == events
    after = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": seqs[2]})
    assert [e["seq"] for e in after["events"]] == seqs[3:]


@pytest.mark.slow
async def test_an_events_long_poll_returns_when_a_send_arrives(client: LocalClient, project: Json) -> None:
    launched = await launch(client, project, script({"reply": "hi"}))
    thread_id = launched["threadId"]
    await wait_terminal(client, thread_id, launched["runId"])
    last = (await client.call("GET", f"/v1/threads/{thread_id}/events"))["nextCursor"]

    loop = asyncio.get_running_loop()
    polling = asyncio.create_task(
        client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": last, "timeout": 30})
    )
    quiet = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": last})
    assert quiet["events"] == [] and not polling.done()
    sent_at = loop.time()
    sent = await send(client, thread_id, "again")
    answer = await asyncio.wait_for(polling, 10)
    assert loop.time() - sent_at < 5.0
    assert answer["events"], "the long-poll returned with the new events, not at its timeout"
    assert all(e["seq"] > last for e in answer["events"])
    assert answer["events"][0]["type"] == "run.updated"
    assert answer["events"][0]["data"] == {"runId": sent["runId"], "status": "queued", "number": 2}
    assert answer["nextCursor"] == answer["events"][-1]["seq"]
    await wait_terminal(client, thread_id, sent["runId"])


@pytest.mark.slow
async def test_an_events_long_poll_returns_when_a_send_queues_behind_a_live_run(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    flag = tmp_path / "release"
    launched = await launch(client, project, held(flag))
    thread_id = launched["threadId"]
    cursor = await wait_status(client, thread_id, launched["runId"], "running")
    # The coder reports its session after `running`; after that a held run is silent.
    _, cursor = await events_until(client, thread_id, lambda e: "providerSession" in e["data"], after=cursor)
    loop = asyncio.get_running_loop()
    polling = asyncio.create_task(
        client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 30})
    )
    quiet = await client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor})
    assert quiet["events"] == [] and not polling.done()
    sent_at = loop.time()
    sent = await send(client, thread_id, "queued behind")
    assert sent["status"] == "queued"
    answer = await asyncio.wait_for(polling, 10)
    assert loop.time() - sent_at < 5.0, "a queued send wakes event long-polls at once"
    assert answer["events"][0]["data"]["runId"] == sent["runId"]
    flag.touch()
    assert (await wait_terminal(client, thread_id, sent["runId"]))["status"] == "completed"


# --- 9. in place --------------------------------------------------------------------------------


async def test_in_place_works_in_the_project_checkout(client: LocalClient, project: Json, repo: Path) -> None:
    prompt = script({"write": {"path": "in-place.txt", "content": "here\n"}})
    launched = await launch(client, project, prompt, inPlace=True)
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    assert done["status"] == "completed"
    assert Path(launched["worktreePath"]).resolve() == repo.resolve()
    assert (repo / "in-place.txt").read_text() == "here\n"
    thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["inPlace"] is True and thread["branch"] is None
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
