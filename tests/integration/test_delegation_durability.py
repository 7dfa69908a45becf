"""Delegated tasks on a linked box survive what machines do: restarts, a kill -9, a box that is
down, a link forgotten, a thread removed there, retry storms and many open tasks at once.

Real daemons, a real link over TLS, the scripted provider on both sides. The box listens on a
fixed port chosen here, so it can be stopped and started again at the address the link stored.
Each test names, in its docstring, the rule it guards.

Waiting: children are held with `wait_for_file` and released by creating the file (in `signals`,
outside /tmp: peerd confines the box's link-started runs, whose /tmp is their own; a child says it
started with a file in its own worktree); the tests wait through long-polls (`/wait`,
`/events?timeout=`). `eventually` polls only what no event reports (a task's `stopOwed`, the
laptop's `link_backoff` row, the follower's state).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.paths import Paths
from peerd.peer.client import not_linked_message
from peerd.tasks import store as task_store
from tests.helpers import DaemonProcess, client_for, items, script, wait_terminal
from tests.support.delegation import READ_AND_REPORT, delegate, runs_script, tasks_of
from tests.support.delegation import wait_task as wait_task_unbounded
from tests.support.eventually import eventually
from tests.support.machines import (
    CHUNK_S,
    WAIT_S,
    Machines,
    delegated_and_running,
    held_child,
    link,
    m,
    setup_repos,
    signals,
    started_file,
    task_ended,
    wait_file,
    wait_run_number,
    wait_task,
)

__all__ = ["m", "signals"]  # the fixtures (tests/support/machines.py)


def backoff_row(home: Path, env_id: str) -> tuple[int, float] | None:
    """The laptop's stored backoff for a link, read from its database file (also while it is down)."""
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as db:
        row = db.execute("SELECT attempts, next_at FROM link_backoff WHERE env_id = ?", (env_id,)).fetchone()
    return None if row is None else (int(row[0]), float(row[1]))


def wake_text(task_id: str) -> str:
    return (
        f"Delegated task {task_id} reached a terminal state. "
        f"Use task_status with taskId {task_id} to read the result."
    )


# --- 1. resume at startup, one wake ----------------------------------------------------------


async def test_restart_mid_task_completes_with_the_reply_and_wakes_once(m: Machines, signals: Path) -> None:
    """Rules: resume at startup; wake after completion; wakes are never duplicated across restarts."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(
        m, script({"wait_for_file": str(hold)}, {"reply": "DONE WHILE YOU SLEPT"}), "r1"
    )
    child = task["remoteChild"]

    await m.stop("laptop")
    hold.write_text("go")  # the child ends on the box while the laptop is down
    assert (await wait_terminal(m.bc, child["threadId"], child["runId"]))["status"] == "completed"
    await m.start("laptop")

    woken = await wait_run_number(m.lc, parent, 2)
    assert woken["status"] == "completed"
    done = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert (done["status"], done["result"]) == ("completed", "DONE WHILE YOU SLEPT")
    parent_items = await items(m.lc, parent)
    wake = [i for i in parent_items if i["runId"] == woken["runId"] and i["kind"] == "user_message"]
    assert [i["text"] for i in wake] == [wake_text(task["taskId"])]
    replies = [i["text"] for i in parent_items if i["kind"] == "assistant_message"]
    assert replies[-1] == "PARENT GOT DONE WHILE YOU SLEPT"

    # One wake, also after another restart: nothing is open any more, nothing wakes again.
    await m.stop("laptop")
    await m.start("laptop")
    thread = await m.lc.call("GET", f"/v1/threads/{parent}")
    assert thread["latestRun"]["number"] == 2
    assert m.follower() is None, "no open task: no follower at start-up"


# --- 2. cancel -------------------------------------------------------------------------------


async def test_task_cancel_from_the_parent_stops_the_run_there(
    m: Machines, tmp_path: Path, signals: Path
) -> None:
    """Rule: task_cancel stops the child there (interrupt + held queue) and ends the task cancelled."""
    hold, cancel_now = signals / "hold", tmp_path / "cancel-now"
    cancel = {
        "tool": {
            "name": "task_cancel",
            "arguments": {"taskId": "${taskId}", "reason": "not needed"},
            "check": True,
        }
    }
    parent, run = await m.parent(
        runs_script(
            [
                delegate(task=held_child(hold), target={"environmentId": m.box_id}, clientRequestId="c1"),
                {"wait_for_file": str(cancel_now)},  # written once the child has started there
                cancel,
                {"reply": "CANCEL ${status}|${result}|${stopOwed}"},
            ]
        )
    )

    async def child_started() -> bool:
        tasks = await tasks_of(m.lc, parent)
        remote = tasks[0]["remoteChild"] if tasks else None
        return (
            bool(remote and remote.get("threadId")) and (await started_file(m, remote["threadId"])).exists()
        )

    await eventually(child_started, what="the box's child started", within=20)
    cancel_now.write_text("go")
    assert (await wait_terminal(m.lc, parent, run))["status"] == "completed"
    replies = [i["text"] for i in await items(m.lc, parent) if i["kind"] == "assistant_message"]
    assert "CANCEL cancelled|Cancelled: not needed|False" in replies

    [task] = await tasks_of(m.lc, parent)
    assert (task["status"], task["result"], task["stopOwed"]) == ("cancelled", "Cancelled: not needed", False)
    child = task["remoteChild"]
    there = await wait_terminal(m.bc, child["threadId"], child["runId"])
    assert there["status"] == "interrupted"
    assert (await m.bc.call("GET", f"/v1/threads/{child['threadId']}"))["queueHeld"] is True
    hold.write_text("go")


# --- 3. a stop owed while the box is down ------------------------------------------------------


@pytest.mark.parametrize("how", ["cancel", "parent_stop_and_laptop_restart"])
async def test_a_stop_while_the_box_is_down_is_delivered_when_it_returns(
    m: Machines, tmp_path: Path, how: str
) -> None:
    """Rule: stop owed. A stop that cannot reach the box is recorded as owed, retried (also after
    a restart of the laptop) and cleared once the box took it."""
    parent, task = await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "s1")
    child = task["remoteChild"]
    # Laptop first, so that nobody watches while the box's shutdown interrupts its run.
    await m.stop("laptop")
    await m.stop("box")
    await m.start("laptop")

    if how == "cancel":
        await m.lc.call("POST", f"/v1/tasks/{task['taskId']}/cancel", body={"reason": "not needed"})
        expected_status, expected_prefix = "cancelled", "Cancelled: not needed"
    else:
        await m.lc.call(
            "POST", f"/v1/threads/{parent}/interrupt", body={"stop": True, "reason": "User stopped"}
        )
        expected_status, expected_prefix = "interrupted", "Stopped with its parent: User stopped"
    ended = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert ended["status"] == expected_status
    if how == "cancel":  # a cancel tries the box at once and says it could not reach it
        assert ended["result"].startswith(f"{expected_prefix}. It could not be stopped in box yet"), ended
    else:  # a Stop leaves the delivery to the follower and never waits on the box
        assert ended["result"] == expected_prefix
    assert ended["stopOwed"] is True

    if how != "cancel":
        await m.stop("laptop")  # the owed stop must survive the laptop's restart
        await m.start("box")
        await m.start("laptop")
    else:
        await m.start("box")

    async def delivered() -> bool:
        return not (await m.lc.call("GET", f"/v1/tasks/{task['taskId']}"))["stopOwed"]

    await eventually(delivered, what="the owed stop delivered (stopOwed false)", within=20)
    there = await m.bc.call("GET", f"/v1/threads/{child['threadId']}")
    assert there["queueHeld"] is True, "the stop reached the box"
    final = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert final["result"] == ended["result"], "the stop's delivery does not change the result"

    async def follower_done() -> bool:
        follower = m.follower()
        return follower is None or follower.done

    await eventually(follower_done, what="the follower done", within=20)


# --- 4. the parent's Stop ----------------------------------------------------------------------


async def test_the_parents_stop_stops_its_remote_task(m: Machines, signals: Path) -> None:
    """Rule: a parent's Stop stops what it delegated there ("Stopped with its parent: <reason>");
    the stop is owed until the follower delivered it, and a stopped parent is not woken."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(m, held_child(hold), "p1")
    child = task["remoteChild"]
    await wait_file(m.bc, child["threadId"], await started_file(m, child["threadId"]))

    await m.lc.call("POST", f"/v1/threads/{parent}/interrupt", body={"stop": True, "reason": "User stopped"})
    stopped = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert (stopped["status"], stopped["result"]) == ("interrupted", "Stopped with its parent: User stopped")

    async def delivered() -> bool:
        return not (await m.lc.call("GET", f"/v1/tasks/{task['taskId']}"))["stopOwed"]

    await eventually(delivered, what="the owed stop delivered (stopOwed false)", within=20)
    there = await wait_terminal(m.bc, child["threadId"], child["runId"])
    assert there["status"] == "interrupted"
    box_thread = await m.bc.call("GET", f"/v1/threads/{child['threadId']}")
    assert box_thread["queueHeld"] is True
    assert box_thread["latestRun"]["reason"] == "Stopped with its parent: User stopped"
    final = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert (final["status"], final["result"]) == ("interrupted", "Stopped with its parent: User stopped")
    assert (await m.lc.call("GET", f"/v1/threads/{parent}"))["latestRun"]["number"] == 1, "no wake"
    hold.write_text("go")


# --- 5. the thread gone there ------------------------------------------------------------------


async def test_a_thread_removed_there_fails_the_task(m: Machines, tmp_path: Path) -> None:
    """Rule: a thread or run gone there is terminal: the task fails with "was not found", no retries."""
    parent, task = await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "g1")
    child = task["remoteChild"]
    await m.stop("laptop")
    # On the box: stop the thread, archive it, remove its project (which deletes its threads).
    await m.bc.call("POST", f"/v1/threads/{child['threadId']}/interrupt", body={"stop": True})
    await wait_terminal(m.bc, child["threadId"], child["runId"])
    await m.bc.call("POST", f"/v1/threads/{child['threadId']}/archive")
    await m.bc.call("DELETE", f"/v1/projects/{m.there['id']}")
    assert await m.box_threads() == []
    await m.start("laptop")

    failed = await wait_task(m.lc, parent, task["taskId"], while_status="running")
    assert failed["status"] == "failed"
    assert "was not found" in failed["result"]

    async def follower_done() -> bool:
        follower = m.follower()
        return follower is not None and follower.done

    await eventually(follower_done, what="the follower done", within=20)
    follower = m.follower()
    assert follower is not None and follower.requests == 1, "one watch told it; nothing retried"


# --- 6. the link forgotten here ------------------------------------------------------------------


async def test_forgetting_the_link_fails_the_task_and_stops_the_follower(m: Machines, tmp_path: Path) -> None:
    """Rule: a link forgotten here is terminal: the task fails with the "not linked" message and the
    follower stops (no retry storm)."""
    parent, task = await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "l1")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await m.lc.call("DELETE", f"/v1/environments/{m.box_id}")
    failed = await wait_task(m.lc, parent, task["taskId"], while_status="running")
    elapsed = loop.time() - t0
    assert failed["status"] == "failed"
    assert failed["result"] == not_linked_message(m.box_id)
    # It is noticed at the follower's next pass: at most one watch chunk later.
    assert elapsed < CHUNK_S + 2.0, elapsed

    async def follower_done() -> bool:
        follower = m.follower()
        return follower is not None and follower.done

    await eventually(follower_done, what="the follower done", within=20)
    follower = m.follower()
    assert follower is not None
    sent = follower.requests
    await asyncio.sleep(CHUNK_S)  # a storm would show as more requests within a chunk
    assert follower.requests == sent


async def test_forgetting_the_link_ends_its_tasks_at_once(m: Machines, tmp_path: Path) -> None:
    """Rule: a terminal failure ends the task at once, not after the current watch chunk."""
    assert m.laptop.followers is not None
    m.laptop.followers.watch_chunk_s = 30.0
    parent, task = await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "l2")
    await m.lc.call("DELETE", f"/v1/environments/{m.box_id}")
    failed = await asyncio.wait_for(
        wait_task_unbounded(m.lc, parent, task["taskId"], while_status="running"), 3
    )
    assert failed["result"] == not_linked_message(m.box_id)


# --- 7. first result wins ------------------------------------------------------------------------


async def test_first_result_wins_and_a_late_report_wakes_nobody(m: Machines) -> None:
    """Rule: first result wins. Completing is a compare-and-set; a second report is refused and
    creates no second wake run."""
    parent, run = await m.parent(
        runs_script(
            [
                delegate(
                    task=script({"reply": "FIRST"}), target={"environmentId": m.box_id}, clientRequestId="w1"
                )
            ],
            READ_AND_REPORT,
        )
    )
    await wait_terminal(m.lc, parent, run)
    await wait_run_number(m.lc, parent, 2)
    [task] = await tasks_of(m.lc, parent)
    assert (task["status"], task["result"]) == ("completed", "FIRST")

    assert await m.delegation.end(task["taskId"], "failed", "LATE") is None
    assert await task_store.finish(m.laptop.db, task["taskId"], "completed", "AGAIN", now=time.time()) is None
    after = await m.lc.call("GET", f"/v1/tasks/{task['taskId']}")
    assert (after["status"], after["result"], after["endedAt"]) == ("completed", "FIRST", task["endedAt"])
    thread = await m.lc.call("GET", f"/v1/threads/{parent}")
    assert thread["latestRun"]["number"] == 2, "no second wake run"


# --- 8. crashes: between record and launch, between launch and attach ------------------------------


async def test_a_crash_between_record_and_launch_leaves_one_thread_there(tmp_path: Path) -> None:
    """Rules: record before launch; resume at startup; backoff state survives a kill -9.

    The box is down when the parent delegates, so the task is committed as pending and its
    launch cannot leave; the laptop is then killed (-9). Restarted with the box back, it sends
    the launch once: exactly one thread there, followed to completion."""
    await setup_repos(tmp_path)
    boxes = Machines(tmp_path)
    laptop = DaemonProcess(tmp_path / "laptop", label="laptop")
    try:
        await boxes.start("box")
        laptop.start()
        await laptop.ready()
        async with client_for(laptop.home) as lc:
            here = await lc.call("POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")})
            there = await boxes.bc.call("POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")})
            box_id = await link(lc, boxes.bc)
            await boxes.stop("box")

            step = delegate(
                task=script({"reply": "SURVIVED"}),
                target={"environmentId": box_id, "projectId": there["id"]},
                clientRequestId="k9",
            )
            launched = await lc.call(
                "POST",
                "/v1/threads",
                body={"projectId": here["id"], "prompt": runs_script([step], READ_AND_REPORT)},
            )
            parent = launched["threadId"]
            await wait_terminal(lc, parent, launched["runId"])
            [task] = await tasks_of(lc, parent)
            assert task["status"] == "pending" and task["remoteChild"]["threadId"] is None
            assert "did not answer" in (task["lastError"] or "")

        async def backed_off() -> bool:
            return backoff_row(laptop.home, box_id) is not None

        await eventually(backed_off, what="the laptop's stored backoff for the link", within=20)
        laptop.kill()
        row = backoff_row(laptop.home, box_id)
        assert row is not None and row[0] >= 1

        await boxes.start("box")
        laptop.start()
        await laptop.ready()
        async with client_for(laptop.home) as lc:
            woken = await wait_run_number(lc, parent, 2)
            assert woken["status"] == "completed"
            done = await lc.call("GET", f"/v1/tasks/{task['taskId']}")
            assert (done["status"], done["result"]) == ("completed", "SURVIVED")
            assert len(await tasks_of(lc, parent)) == 1
        threads_there = (await boxes.bc.call("GET", "/v1/threads"))["items"]
        assert [t["id"] for t in threads_there] == [done["remoteChild"]["threadId"]]
        # The restarted laptop honoured the stored backoff: the launch left no earlier than it said.
        assert threads_there[0]["createdAt"] >= row[1] - 0.05
    finally:
        laptop.kill()
        await boxes.close()


async def test_a_crash_between_launch_and_attach_reaches_the_same_thread(m: Machines, signals: Path) -> None:
    """Rule: the idempotency key. A launch re-sent after a crash that lost the answer (simulated:
    the child's ids cleared in the laptop's store while it is down) reaches the same thread."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(
        m, script({"wait_for_file": str(hold)}, {"reply": "SAME"}), "a1"
    )
    first = task["remoteChild"]

    # Sending the launch again (the same task row) answers with the same thread and run.
    row = await task_store.get(m.laptop.db, task["taskId"])
    again = await m.delegation.launch_remote(row)
    assert (again.child_thread_id, again.child_run_id) == (first["threadId"], first["runId"])

    await m.stop("laptop")
    with contextlib.closing(sqlite3.connect(Paths(m.home("laptop")).db)) as db:
        db.execute(
            "UPDATE tasks SET child_thread_id = NULL, child_run_id = NULL, status = 'pending' WHERE id = ?",
            (task["taskId"],),
        )
        db.commit()
    await m.start("laptop")

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    reattached = await wait_task(m.lc, parent, task["taskId"], while_status="pending")
    # The attach is an event of the parent: a long-poll on its events returns with it, not at its timeout.
    assert loop.time() - t0 < 5.0
    assert reattached["status"] == "running"
    assert reattached["remoteChild"]["threadId"] == first["threadId"]
    assert reattached["remoteChild"]["runId"] == first["runId"]
    hold.write_text("go")
    done = await wait_task(m.lc, parent, task["taskId"], while_status="running")
    assert (done["status"], done["result"]) == ("completed", "SAME")
    assert [t["id"] for t in await m.box_threads()] == [first["threadId"]]


# --- 9, 10. many calls, many tasks ----------------------------------------------------------------


async def leaked_token(m: Machines, tmp_path: Path) -> tuple[str, str, Path]:
    """A parent run held open that wrote its run token to a file (a test-only step)."""
    token_file, release = tmp_path / "token.txt", tmp_path / "release-parent"
    parent, _ = await m.parent(
        script({"run": f'printf %s "$PEERD_RUN_TOKEN" > {token_file}'}, {"wait_for_file": str(release)})
    )
    await wait_file(m.lc, parent, token_file)
    return parent, token_file.read_text(), release


async def call_tools(
    m: Machines, token: str, calls: list[dict[str, Any]]
) -> list[tuple[int, dict[str, Any]]]:
    """`delegate_task` calls sent concurrently, as the parent's run."""
    connector = aiohttp.UnixConnector(path=str(m.laptop.paths.socket))
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            async with session.post(
                "http://peerd/v1/tools/delegate_task", json=arguments, headers=headers
            ) as resp:
                return resp.status, await resp.json()

        return list(await asyncio.gather(*(one(a) for a in calls)))


async def test_a_retry_storm_is_one_task_and_one_thread_there(m: Machines, tmp_path: Path) -> None:
    """Rule: the idempotency key. 20 concurrent identical delegate_task calls (one clientRequestId)
    from one run are one task here and one thread there."""
    parent, token, release = await leaked_token(m, tmp_path)
    call = {
        "task": script({"reply": "ONE"}),
        "target": {"environmentId": m.box_id},
        "clientRequestId": "storm",
    }
    answers = await call_tools(m, token, [call] * 20)
    assert {status for status, _ in answers} == {200}, answers
    assert len({body["result"]["taskId"] for _, body in answers}) == 1
    [task] = await tasks_of(m.lc, parent)
    done = await task_ended(m.lc, parent, task["taskId"])
    assert (done["status"], done["result"]) == ("completed", "ONE")
    assert len(await m.box_threads()) == 1
    release.write_text("go")


OPEN_TASKS = 200


async def test_many_open_tasks_share_one_poll_per_chunk(
    m: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: one follower per link; idle traffic is O(links), not O(tasks). 200 open tasks on one
    link: the box's subscription holds all their runs, the follower sends one change-feed poll per
    chunk that names none of them, and nothing else while idle. (Their 200 concurrent delegations
    also guard read-your-writes in the store: each launch there reads back the thread it just
    committed.)"""
    parent, token, _ = await leaked_token(m, tmp_path)
    child = script({"wait_for_file": str(tmp_path / "never")})
    calls = [
        {
            "task": child,
            "target": {"environmentId": m.box_id, "projectId": m.there["id"]},
            "clientRequestId": f"n{i}",
        }
        for i in range(OPEN_TASKS)
    ]
    answers = await call_tools(m, token, calls)
    assert {status for status, _ in answers} == {200}, [b for s, b in answers if s != 200][:3]
    assert {body["result"]["status"] for _, body in answers} == {"running"}
    follower = m.follower()
    assert follower is not None

    async def subscribed() -> bool:  # the new tasks joined the subscription, coalesced
        return follower.machine.sub.settled and len(follower.machine.sub.want) == OPEN_TASKS

    await eventually(subscribed, what="every open task in the settled subscription", within=20)
    assert follower.syncs < OPEN_TASKS / 4, "changes are coalesced, not one request per task"
    sent: list[tuple[str, dict[str, Any]]] = []
    forwarder = m.delegation.forwarder
    real_call = forwarder.call

    async def spy(env_id: str, method: str, path: str, **kw: Any) -> Any:
        sent.append((path, kw.get("body") or {}))
        return await real_call(env_id, method, path, **kw)

    monkeypatch.setattr(forwarder, "call", spy)
    assert m.laptop.followers is not None
    m.laptop.followers.watch_chunk_s = 2.0  # the box answers each poll after 1 s (the chunk less its margin)
    await asyncio.sleep(5.0)  # the quantity measured is requests per unit of idle time
    polls = [body for path, body in sent if path == "/v1/feed/changes"]
    assert 2 <= len(polls) <= 6, sent
    assert [path for path, _ in sent if path != "/v1/feed/changes"] == [], "nothing but polls while idle"
    assert all(set(body) <= {"cursor", "timeout"} for body in polls), "a poll names no run"
    ended = [(t["status"], t["result"]) for t in await tasks_of(m.lc, parent) if t["status"] != "running"]
    assert ended == []
    box = m._daemons["box"]
    assert box.followers is not None
    hub = box.followers.delegation.ender.watcher.hub
    [link] = hub._links.values()
    assert len(link.state.runs) == OPEN_TASKS, "the box follows every run for the link"


async def test_the_follower_stops_even_while_it_abandons_a_long_poll(
    m: Machines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: shutdown never hangs on a follower. A stop that lands while the follower waits for an
    abandoned long-poll to finish cancelling must stop it, not be taken for that poll's cancel."""
    await delegated_and_running(m, script({"wait_for_file": str(tmp_path / "never")}), "q1")
    polling, cancelling = asyncio.Event(), asyncio.Event()
    forwarder = m.delegation.forwarder
    real_call = forwarder.call

    async def slow_to_cancel(env_id: str, method: str, path: str, **kw: Any) -> Any:
        if path != "/v1/feed/changes":
            return await real_call(env_id, method, path, **kw)
        polling.set()
        try:
            await asyncio.Event().wait()  # a long-poll that never answers
        except asyncio.CancelledError:
            cancelling.set()
            await asyncio.sleep(1.0)  # closing the connection takes a moment
            raise

    monkeypatch.setattr(forwarder, "call", slow_to_cancel)
    await asyncio.wait_for(polling.wait(), WAIT_S)  # the next poll goes to the spy
    # It is never answered: at its deadline (one chunk) the follower abandons it and waits for it to end.
    await asyncio.wait_for(cancelling.wait(), WAIT_S)
    follower = m.follower()
    assert follower is not None
    stopping = asyncio.ensure_future(follower.stop())
    done, _ = await asyncio.wait({stopping}, timeout=3.0)  # the spy's cancel takes 1 s
    if stopping not in done:  # hung: a second cancel gets through, so the daemon can shut down
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
    assert stopping in done, "the stop was taken for the abandoned poll's cancel and swallowed"
    assert follower.done


# --- 11. the child's own delegated work ----------------------------------------------------------


async def test_a_remote_child_with_its_own_task_completes_after_that_task(m: Machines, signals: Path) -> None:
    """Rule: a remote thread with delegated work of its own is complete only when that work settled
    and its wake run ended; the result is that wake run's final reply."""
    hold = signals / "hold"
    grandchild = script({"wait_for_file": str(hold)}, {"reply": "GRANDCHILD DONE"})
    child = runs_script(
        [delegate(task=grandchild, clientRequestId="g"), {"reply": "FIRST REPLY"}],
        [
            {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
            {"reply": "FINAL ${result}"},
        ],
    )
    parent, task = await delegated_and_running(m, child, "n1")
    remote = task["remoteChild"]
    assert (await wait_terminal(m.bc, remote["threadId"], remote["runId"]))["status"] == "completed"

    # The box's first run ended, but the box does not call it settled: its own task is open.
    box = m.laptop.peers
    assert box is not None
    watch = await box.call(
        m.box_id,
        "POST",
        "/v1/watch",
        body={"runs": [{"threadId": remote["threadId"], "runId": remote["runId"]}], "timeout": 0},
    )
    assert [r["settled"] for r in watch["runs"]] == [False]
    assert (await m.lc.call("GET", f"/v1/tasks/{task['taskId']}"))["status"] == "running"

    hold.write_text("go")
    done = await wait_task(m.lc, parent, task["taskId"], while_status="running")
    assert (done["status"], done["result"]) == ("completed", "FINAL GRANDCHILD DONE")
    box_thread = await m.bc.call("GET", f"/v1/threads/{remote['threadId']}")
    assert box_thread["latestRun"]["number"] == 2
    woken = await wait_run_number(m.lc, parent, 2)
    assert woken["status"] == "completed"


# --- 12. backoff persists ----------------------------------------------------------------------


async def test_backoff_is_stored_honoured_after_a_restart_and_cleared_on_success(m: Machines) -> None:
    """Rule: transient failures back off, and the backoff state survives restarts: stored after a
    failed pass (attempts >= 1, next try in the future), honoured by a restarted laptop, removed
    after a pass succeeds."""
    await m.stop("box")
    step = delegate(
        task=script({"reply": "BACK"}),
        target={"environmentId": m.box_id, "projectId": m.there["id"]},
        clientRequestId="b1",
    )
    parent, run = await m.parent(runs_script([step]))
    await wait_terminal(m.lc, parent, run)
    [task] = await tasks_of(m.lc, parent)
    assert task["status"] == "pending"

    async def backed_off() -> bool:
        return await task_store.backoff(m.laptop.db, m.box_id) != (0, 0.0)

    await eventually(backed_off, what="the laptop's stored backoff for the link", within=20)
    attempts, next_at = await task_store.backoff(m.laptop.db, m.box_id)
    assert attempts >= 1 and next_at > time.time()

    await m.stop("laptop")
    assert backoff_row(m.home("laptop"), m.box_id) == (attempts, next_at)
    await m.start("box")
    await m.start("laptop")
    done = await task_ended(m.lc, parent, task["taskId"])
    assert (done["status"], done["result"]) == ("completed", "BACK")
    [there] = await m.box_threads()
    assert there["createdAt"] >= next_at - 0.05, "the restarted laptop waited for the stored next try"

    async def cleared() -> bool:
        return await task_store.backoff(m.laptop.db, m.box_id) == (0, 0.0)

    await eventually(cleared, what="the stored backoff cleared", within=20)
