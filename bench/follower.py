"""Benchmark: the link follower (one batched watch per link) against a per-task baseline.

Everything runs in this one process, on loopback, over real TLS: two in-process daemons, "laptop"
and "box", linked the way `peerd link` links them. Two measurements, each against a baseline run
side by side on the same machine, reported as ratios (never as absolute pass/fail thresholds):

1. Idle traffic. N open remote tasks whose runs never settle (on the box: N threads whose first
   run is queued with the thread's queue held; on the laptop: N running tasks pointing at them).
   Requests reaching the box per minute, counted server-side, for
     - peerd: the laptop's follower for the link (one batched `POST /v1/watch` per chunk), and
     - baseline: one loop per task, each long-polling its own run with
       `GET /v1/threads/{id}/wait?run=R&timeout=<chunk>` (how the reference follows a task).
   Ratio baseline / peerd: about N when both are idle.

2. Wake latency: a real remote task (scripted parent on the laptop delegates to the box; the child
   waits for a file). Once the child is waiting, the file is written and the time until the
   laptop's task is `completed` is measured (from the box run's end, and from the release as seen
   by a client following the parent's events). Baseline: one loopback round trip over the same
   link (medians of `PeerClient.probe` calls, of the follower's `POST /v1/watch` through
   `PeerClient.call`, and of `GET /v1/projects`). Ratio wake / round trip. Repeated with the idle
   tasks still open in the same watch (at most 999 of them).

Run: .venv/bin/python bench/follower.py [--tasks 1000] [--window 30] [--chunk 5] [--reps 5]
See bench/README.md for what the columns mean and the numbers measured.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import peerd.daemon
from peerd import contracts as c
from peerd.api import remote
from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon, DaemonConfig
from peerd.errors import PeerdError
from peerd.logs import configure_logging
from peerd.operations import Caller
from peerd.peer.client import CALL_TIMEOUT_S as REQUEST_TIMEOUT_S
from peerd.peer.client import PeerClient
from peerd.store import links, threads
from peerd.store.db import Database
from peerd.store.ids import new_id
from peerd.tasks import store as tasks
from peerd.tasks.machine import WATCH_BATCH

GIT_ENV = {
    "GIT_AUTHOR_NAME": "peerd bench",
    "GIT_AUTHOR_EMAIL": "bench@peerd.invalid",
    "GIT_COMMITTER_NAME": "peerd bench",
    "GIT_COMMITTER_EMAIL": "bench@peerd.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


# --- server-side request counting ----------------------------------------------------------------


class RequestCounter:
    """Requests that reached one daemon's network listener, by kind, as they arrive."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.busy_s: collections.defaultdict[str, float] = collections.defaultdict(float)  # handler time
        self.answered: collections.Counter[str] = collections.Counter()
        self.arrivals: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
        self._changed = asyncio.Condition()

    @staticmethod
    def kind(path: str) -> str:
        if path == "/v1/watch":
            return "watch"
        if path.startswith("/v1/threads/") and path.endswith("/wait"):
            return "wait"
        return "other"

    async def arrived(self, path: str) -> None:
        self.counts[self.kind(path)] += 1
        self.arrivals[self.kind(path)].append(time.monotonic())
        async with self._changed:
            self._changed.notify_all()

    async def until(self, kind: str, at_least: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.counts[kind] >= at_least)


COUNTERS: dict[str, RequestCounter] = {}
_original_network_app = remote.network_app


def counting_network_app(ops: Any, desc: Any, **kw: Any) -> web.Application:
    """`peerd.api.remote.network_app` with a counting middleware in front (bench only)."""
    app = _original_network_app(ops, desc, **kw)
    counter = COUNTERS.setdefault(desc.label, RequestCounter())

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        kind = counter.kind(request.path)
        await counter.arrived(request.path)
        t0 = time.perf_counter()
        response: web.StreamResponse = await handler(request)
        counter.busy_s[kind] += time.perf_counter() - t0
        counter.answered[kind] += 1
        return response

    app.middlewares.insert(0, count)
    return app


peerd.daemon.network_app = counting_network_app  # type: ignore[attr-defined]  # the name the daemon calls


# --- set-up --------------------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, check=True)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# bench\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    return path


def script(*steps: dict[str, Any]) -> str:
    return "```peerd-script\n" + json.dumps({"steps": list(steps)}) + "\n```"


def runs_script(*runs: list[dict[str, Any]]) -> str:
    """Each run of the session gets its own steps (run 2 is the wake run)."""
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": s} for s in runs]}) + "\n```"


@dataclass
class Pair:
    laptop: Daemon
    box: Daemon
    lc: LocalClient
    bc: LocalClient
    laptop_project: str
    box_project: str

    @property
    def box_id(self) -> str:
        assert self.box.identity is not None
        return self.box.identity.env_id

    @property
    def laptop_db(self) -> Database:
        assert self.laptop.db is not None
        return self.laptop.db

    @property
    def box_db(self) -> Database:
        assert self.box.db is not None
        return self.box.db

    @property
    def peers(self) -> PeerClient:
        assert self.laptop.peers is not None
        return self.laptop.peers


@contextlib.asynccontextmanager
async def linked_pair(root: Path, *, chunk: float) -> AsyncIterator[Pair]:
    laptop = Daemon(
        DaemonConfig(home=root / "laptop", label="laptop", listen="127.0.0.1:0", watch_chunk_s=chunk)
    )
    box = Daemon(DaemonConfig(home=root / "box", label="box", listen="127.0.0.1:0", watch_chunk_s=chunk))
    async with contextlib.AsyncExitStack() as stack:
        for daemon in (box, laptop):  # the laptop stops first: its follower never sees the box go away
            await daemon.start()
            stack.push_async_callback(daemon.shutdown)
        lc = await stack.enter_async_context(LocalClient(laptop.paths.socket))
        bc = await stack.enter_async_context(LocalClient(box.paths.socket))
        here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "laptop-repo"))})
        there = await bc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "box-repo"))})
        code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
        await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
        yield Pair(laptop, box, lc, bc, here["id"], there["id"])


async def insert_idle_tasks(pair: Pair, n: int) -> list[tuple[str, str]]:
    """N never-settling remote tasks: box threads with a queued run and a held queue; laptop tasks
    (running, child ids set) of one parent thread. One transaction on each side."""
    now = time.time()
    box_db, laptop_db = pair.box_db, pair.laptop_db
    client_id = await box_db.scalar("SELECT id FROM clients WHERE revoked_at IS NULL")
    children: list[tuple[str, str]] = []
    async with box_db.write() as tx:
        for i in range(n):
            thread_id = await _insert_thread(
                tx, pair.box_project, f"idle {i}", now, link_origin=client_id, link_label="laptop"
            )
            run_id = await threads.insert_run(tx, thread_id, f"idle task {i}", now)
            children.append((thread_id, run_id))
    async with laptop_db.write() as tx:
        parent = await _insert_thread(tx, pair.laptop_project, "idle parent", now)
        parent_run = await threads.insert_run(tx, parent, "delegate many", now)
        await tx.execute(
            "UPDATE runs SET status = 'completed', started_at = ?, ended_at = ? WHERE id = ?",
            (now, now, parent_run),
        )
        for i, (thread_id, run_id) in enumerate(children):
            await tx.execute(
                "INSERT INTO tasks (id, parent_thread_id, parent_run_id, namespace, request_key, request_hash,"
                " title, prompt, target_env, target_label, project_id, provider, launch_key, child_thread_id,"
                " child_run_id, status, wake, created_at, updated_at)"
                " VALUES (?, ?, ?, 'bench', ?, 'bench', ?, ?, ?, 'box', ?, 'script', ?, ?, ?, 'running',"
                " 'always', ?, ?)",
                (
                    new_id("tsk"),
                    parent,
                    parent_run,
                    f"idle-{i}",
                    f"idle {i}",
                    f"idle task {i}",
                    pair.box_id,
                    pair.box_project,
                    f"delegate:{parent}:idle-{i}",
                    thread_id,
                    run_id,
                    now + i * 1e-6,
                    now,
                ),
            )
    return children


async def _insert_thread(
    tx: Any,
    project_id: str,
    title: str,
    now: float,
    *,
    link_origin: str | None = None,
    link_label: str | None = None,
) -> str:
    """A thread row with its queue held (nothing ever starts there), and its created event."""
    thread_id = new_id("thr")
    await tx.execute(
        "INSERT INTO threads (id, project_id, title, provider, model, runtime_mode, interaction_mode, in_place,"
        " worktree_path, branch, queue_held, created_at, updated_at, link_origin, link_label)"
        " VALUES (?, ?, ?, 'script', NULL, 'auto', 'default', 0, ?, NULL, 1, ?, ?, ?, ?)",
        (thread_id, project_id, title, f"/nonexistent/{thread_id}", now, now, link_origin, link_label),
    )
    await threads.event(tx, thread_id, "thread.created", {"threadId": thread_id}, now)
    return thread_id


async def open_task_count(pair: Pair) -> int:
    return len(await tasks.open_for_env(pair.laptop_db, pair.box_id))


async def ended_summary(pair: Pair) -> str:
    """How many idle tasks ended (they never should), and how the first one ended."""
    rows = await pair.laptop_db.fetchall(
        "SELECT status, result FROM tasks WHERE namespace = 'bench' AND status != 'running'"
    )
    first = f"; the first: {rows[0]['status']}, {rows[0]['result']!r}" if rows else ""
    return f"{len(rows)} idle tasks ended{first}"


# --- 1. idle traffic -----------------------------------------------------------------------------


@dataclass
class Window:
    name: str
    requests: int
    seconds: float
    cpu_s: float
    held_s: float  # mean time the box held one request (a long-poll: about the chunk)
    errors: int = 0
    note: str = ""

    @property
    def per_minute(self) -> float:
        return self.requests * 60 / self.seconds

    @property
    def cpu_per_minute(self) -> float:
        return self.cpu_s * 60 / self.seconds


async def measure_window(counter: RequestCounter, kind: str, seconds: float, name: str) -> Window:
    """Requests arriving at the box from one arrival to the first arrival at least `seconds` later.

    Starting and ending on an arrival makes the window a whole number of the follower's cycles:
    with a handful of watches per window, a fixed window would be off by up to a whole watch."""
    await counter.until(kind, counter.counts[kind] + 1)
    t_start, cpu0 = counter.arrivals[kind][-1], time.process_time()
    busy0, answered0 = counter.busy_s[kind], counter.answered[kind]
    await asyncio.sleep(seconds)  # requests are counted as they arrive
    await counter.until(kind, counter.counts[kind] + 1)
    t_end, cpu1 = counter.arrivals[kind][-1], time.process_time()
    answered = counter.answered[kind] - answered0
    return Window(
        name,
        requests=sum(1 for t in counter.arrivals[kind] if t_start <= t < t_end),
        seconds=t_end - t_start,
        cpu_s=cpu1 - cpu0,
        held_s=(counter.busy_s[kind] - busy0) / answered if answered else 0.0,
    )


class UnpooledPeerClient(PeerClient):
    """A PeerClient without aiohttp's default cap of 100 pooled connections, so N per-task
    long-polls are all in flight at once (the daemon's own client would queue all but 100)."""

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=REQUEST_TIMEOUT_S)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))


async def baseline_idle(
    pair: Pair, children: list[tuple[str, str]], *, chunk: float, window: float, shared_pool: bool
) -> Window:
    """N loops, each long-polling its own task's run. They are stopped by a flag, each after its
    current long-poll, never cancelled mid-call: a call cancelled inside a `db.write()` can leave
    the writer connection in an open transaction (see bench/README.md)."""
    counter = COUNTERS["box"]
    assert pair.laptop.identity is not None
    client: PeerClient
    own_db: Database | None = None
    if shared_pool:
        client = pair.peers
    else:  # its own connections to the laptop's store, too: the daemon's stay untouched
        own_db = await Database.open(pair.laptop.paths.db)
        client = UnpooledPeerClient(own_db, own_env_id=pair.laptop.identity.env_id)
        await client.start()
    first_answers = 0
    all_answered = asyncio.Event()
    stop = asyncio.Event()
    errors = collections.Counter[str]()

    async def follow_one(thread_id: str, run_id: str) -> None:
        nonlocal first_answers
        answered = False
        # Tasks start at different times: spread the loops over one chunk instead of in lock-step.
        await asyncio.sleep(random.uniform(0, chunk))
        while not stop.is_set():
            try:
                result = await client.call(
                    pair.box_id,
                    "GET",
                    f"/v1/threads/{thread_id}/wait",
                    params={"run": run_id, "timeout": chunk},
                )
                if result["terminal"]:
                    errors["settled?"] += 1
                    return
            except PeerdError as exc:
                errors[exc.code] += 1
                await asyncio.sleep(1)  # a failing baseline loop must not spin
            if not answered:
                answered = True
                first_answers += 1
                if first_answers == len(children):
                    all_answered.set()

    loops = [asyncio.create_task(follow_one(t, r)) for t, r in children]
    try:
        # Warm-up: every loop has had one answer (connections made, handshakes done).
        await asyncio.wait_for(all_answered.wait(), timeout=max(60.0, 12 * chunk))
        result = await measure_window(counter, "wait", window, "baseline: one long-poll per task")
    finally:
        stop.set()
        _, pending = await asyncio.wait(loops, timeout=chunk + 30)
        for loop in pending:  # only if a long-poll hung past its chunk
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if own_db is not None:
            await client.close()
            await own_db.close()
    result.errors = sum(errors.values())
    result.note = (
        "through the daemon's PeerClient (100-connection pool)" if shared_pool else "one connection per task"
    )
    return result


async def pass_costs(pair: Pair, children: list[tuple[str, str]], reps: int = 3) -> tuple[float, float]:
    """What one pass costs, alone: the box re-checking the N watched runs (one `Delegation.watch`
    pass, timeout 0), and the laptop reading the link's open tasks (`tasks.open_for_env`)."""
    assert pair.box.followers is not None
    watch = c.RunWatch.model_validate(
        {"runs": [{"threadId": t, "runId": r} for t, r in children[:WATCH_BATCH]], "timeout": 0}
    )
    box_s, laptop_s = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        await pair.box.followers.delegation.watch(Caller(namespace="bench"), watch)
        box_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await tasks.open_for_env(pair.laptop_db, pair.box_id)
        laptop_s.append(time.perf_counter() - t0)
    return statistics.median(box_s), statistics.median(laptop_s)


async def peerd_idle(pair: Pair, *, window: float, chunk: float) -> Window:
    counter = COUNTERS["box"]
    assert pair.laptop.followers is not None
    start = counter.counts["watch"]
    pair.laptop.followers.notify(pair.box_id)
    # Warm-up: the first watch came back and the next one is out (a steady chunk from here on).
    try:
        await asyncio.wait_for(counter.until("watch", start + 2), timeout=60 + 4 * chunk)
    except TimeoutError:
        raise SystemExit(f"error: the follower stopped watching; {await ended_summary(pair)}") from None
    return await measure_window(counter, "watch", window, "peerd: one batched watch per link")


# --- 2. wake latency ----------------------------------------------------------------------------


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def round_trips(pair: Pair, n: int) -> dict[str, list[float]]:
    """Loopback round trips over the link, interleaved: the unauthenticated descriptor probe; the
    follower's own request shape through `PeerClient.call` (`POST /v1/watch`, one run, timeout 0:
    the box answers at once, the run being unknown there); and `GET /v1/projects` (its handler
    also refreshes each project's repository key with git)."""
    link = await links.get(pair.laptop_db, pair.box_id)
    assert link is not None
    url = link.urls[0]
    watch = {"runs": [{"threadId": "thr_bench", "runId": "run_bench"}], "timeout": 0}
    steps: dict[str, Callable[[], Awaitable[Any]]] = {
        "probe": lambda: pair.peers.probe(url, link.fingerprint),
        "watch": lambda: pair.peers.call(pair.box_id, "POST", "/v1/watch", body=watch),
        "projects": lambda: pair.peers.call(pair.box_id, "GET", "/v1/projects"),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(n + 3):  # the first 3 warm the pooled connection
        for name, step in steps.items():
            t0 = time.perf_counter()
            await step()
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
    return times


@dataclass
class Wake:
    run_end_to_task_end: float  # box run ended_at -> laptop task ended_at (stored timestamps)
    release_to_seen: float  # hold file written -> a client following the parent sees `completed`


async def follow_events(client: LocalClient, thread_id: str, until: Callable[[], Any]) -> Any:
    """Re-check `until()` each time the thread has new events (an events long-poll, no sleeps)."""
    cursor = 0
    while True:
        found = await until()
        if found:
            return found
        page = await client.call(
            "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 30}
        )
        cursor = page["nextCursor"]


async def one_wake(pair: Pair, root: Path, i: int) -> Wake:
    hold = root / f"hold-{i}-{time.monotonic_ns()}"
    child = script({"reply": "WAITING"}, {"wait_for_file": str(hold)}, {"reply": "BENCH DONE"})
    delegate = {
        "tool": {
            "name": "delegate_task",
            "arguments": {
                "task": child,
                "target": {"environmentId": pair.box_id, "projectId": pair.box_project},
                "clientRequestId": f"wake-{i}-{hold.name}",
            },
            "check": True,
        }
    }
    prompt = runs_script([delegate], [{"reply": "woken"}])
    launched = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": pair.laptop_project, "prompt": prompt}
    )
    parent = launched["threadId"]

    async def running_task() -> dict[str, Any] | None:
        items = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
        if items and items[0]["status"] not in ("pending", "running"):
            raise RuntimeError(f"the bench task ended early: {items[0]}")
        return items[0] if items and items[0]["status"] == "running" else None

    task = await follow_events(pair.lc, parent, running_task)
    child_thread, child_run = task["remoteChild"]["threadId"], task["remoteChild"]["runId"]

    async def child_waiting() -> bool:  # its first reply is recorded: it is in the wait step now
        items = (await pair.bc.call("GET", f"/v1/threads/{child_thread}/items"))["items"]
        return any(item["kind"] == "assistant_message" for item in items)

    await follow_events(pair.bc, child_thread, child_waiting)
    released = time.time()
    hold.write_text("go")

    async def completed() -> dict[str, Any] | None:
        info: dict[str, Any] = await pair.lc.call("GET", f"/v1/tasks/{task['taskId']}")
        if info["status"] not in ("running", "completed"):
            raise RuntimeError(f"the bench task did not complete: {info}")
        return info if info["status"] == "completed" else None

    done = await follow_events(pair.lc, parent, completed)
    seen = time.time()
    if done["result"] != "BENCH DONE":
        raise RuntimeError(f"unexpected result {done['result']!r}")
    run = await threads.get_run(pair.box_db, child_run)
    row = await tasks.get(pair.laptop_db, task["taskId"])
    assert run.ended_at is not None and row.ended_at is not None
    if row.woken_run_id is not None:  # let the parent's wake run finish: no overlap with the next rep
        await pair.lc.call(
            "GET", f"/v1/threads/{parent}/wait", params={"run": row.woken_run_id, "timeout": 30}
        )
    return Wake(row.ended_at - run.ended_at, seen - released)


async def wakes(pair: Pair, root: Path, reps: int) -> list[Wake]:
    return [await one_wake(pair, root, i) for i in range(reps)]


# --- report --------------------------------------------------------------------------------------


@dataclass
class Results:
    args: argparse.Namespace
    rtt: dict[str, list[float]] = field(default_factory=dict)
    wake: list[Wake] = field(default_factory=list)
    loaded_wake: list[Wake] = field(default_factory=list)
    loaded_tasks: int = 0
    idle: list[Window] = field(default_factory=list)
    box_pass_s: float = 0.0
    laptop_pass_s: float = 0.0
    unretrieved: list[str] = field(default_factory=list)


def report(r: Results) -> None:
    a = r.args
    print(
        f"\npeerd follower benchmark: tasks={a.tasks} window={a.window:g}s chunk={a.chunk:g}s reps={a.reps}"
        f" loaded-reps={a.loaded_reps}; {os.cpu_count()} CPUs, both daemons in one process, loopback TLS"
    )
    print(f"\n1. Idle traffic: {a.tasks} open remote tasks on one link (requests counted at the box)")
    head = f"{'requests':>9} {'req/min':>9} {'ideal':>9} {'cycle s':>8} {'held s':>7} {'CPU s/min':>9} {'errors':>6}"
    print(f"   {'':36} {head}")
    batches = -(-a.tasks // WATCH_BATCH)  # watches per follower pass
    per_cycle = {"peerd": batches, "baseline": a.tasks}  # requests per chunk, ideally
    by: dict[str, Window] = {}
    for w in r.idle:
        key = "peerd" if w.name.startswith("peerd") else "baseline"
        by[key] = w
        cycle = per_cycle[key] * w.seconds / max(w.requests, 1)
        print(
            f"   {w.name:36} {w.requests:9d} {w.per_minute:9.1f} {per_cycle[key] * 60 / a.chunk:9.1f}"
            f" {cycle:8.2f} {w.held_s:7.2f} {w.cpu_per_minute:9.1f} {w.errors:6d}"
        )
        if w.note:
            print(f"     ({w.note})")
    if "peerd" in by and "baseline" in by and by["peerd"].requests:
        ratio = by["baseline"].per_minute / by["peerd"].per_minute
        cpu = by["baseline"].cpu_per_minute / max(by["peerd"].cpu_per_minute, 1e-9)
        ideal_ratio = a.tasks / batches
        print(
            f"   ratio baseline / peerd: requests {ratio:.0f}x (ideal {ideal_ratio:.0f}x); process CPU {cpu:.1f}x"
        )
        if by["baseline"].per_minute < 0.9 * a.tasks * 60 / a.chunk:
            print(
                "   note: the baseline ran under 90% of its ideal rate (CPU-bound here): it understates the ratio"
            )
        if by["peerd"].per_minute < 0.9 * batches * 60 / a.chunk:
            print(
                "   note: peerd's cycle is longer than the chunk (the time the box and the laptop spend per pass)"
            )
    print(
        f"   one pass alone: box re-checks {min(a.tasks, WATCH_BATCH)} watched runs in"
        f" {r.box_pass_s * 1000:.0f} ms; laptop reads its {a.tasks} open tasks in {r.laptop_pass_s * 1000:.0f} ms"
    )
    print(
        "   (ideal: one request per chunk per watch or per task; cycle: seconds between one watch's, or one"
    )
    print("    task's, requests; held: mean time the box spent on one request; CPU: the whole process)")

    rtt = {name: median_ms(values) for name, values in r.rtt.items()}
    n = len(r.rtt["probe"])
    print("\n2. Wake latency: remote run ends -> parent task completed (medians, ms)")
    print(
        f"   loopback round trip (n={n}), PeerClient.probe, GET /.well-known/peerd:       {rtt['probe']:7.2f}"
    )
    print(
        f"   loopback round trip (n={n}), PeerClient.call, POST /v1/watch (1 run, no wait): {rtt['watch']:7.2f}"
    )
    print(
        f"   loopback round trip (n={n}), PeerClient.call, GET /v1/projects:              {rtt['projects']:7.2f}"
    )
    rows = [("idle link", r.wake)]
    if r.loaded_wake:
        rows.append((f"{r.loaded_tasks} idle tasks on the link", r.loaded_wake))
    print(
        f"   {'':30} {'n':>2} {'run end -> task end':>20} {'release -> seen':>16} {'x probe':>8} {'x watch':>8}"
    )
    for label, ws in rows:
        end = median_ms([w.run_end_to_task_end for w in ws])
        seen = median_ms([w.release_to_seen for w in ws])
        print(
            f"   {label:30} {len(ws):2d} {end:20.1f} {seen:16.1f} {end / rtt['probe']:8.1f}"
            f" {end / rtt['watch']:8.1f}"
        )
        each = ", ".join(f"{w.run_end_to_task_end * 1000:.0f}" for w in ws)
        print(f"     (run end -> task end, each: {each})")
    print(
        "   (release -> seen adds the child's 50 ms file poll, its exit, and the client's events long-poll)"
    )
    if r.unretrieved:
        print(f"\nnote: {len(r.unretrieved)} asyncio error(s) nobody retrieved; first: {r.unretrieved[0]}")


# --- main ----------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> Results:
    results = Results(args)

    def unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Collected and summarised in the report instead of a traceback mid-output."""
        task, exc = context.get("future"), context.get("exception")
        name = getattr(task.get_coro(), "__qualname__", "?") if isinstance(task, asyncio.Task) else "?"
        results.unretrieved.append(f"{context.get('message')}: {name} raised {exc!r}")

    asyncio.get_running_loop().set_exception_handler(unretrieved)
    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        root = Path(tmp)
        async with linked_pair(root, chunk=args.chunk) as pair:
            t0 = time.monotonic()
            results.rtt = await round_trips(pair, args.round_trips)
            results.wake = await wakes(pair, root, args.reps)
            say(f"wake latency on an idle link: {time.monotonic() - t0:.1f}s")

            t0 = time.monotonic()
            children = await insert_idle_tasks(pair, args.tasks)
            say(f"inserted {args.tasks} idle tasks: {time.monotonic() - t0:.1f}s")
            results.box_pass_s, results.laptop_pass_s = await pass_costs(pair, children)
            if not args.skip_baseline:
                t0 = time.monotonic()
                base = await baseline_idle(
                    pair, children, chunk=args.chunk, window=args.window, shared_pool=args.shared_pool
                )
                results.idle.append(base)
                say(f"baseline window: {time.monotonic() - t0:.1f}s")
            t0 = time.monotonic()
            results.idle.insert(0, await peerd_idle(pair, window=args.window, chunk=args.chunk))
            say(f"peerd window: {time.monotonic() - t0:.1f}s")
            if await open_task_count(pair) != args.tasks:
                raise SystemExit(f"error: idle tasks ended during the windows; {await ended_summary(pair)}")

            if args.loaded_reps:
                # The new task must share its watch with the idle ones: the follower splits the
                # link's running tasks into watches of WATCH_BATCH runs, oldest first, and a new task
                # alone in a second watch would not see the others' cost.
                excess = args.tasks + 1 - WATCH_BATCH
                if excess > 0:
                    async with pair.laptop_db.write() as tx:
                        await tx.execute(
                            "UPDATE tasks SET status = 'cancelled', ended_at = ? WHERE id IN"
                            " (SELECT id FROM tasks WHERE namespace = 'bench' AND status = 'running' LIMIT ?)",
                            (time.time(), excess),
                        )
                results.loaded_tasks = await open_task_count(pair)
                t0 = time.monotonic()
                results.loaded_wake = await wakes(pair, root, args.loaded_reps)
                say(f"wake latency with {results.loaded_tasks} idle tasks: {time.monotonic() - t0:.1f}s")
            t0 = time.monotonic()
        say(f"shutdown: {time.monotonic() - t0:.1f}s")
    return results


def say(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=1000, help="open remote tasks on the link (default 1000)")
    p.add_argument("--window", type=float, default=30.0, help="idle counting window, seconds (default 30)")
    p.add_argument(
        "--chunk", type=float, default=5.0, help="long-poll chunk, both sides, seconds (default 5)"
    )
    p.add_argument("--reps", type=int, default=5, help="wake-latency tasks on an idle link (default 5)")
    p.add_argument(
        "--loaded-reps", type=int, default=3, help="wake-latency tasks with the idle tasks open (default 3)"
    )
    p.add_argument(
        "--round-trips", type=int, default=50, help="round trips for the baseline median (default 50)"
    )
    p.add_argument(
        "--shared-pool",
        action="store_true",
        help="baseline through the daemon's own PeerClient (aiohttp's 100-connection pool)",
    )
    p.add_argument("--skip-baseline", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tasks < 1 or args.window <= 0 or args.chunk <= 0 or args.reps < 1:
        p.error("--tasks, --window, --chunk and --reps must be positive")
    return args


if __name__ == "__main__":
    arguments = parse()
    configure_logging(json=False, level=logging.WARNING)
    started = time.monotonic()
    report(asyncio.run(main(arguments)))
    print(f"\n(total {time.monotonic() - started:.0f}s)")
