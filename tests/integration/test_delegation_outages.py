"""Delegated tasks through outages: a refused route, a black hole, a failing store.

Real daemons, a real link over TLS through `tests/faultproxy.py` (the box advertises the proxy's
address, so the link stores it), the scripted provider on both sides. Each test names the rule
it guards in its docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from peerd.errors import StorageUnavailable
from peerd.paths import Paths
from peerd.tasks import store as task_store
from peerd.tasks.rules import LINK_BACKOFF
from tests.faultproxy import FaultProxy
from tests.helpers import client_for, free_port, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.delegation import delegate, runs_script, tasks_of
from tests.support.eventually import eventually
from tests.support.machines import (
    CHUNK_S,
    Machines,
    delegated_and_running,
    held_child,
    setup_repos,
    started,
    started_file,
    task_ended,
    wait_file,
    wait_run_number,
)

pytestmark = pytest.mark.slow  # two daemons

SETTLE_S = 5.0  # results arrive within this long of the first successful contact after an outage


class Proxied(Machines):
    """`Machines` whose link runs through a FaultProxy in front of the box's listener."""

    def __init__(self, tmp: Path, proxy: FaultProxy) -> None:
        super().__init__(tmp)
        self.proxy = proxy

    async def start(self, side: str) -> None:
        if side != "box":
            await super().start(side)
            return
        stack = contextlib.AsyncExitStack()
        try:
            cm = running_daemon(
                self.home(side), label="box", listen=self.box_listen, advertise=(self.proxy.url,)
            )
            self._daemons[side] = await stack.enter_async_context(cm)
            self._clients[side] = await stack.enter_async_context(client_for(self.home(side)))
        except BaseException:
            await stack.aclose()
            raise
        self._stacks[side] = stack


@pytest.fixture
async def pm(tmp_path: Path) -> AsyncIterator[Proxied]:
    """A laptop linked through a fault proxy to a box (`auto`); both clone one origin."""
    await setup_repos(tmp_path)
    box_port = free_port()
    async with FaultProxy(box_port) as proxy:
        machines = Proxied(tmp_path, proxy)
        machines.box_listen = f"127.0.0.1:{box_port}"
        async with started(machines, tmp_path):
            yield machines


@pytest.fixture
def signals() -> Any:
    with signal_dir() as path:
        yield path


def store_backoff(home: Path, env_id: str, *, attempts: int, next_at: float) -> None:
    """Write the link's backoff into a stopped laptop's store: a long outage happened before."""
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as db:
        db.execute(
            "INSERT OR REPLACE INTO link_backoff (env_id, attempts, next_at, last_error) VALUES (?, ?, ?, ?)",
            (env_id, attempts, next_at, "box did not answer."),
        )
        db.commit()


# --- recover as soon as the box answers ---------------------------------------------------------------


@pytest.mark.parametrize("first_contact", ["forwarded_call", "new_task"])
async def test_after_an_outage_results_arrive_within_5_s_of_the_first_answer(
    pm: Proxied, signals: Path, first_contact: str
) -> None:
    """Rule: any successful exchange with the box ends the link's backoff and wakes its follower.

    The route refuses connections; the laptop restarts meanwhile with a backoff of 5 minutes
    stored (a long outage); the child finishes on the box. When the route is back, the first
    forwarded call (or a new task's launch) reaches the box, and the result is delivered within
    5 s of it, not when the stored backoff ends."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(pm, held_child(hold, "DONE IN THE OUTAGE"), "o1")
    await pm.proxy.refuse()
    await pm.stop("laptop")
    store_backoff(pm.home("laptop"), pm.box_id, attempts=9, next_at=time.time() + 300)
    await pm.start("laptop")
    hold.write_text("go")
    child = task["remoteChild"]
    assert (await wait_terminal(pm.bc, child["threadId"], child["runId"]))["status"] == "completed"
    assert (await pm.lc.call("GET", f"/v1/tasks/{task['taskId']}"))["status"] == "running"

    await pm.proxy.forward()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    if first_contact == "forwarded_call":
        projects = await pm.lc.call("GET", "/v1/projects", params={"environmentId": pm.box_id})
        assert [p["id"] for p in projects["items"]] == [pm.there["id"]]
        new_task = None
    else:
        step = delegate(
            task=script({"reply": "NEW"}), target={"environmentId": pm.box_id}, clientRequestId="o2"
        )
        new_parent, new_run = await pm.parent(runs_script([step]))
        await wait_terminal(pm.lc, new_parent, new_run)
        [new_task] = await tasks_of(pm.lc, new_parent)
        assert new_task["remoteChild"]["threadId"], "the launch went through at once"
    done = await asyncio.wait_for(task_ended(pm.lc, parent, task["taskId"]), SETTLE_S + 5)
    settled_in = loop.time() - t0
    assert (done["status"], done["result"]) == ("completed", "DONE IN THE OUTAGE")
    assert settled_in < SETTLE_S, settled_in
    assert backoff_of(pm) == (0, 0.0), "the stored backoff is gone"
    if new_task is not None:
        ended = await asyncio.wait_for(task_ended(pm.lc, new_parent, new_task["taskId"]), SETTLE_S)
        assert (ended["status"], ended["result"]) == ("completed", "NEW")
        assert loop.time() - t0 < SETTLE_S


def backoff_of(m: Machines) -> tuple[int, float]:
    with contextlib.closing(sqlite3.connect(Paths(m.home("laptop")).db)) as db:
        row = db.execute(
            "SELECT attempts, next_at FROM link_backoff WHERE env_id = ?", (m.box_id,)
        ).fetchone()
    return (0, 0.0) if row is None else (int(row[0]), float(row[1]))


async def test_a_black_holed_link_is_noticed_within_one_chunk_and_recovers_within_the_backoff(
    pm: Proxied, signals: Path
) -> None:
    """Rules: a watch unanswered by the end of its chunk is a transient failure (a black hole:
    connections accepted, never answered; the box is asked to answer a margin before), noticed
    within one chunk; after the route returns, the follower's next try comes within the backoff
    that applies then."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(pm, held_child(hold, "THROUGH THE HOLE"), "h1")
    child = task["remoteChild"]
    await wait_file(pm.bc, child["threadId"], await started_file(pm, child["threadId"]))
    follower = pm.follower()
    assert follower is not None
    sent = follower.requests

    async def watching() -> bool:
        return follower.requests > sent  # a fresh watch is in flight

    await eventually(watching, what="a fresh watch in flight", within=20)
    loop = asyncio.get_running_loop()
    await pm.proxy.black_hole()
    t0 = loop.time()

    async def noticed() -> bool:
        return backoff_of(pm)[0] >= 1

    await eventually(noticed, what="the black hole noticed (a backoff attempt)", within=30)
    noticed_in = loop.time() - t0
    assert noticed_in <= CHUNK_S + 1.0, noticed_in  # one chunk (and the poll's own step)
    [open_task] = await tasks_of(pm.lc, parent)
    assert "did not answer" in (open_task["lastError"] or ""), open_task

    hold.write_text("go")
    assert (await wait_terminal(pm.bc, child["threadId"], child["runId"]))["status"] == "completed"
    await pm.proxy.forward()
    t1 = loop.time()
    attempts, next_at = backoff_of(pm)
    due_in = max(next_at - time.time(), 0.0)
    done = await asyncio.wait_for(task_ended(pm.lc, parent, task["taskId"]), 60)
    assert (done["status"], done["result"]) == ("completed", "THROUGH THE HOLE")
    # The next try comes when the backoff in force says (plus the watch's own round trip). Had a
    # black-holed try been cut by its deadline just as the route returned, one more backoff applies.
    allowed = max(due_in, CHUNK_S + LINK_BACKOFF.longest(attempts + 1)) + 2.0
    assert loop.time() - t1 < allowed, (loop.time() - t1, attempts, due_in)


# --- followers and the wake path survive store faults ---------------------------------------------------


def failing_writes(
    m: Machines, fault: Callable[[], BaseException]
) -> tuple[dict[str, int], Callable[[], None]]:
    """Make every write to the laptop's store raise `fault()` until the returned function heals it."""
    db = m.laptop.db
    assert db is not None
    real_write = db.write
    failed = {"n": 0}

    @contextlib.asynccontextmanager
    async def write() -> AsyncIterator[Any]:
        failed["n"] += 1
        raise fault()
        yield  # pragma: no cover  # a generator, for the context manager

    db.write = write  # type: ignore[method-assign]

    def heal() -> None:
        db.write = real_write  # type: ignore[method-assign]

    return failed, heal


@pytest.mark.parametrize(
    "fault",
    [
        lambda: StorageUnavailable("peerd's store cannot grow: the disk is full."),
        lambda: sqlite3.OperationalError("database or disk is full"),
    ],
    ids=["storage_unavailable", "sqlite_operational_error"],
)
async def test_the_follower_survives_store_faults_and_the_task_completes(
    pm: Proxied, signals: Path, fault: Callable[[], BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: no store fault wedges a follower. While the laptop's store refuses every write (a full
    disk), the route fails too, so the follower's own error handling hits the store; then the
    child's result arrives while the store still fails. The follower keeps retrying with backoff,
    and once the store works again the task completes and wakes its parent, with no restart."""
    hold = signals / "hold"
    parent, task = await delegated_and_running(pm, held_child(hold, "SURVIVED THE DISK"), "d1")
    follower = pm.follower()
    assert follower is not None
    failed, heal = failing_writes(pm, fault)
    try:
        await pm.proxy.refuse()

        async def store_failed() -> bool:
            return failed["n"] >= 1  # the follower's bookkeeping of the refusal hit the full store

        await eventually(store_failed, what="the follower's bookkeeping failing on the full store", within=20)
        await pm.proxy.forward()
        hold.write_text("go")
        child = task["remoteChild"]
        assert (await wait_terminal(pm.bc, child["threadId"], child["runId"]))["status"] == "completed"
        seen = failed["n"]

        async def failed_again() -> bool:
            return failed["n"] > seen  # it tried again, with the result there, and failed again

        await eventually(failed_again, what="another failing try with the result there", within=30)
        assert not follower.done, "the follower is alive"
        assert (await pm.lc.call("GET", f"/v1/tasks/{task['taskId']}"))["status"] == "running"
    finally:
        heal()
    done = await asyncio.wait_for(task_ended(pm.lc, parent, task["taskId"]), 30)
    assert (done["status"], done["result"]) == ("completed", "SURVIVED THE DISK")
    woken = await wait_run_number(pm.lc, parent, 2)
    assert woken["status"] == "completed"
    assert pm.follower() is follower, "the same follower, never restarted"
    gc.collect()  # a background write whose fault nobody retrieved would be logged now
    unretrieved = [
        r.getMessage() for r in caplog.records if "exception was never retrieved" in r.getMessage()
    ]
    assert unretrieved == [], unretrieved


@pytest.mark.parametrize("where", ["finish", "kick"])
async def test_a_local_task_ends_and_wakes_although_the_store_failed_at_the_childs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Rule: the wake path survives store faults. The store fails when the child's run ends (the
    task's ending) or when the parent's committed wake run is to be started: each is retried with
    backoff, and the parent is woken once with the result."""
    make_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", listen=None) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(tmp_path / "repo")})
        faults = {"left": 1}
        if where == "finish":
            real_finish = task_store.finish

            async def finish(*args: Any, **kw: Any) -> Any:
                if faults["left"]:
                    faults["left"] -= 1
                    raise StorageUnavailable("peerd's store cannot grow: the disk is full.")
                return await real_finish(*args, **kw)

            monkeypatch.setattr(task_store, "finish", finish)
        else:
            assert daemon.followers is not None
            ender = daemon.followers.delegation.ender
            real_runs = ender.runs

            class FailingKick:
                async def kick(self, thread_id: str) -> None:  # only the ending's kick of a wake run
                    if faults["left"]:
                        faults["left"] -= 1
                        raise sqlite3.OperationalError("database or disk is full")
                    await real_runs.kick(thread_id)

            monkeypatch.setattr(ender, "runs", FailingKick())

        prompt = runs_script(
            [delegate(task=script({"reply": "LOCAL DONE"}))],
            [{"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}}}, {"reply": "WOKEN"}],
        )
        launched = await client.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt}
        )
        parent = launched["threadId"]
        woken = await wait_run_number(client, parent, 2)
        assert woken["status"] == "completed"
        assert faults["left"] == 0, "the fault happened"
        [task] = await tasks_of(client, parent)
        assert (task["status"], task["result"]) == ("completed", "LOCAL DONE")
        thread = await client.call("GET", f"/v1/threads/{parent}")
        assert thread["latestRun"]["number"] == 2, "woken once"
