"""Benchmark: one link's change feed - wake latency and idle cost at N = 0, 1,000 and 10,000 other
open tasks, each against a baseline measured in the same run.

Everything runs in this one process, on loopback, over real TLS: two in-process daemons, "laptop"
and "box", linked the way `peerd link` links them. For each N (the open tasks are made cheaply:
box threads whose run is queued behind a held queue, and laptop tasks pointing at them):

1. Idle cost per link: requests and bytes (bodies and the headers the app sets, both ways, counted
   at the box) per minute while the N tasks stay open, for peerd's follower (one change-feed poll
   per chunk) and for a per-task follower (one `GET /v1/threads/{id}/wait` long-poll loop per
   task, the way the reference follows a task; measured with `--baseline-tasks` loops and scaled
   to N per task).
2. Wake latency: a real remote task (a scripted parent delegates to the box; the child waits for a
   file); once it waits the file is written, and the time from the box run's end to the laptop
   task's end (both stored, one clock) is taken. Baseline: a stdlib `http.client` keep-alive
   HTTPS request to the box (the floor, issue 33), the same through aiohttp (`PeerClient.probe`,
   pinned TLS, no credentials, no store) and the follower's own request shape (an authenticated
   `POST /v1/feed/changes` answered at once), interleaved, in the same run.

Figures go to stdout as a table and into bench/results.json under "wake" and "idle" (other keys
kept). Run: .venv/bin/python bench/wake.py [--sizes 0,1000,10000] [--chunk 5] ...
See bench/README.md for what the columns mean and the numbers measured.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import http.client
import json
import logging
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from benchlib import save_results

from peerd.api import remote
from peerd.api.listener_rules import ListenerLimits
from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon, DaemonConfig
from peerd.errors import PeerdError
from peerd.logs import configure_logging
from peerd.peer.client import CALL_TIMEOUT_S, PeerClient
from peerd.runtime.sandbox_profile import READABLE_ENV
from peerd.store import links, threads
from peerd.store.db import Database
from peerd.store.ids import new_id
from peerd.tasks import store as tasks
from peerd.tasks.feedwire import CHANGES_PATH
from peerd.tasks.machine import watch_margin

PRODUCTION_CHUNK_S = 50.0
# Issue 33: against the stdlib round trip, <= 5x on an idle link and <= 8x at 10,000 open tasks.
GOALS = {"wake_idle_x": 5.0, "wake_x": 8.0, "requests_per_min": 2.0}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "peerd bench",
    "GIT_AUTHOR_EMAIL": "bench@peerd.invalid",
    "GIT_COMMITTER_NAME": "peerd bench",
    "GIT_COMMITTER_EMAIL": "bench@peerd.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def say(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# --- counting at the box ---------------------------------------------------------------------------


def kind_of(path: str) -> str:
    if path == CHANGES_PATH:
        return "poll"
    if path.startswith("/v1/feed/"):
        return "subscribe"
    if path.endswith("/wait"):
        return "wait"
    return "other"


UNTIL_S = 300.0  # the longest a bench waits for a request to arrive (a chunk is at most 50 s)


class Counter:
    """Requests (and their bytes) that reached the box's network listener, by kind, as they arrive."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()
        self.arrivals: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
        self._changed = asyncio.Condition()

    async def arrived(self, kind: str) -> None:
        self.counts[kind] += 1
        self.arrivals[kind].append(time.monotonic())
        async with self._changed:
            self._changed.notify_all()

    async def until(self, kind: str, at_least: int, within: float = UNTIL_S) -> None:
        """Until `at_least` requests of `kind` arrived; a bench that sees none for `within` seconds
        fails (the counting middleware not installed, or nothing polling) rather than hang."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.counts[kind] >= at_least), within)
            except TimeoutError:
                raise RuntimeError(
                    f"no {kind!r} request reached the box in {within:g} s ({self.counts[kind]} of {at_least}):"
                    " is the counting middleware installed (counting_network_app)?"
                ) from None


BOX = Counter()
# The listeners counted, by the daemon's label: the box here; bench/fleet.py adds one per box.
COUNTERS: dict[str, Counter] = {"box": BOX}
_network_app = remote.network_app


def _header_bytes(headers: Any) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.items())


def counting_network_app(ops: Any, desc: Any, **kw: Any) -> web.Application:
    """`peerd.api.remote.network_app` with a counting middleware in front (this process only)."""
    app = _network_app(ops, desc, **kw)

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        kind = kind_of(request.path)
        counter = COUNTERS.get(desc.label)
        if counter is not None:
            await counter.arrived(kind)
        response: web.StreamResponse = await handler(request)
        if counter is not None:
            body = response.body if isinstance(response, web.Response) else b""
            size_in = len(request.method) + len(request.path_qs) + 12 + _header_bytes(request.headers)
            size_in += request.content_length or 0
            size_out = 17 + _header_bytes(response.headers) + len(body if isinstance(body, bytes) else b"")
            counter.bytes[kind] += size_in + size_out
        return response

    app.middlewares.insert(0, count)
    return app


# The daemon imports `network_app` from `peerd.api.remote` when it starts a network listener (the
# OAuth and link-token libraries load only then, issue 33): replace it there.
remote.network_app = counting_network_app  # type: ignore[assignment]


# --- set-up -----------------------------------------------------------------------------------------


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "initial"]):
        subprocess.run(
            ["git", *args], cwd=path, env={**os.environ, **GIT_ENV}, capture_output=True, check=True
        )
    return path


def script(*steps: dict[str, Any]) -> str:
    return "```peerd-script\n" + json.dumps({"steps": list(steps)}) + "\n```"


def runs_script(*runs: list[dict[str, Any]]) -> str:
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

    def hub_looks(self) -> int:
        assert self.box.followers is not None
        return self.box.followers.delegation.ender.watcher.hub.looks

    def follower(self) -> Any:
        assert self.laptop.followers is not None
        return self.laptop.followers._followers.get(self.box_id)


@contextlib.asynccontextmanager
async def linked_pair(root: Path, *, chunk: float) -> AsyncIterator[Pair]:
    laptop = Daemon(
        DaemonConfig(home=root / "laptop", label="laptop", listen="127.0.0.1:0", watch_chunk_s=chunk)
    )
    # The per-task baseline opens one connection per task from one address: far above the box's
    # caps on connections per address (which is itself a reason per-task following does not scale).
    caps = ListenerLimits(per_address=5000, unauthenticated=5000)
    box = Daemon(DaemonConfig(home=root / "box", label="box", listen="127.0.0.1:0", listener_limits=caps))
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


async def insert_idle_tasks(pair: Pair, first: int, n: int) -> list[tuple[str, str]]:
    """`n` more never-settling remote tasks: box threads (this link's) whose run is queued behind a
    held queue, and running laptop tasks of one parent pointing at them; one transaction a side."""
    now = time.time()
    client_id = await pair.box_db.scalar("SELECT id FROM clients WHERE revoked_at IS NULL")
    children = [(new_id("thr"), new_id("run")) for _ in range(n)]
    async with pair.box_db.write() as tx:
        await tx.executemany(
            THREAD_SQL,
            [
                (t, pair.box_project, f"idle {first + k}", f"/nonexistent/{t}", now, now, client_id)
                for k, (t, _) in enumerate(children)
            ],
        )
        await tx.executemany(
            RUN_SQL, [(r, t, f"idle task {first + k}", now) for k, (t, r) in enumerate(children)]
        )
    parent, parent_run = new_id("thr"), new_id("run")
    async with pair.laptop_db.write() as tx:
        await tx.execute(
            THREAD_SQL, (parent, pair.laptop_project, "idle parent", f"/nonexistent/{parent}", now, now, None)
        )
        await tx.execute(RUN_SQL, (parent_run, parent, "delegate many", now))
        await tx.execute("UPDATE runs SET status = 'completed', ended_at = ? WHERE id = ?", (now, parent_run))
        await tx.executemany(
            "INSERT INTO tasks (id, parent_thread_id, parent_run_id, namespace, request_key, request_hash,"
            " title, prompt, target_env, target_label, project_id, provider, launch_key, child_thread_id,"
            " child_run_id, status, wake, created_at, updated_at)"
            " VALUES (?, ?, ?, 'bench', ?, 'bench', 'idle', 'idle', ?, 'box', ?, 'script', ?, ?, ?, 'running',"
            " 'always', ?, ?)",
            [
                (
                    new_id("tsk"),
                    parent,
                    parent_run,
                    f"idle-{first + k}",
                    pair.box_id,
                    pair.box_project,
                    f"delegate:{parent}:idle-{first + k}",
                    thread_id,
                    run_id,
                    now + k * 1e-6,
                    now,
                )
                for k, (thread_id, run_id) in enumerate(children)
            ],
        )
    return children


# A thread whose queue is held (nothing ever starts there) and its one queued run.
THREAD_SQL = (
    "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode, in_place,"
    " worktree_path, queue_held, created_at, updated_at, link_origin, link_label)"
    " VALUES (?, ?, ?, 'script', 'auto', 'default', 0, ?, 1, ?, ?, ?, 'laptop')"
)
RUN_SQL = (
    "INSERT INTO runs (id, thread_id, number, status, prompt, created_at) VALUES (?, ?, 1, 'queued', ?, ?)"
)


async def eventually(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} did not happen within {within:.0f} s")
        await asyncio.sleep(0.02)


async def followed(pair: Pair, n: int) -> float:
    """Tell the follower (as `notify` does after a change of the link) and wait until the box holds
    the n runs and a poll is in flight; how long that took."""
    t0 = time.monotonic()
    if n == 0:
        return 0.0
    assert pair.laptop.followers is not None
    pair.laptop.followers.notify(pair.box_id)

    def steady() -> bool:
        f = pair.follower()
        return f is not None and f.machine.polling and f.machine.sub.settled and len(f.machine.sub.want) == n

    await eventually(steady, 120, f"following {n} tasks")
    return time.monotonic() - t0


# --- 1. idle cost -------------------------------------------------------------------------------------


@dataclass
class Idle:
    requests: int
    seconds: float
    bytes: int
    other_requests: int
    cpu_s: float

    @property
    def per_min(self) -> float:
        return self.requests * 60 / self.seconds if self.seconds else 0.0

    @property
    def bytes_per_min(self) -> float:
        return self.bytes * 60 / self.seconds if self.seconds else 0.0


async def window(kind: str, seconds: float, *, aligned: bool = True, counter: Counter = BOX) -> Idle:
    """What reached the box from one `kind` arrival to the first one at least `seconds` later (a
    whole number of cycles); unaligned: a plain window (nothing may arrive at all). At the box
    unless `counter` says which listener."""
    box = counter
    if aligned:
        await box.until(kind, box.counts[kind] + 1)
    t0 = box.arrivals[kind][-1] if aligned else time.monotonic()
    before, bytes0, cpu0 = sum(box.counts.values()), box.bytes[kind], time.process_time()
    start = box.counts[kind]
    await asyncio.sleep(seconds)
    if aligned:
        await box.until(kind, box.counts[kind] + 1)
    t1 = box.arrivals[kind][-1] if aligned else time.monotonic()
    # One arrival per cycle after t0, t1's included (t0's is the cycle before): n cycles in t1 - t0.
    n = box.counts[kind] - start
    others = sum(box.counts.values()) - before - n
    # Bytes of the requests answered in the window: the last arrival's are counted at its answer.
    return Idle(n, t1 - t0, box.bytes[kind] - bytes0, others, time.process_time() - cpu0)


class UnpooledPeerClient(PeerClient):
    """Without aiohttp's cap of 100 pooled connections, so N per-task long-polls are all in flight."""

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=CALL_TIMEOUT_S)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))


async def baseline_idle(pair: Pair, children: list[tuple[str, str]], *, chunk: float, seconds: float) -> Idle:
    """One long-poll loop per task (each its own run's `/wait`, timeout = the chunk), stopped by a
    flag after its current call (never cancelled mid-call)."""
    assert pair.laptop.identity is not None
    own_db = await Database.open(pair.laptop.paths.db)  # its own connections: the daemon's stay untouched
    client = UnpooledPeerClient(own_db, own_env_id=pair.laptop.identity.env_id)
    await client.start()
    answered, stop, errors = set[int](), asyncio.Event(), collections.Counter[str]()
    warm = asyncio.Event()

    async def loop(i: int, thread_id: str, run_id: str) -> None:
        await asyncio.sleep(random.uniform(0, chunk))  # tasks start at different times
        while not stop.is_set():
            try:
                path = f"/v1/threads/{thread_id}/wait"
                await client.call(pair.box_id, "GET", path, params={"run": run_id, "timeout": chunk})
            except PeerdError as exc:
                errors[exc.code] += 1
                await asyncio.sleep(1)
            answered.add(i)
            if len(answered) == len(children):
                warm.set()

    loops = [asyncio.create_task(loop(i, t, r)) for i, (t, r) in enumerate(children)]
    try:
        await asyncio.wait_for(warm.wait(), timeout=60 + 4 * chunk)
        result = await window("wait", seconds)
    finally:
        stop.set()
        await asyncio.wait(loops, timeout=chunk + 30)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await client.close()
        await own_db.close()
    if errors:
        say(f"baseline errors: {dict(errors)}")
    return result


# --- 2. wake latency -------------------------------------------------------------------------------


class StdlibClient:
    """The floor of a loopback HTTPS round trip (issue 33): a stdlib `http.client` keep-alive
    connection to the box, `GET /.well-known/peerd`. It blocks, and the box serves from this
    process's loop, so each request runs in a thread; the time is taken inside the thread, around
    the request alone (the thread hop is not counted)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        context = ssl.create_default_context()
        context.check_hostname = False  # the box's self-signed identity certificate: not a CA's
        context.verify_mode = ssl.CERT_NONE
        self.host = f"{parts.hostname}:{parts.port}"
        self.conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context, timeout=10)

    def _once(self) -> float:
        t0 = time.perf_counter()
        self.conn.request("GET", "/.well-known/peerd", headers={"Host": self.host})
        response = self.conn.getresponse()
        response.read()
        elapsed = time.perf_counter() - t0
        if response.status != 200:
            raise RuntimeError(f"stdlib round trip: HTTP {response.status}")
        return elapsed

    async def once(self) -> float:
        return await asyncio.to_thread(self._once)

    def close(self) -> None:
        self.conn.close()


async def round_trips(pair: Pair, n: int) -> dict[str, list[float]]:
    """Interleaved: a stdlib keep-alive HTTPS request (the floor), the bare pinned-TLS probe
    through aiohttp, and the follower's own call answered at once."""
    link = await links.get(pair.laptop_db, pair.box_id)
    assert link is not None
    stdlib = StdlibClient(link.urls[0])
    steps: dict[str, Callable[[], Awaitable[Any]]] = {
        "stdlib": stdlib.once,
        "probe": lambda: pair.peers.probe(link.urls[0], link.fingerprint),
        "poll": lambda: pair.peers.call(pair.box_id, "POST", CHANGES_PATH, body={"timeout": 0}),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    try:
        for i in range(n + 3):  # the first 3 warm the pooled connection
            for name, step in steps.items():
                t0 = time.perf_counter()
                inner = await step()
                took = inner if name == "stdlib" else time.perf_counter() - t0
                if i >= 3:
                    times[name].append(took)
    finally:
        stdlib.close()
    return times


async def follow_events(client: LocalClient, thread_id: str, until: Callable[[], Awaitable[Any]]) -> Any:
    """Re-check `until()` each time the thread has new events (an events long-poll, no sleeps)."""
    cursor = 0
    while not (found := await until()):
        page = await client.call(
            "GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 30}
        )
        cursor = page["nextCursor"]
    return found


async def one_wake(pair: Pair, root: Path, key: str) -> float:
    """Seconds from the box run's end to the laptop task's end (stored timestamps, one clock)."""
    hold = root / f"hold-{key}"
    child = script({"reply": "WAITING"}, {"wait_for_file": str(hold)}, {"reply": "BENCH DONE"})
    delegate = {
        "tool": {
            "name": "delegate_task",
            "arguments": {
                "task": child,
                "target": {"environmentId": pair.box_id, "projectId": pair.box_project},
                "clientRequestId": key,
            },
            "check": True,
        }
    }
    launched = await pair.lc.call(
        "POST",
        "/v1/threads",
        body={"projectId": pair.laptop_project, "prompt": runs_script([delegate], [{"reply": "woken"}])},
    )
    parent = launched["threadId"]

    async def running() -> dict[str, Any] | None:
        items = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
        return items[0] if items and items[0]["status"] == "running" else None

    task = await follow_events(pair.lc, parent, running)
    child_thread, child_run = task["remoteChild"]["threadId"], task["remoteChild"]["runId"]

    async def child_waiting() -> bool:
        items = (await pair.bc.call("GET", f"/v1/threads/{child_thread}/items"))["items"]
        return any(item["kind"] == "assistant_message" for item in items)

    await follow_events(pair.bc, child_thread, child_waiting)
    hold.write_text("go")

    async def completed() -> dict[str, Any] | None:
        info: dict[str, Any] = await pair.lc.call("GET", f"/v1/tasks/{task['taskId']}")
        if info["status"] not in ("running", "completed"):
            raise SystemExit(f"error: the bench task did not complete: {info}")
        return info if info["status"] == "completed" else None

    done = await follow_events(pair.lc, parent, completed)
    if done["result"] != "BENCH DONE":
        raise SystemExit(f"error: unexpected result {done['result']!r}")
    run = await threads.get_run(pair.box_db, child_run)
    row = await tasks.get(pair.laptop_db, task["taskId"])
    assert run.ended_at is not None and row.ended_at is not None
    if row.woken_run_id is not None:  # the parent's wake run ends before the next rep
        await pair.lc.call(
            "GET", f"/v1/threads/{parent}/wait", params={"run": row.woken_run_id, "timeout": 30}
        )
    return row.ended_at - run.ended_at


# --- the run ------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


@dataclass
class Stage:
    n: int
    sync_s: float
    idle: Idle
    wakes: list[float]
    rtt: dict[str, list[float]]
    looks_per_wake: float
    baseline_per_task: Idle | None = None
    baseline_tasks: int = 0

    def wake_ms(self, q: float) -> float:
        return pct(self.wakes, q)

    def rtt_ms(self, name: str) -> float:
        return statistics.median(self.rtt[name]) * 1000


@dataclass
class Results:
    args: argparse.Namespace
    stages: list[Stage] = field(default_factory=list)
    baseline: Idle | None = None


async def run(args: argparse.Namespace) -> Results:
    results = Results(args)
    with tempfile.TemporaryDirectory(prefix="peerd-bench-wake-") as tmp:
        root = Path(tmp) / "holds"  # the files the box's confined children wait for: visible to them
        root.mkdir()
        os.environ[READABLE_ENV] = ":".join(filter(None, [os.environ.get(READABLE_ENV), str(root)]))
        async with linked_pair(Path(tmp), chunk=args.chunk) as pair:
            have = 0
            all_children: list[tuple[str, str]] = []
            for n in args.sizes:
                t0 = time.monotonic()
                all_children += await insert_idle_tasks(pair, have, n - have)
                have = n
                sync_s = await followed(pair, n)
                say(
                    f"N={n}: inserted and followed in {time.monotonic() - t0:.1f}s (subscription {sync_s:.1f}s)"
                )
                rtt = await round_trips(pair, args.round_trips)
                idle = await window("poll", args.window if n else 5.0, aligned=n > 0)
                if idle.other_requests:
                    say(f"N={n}: {idle.other_requests} other request(s) during the idle window")
                reps = args.reps if n <= 1000 else args.big_reps
                if not results.stages:  # one wake first, not counted: connections and the box's feed warm up
                    await one_wake(pair, root, "warm-up")
                looks0 = pair.hub_looks()
                wakes = [await one_wake(pair, root, f"wake-{n}-{i}") for i in range(reps)]
                looks = (pair.hub_looks() - looks0) / reps
                stage = Stage(n, sync_s, idle, wakes, rtt, looks)
                if n and n == args.baseline_at and not args.skip_baseline:
                    loops = all_children[: args.baseline_tasks]
                    t0 = time.monotonic()
                    measured = await baseline_idle(pair, loops, chunk=args.chunk, seconds=args.window)
                    results.baseline = measured
                    stage.baseline_tasks = len(loops)
                    say(f"baseline ({len(loops)} loops): {time.monotonic() - t0:.1f}s")
                results.stages.append(stage)
                say(f"N={n}: wake p50 {stage.wake_ms(0.5):.1f} ms over {reps}")
    return results


def report(r: Results) -> dict[str, Any]:
    a = r.args
    # Requests per minute at the production chunk: a poll waits the chunk less its margin (4 s at
    # 5 s, 45 s at 50 s), so the rate scales with that wait, not with the chunk.
    scale = (a.chunk - watch_margin(a.chunk)) / (PRODUCTION_CHUNK_S - watch_margin(PRODUCTION_CHUNK_S))
    base = r.baseline
    base_tasks = next((s.baseline_tasks for s in r.stages if s.baseline_tasks), 0)
    per_task_min = base.per_min / base_tasks if base and base_tasks else None
    per_task_bytes = base.bytes_per_min / base_tasks if base and base_tasks else None
    print(
        f"\npeerd change-feed benchmark: chunk {a.chunk:g} s (production {PRODUCTION_CHUNK_S:g} s), idle window"
        f" {a.window:g} s, {os.cpu_count()} CPUs, both daemons in one process, loopback TLS"
    )
    print("\n1. Idle cost per link, counted at the box (peerd: one change-feed poll per chunk)")
    head = (
        f"{'N':>6} {'polls':>5} {'req/min':>8} {'@50 s':>6} {'B/poll':>7} {'B/min':>8} {'CPU s/min':>9}"
        f" {'base req/min':>12} {'base B/min':>11} {'x req':>7}"
    )
    print("   " + head)
    idle_out: dict[str, Any] = {}
    for s in r.stages:
        i = s.idle
        base_min = per_task_min * s.n if per_task_min is not None else None
        base_b = per_task_bytes * s.n if per_task_bytes is not None else None
        ratio = base_min / i.per_min if base_min and i.per_min else None
        print(
            f"   {s.n:6d} {i.requests:5d} {i.per_min:8.1f} {i.per_min * scale:6.2f} {i.bytes / max(i.requests, 1):7.0f}"
            f" {i.bytes_per_min:8.0f} {i.cpu_s * 60 / max(i.seconds, 1e-9):9.2f}"
            f" {base_min or 0:12.0f} {base_b or 0:11.0f} {ratio or 0:7.0f}"
        )
        idle_out[str(s.n)] = {
            "requests_per_min": round(i.per_min, 2),
            "requests_per_min_at_50s_chunk": round(i.per_min * scale, 3),
            "bytes_per_min": round(i.bytes_per_min),
            "bytes_per_poll": round(i.bytes / max(i.requests, 1)),
            "cpu_s_per_min": round(i.cpu_s * 60 / max(i.seconds, 1e-9), 3),
            "baseline_requests_per_min": None if base_min is None else round(base_min),
            "baseline_bytes_per_min": None if base_b is None else round(base_b),
            "ratio_baseline_requests": None if ratio is None else round(ratio),
            "subscription_sync_s": round(s.sync_s, 2),
        }
    if base is not None:
        print(
            f"   (baseline: {base_tasks} per-task loops measured, {base.per_min:.0f} req/min and"
            f" {base.bytes_per_min:.0f} B/min, scaled to N per task; @50 s: peerd's rate at the production chunk)"
        )
    print("\n2. Wake latency: remote run ends -> parent task completed (ms)")
    columns = (
        ("N", 6),
        ("reps", 4),
        ("p50", 7),
        ("p95", 7),
        ("stdlib", 6),
        ("x stdlib", 8),
        ("probe", 6),
        ("x probe", 7),
        ("poll", 6),
        ("x poll", 6),
    )
    print("   " + " ".join(f"{name:>{width}}" for name, width in (*columns, ("looks", 5))))
    wake_out: dict[str, Any] = {}
    for s in r.stages:
        floor, probe, poll = s.rtt_ms("stdlib"), s.rtt_ms("probe"), s.rtt_ms("poll")
        p50, p95 = s.wake_ms(0.5), s.wake_ms(0.95)
        print(
            f"   {s.n:6d} {len(s.wakes):4d} {p50:7.1f} {p95:7.1f} {floor:6.2f} {p50 / floor:8.1f}"
            f" {probe:6.2f} {p50 / probe:7.1f} {poll:6.2f} {p50 / poll:6.1f} {s.looks_per_wake:5.1f}"
        )
        wake_out[str(s.n)] = {
            "reps": len(s.wakes),
            "p50_ms": round(p50, 2),
            "p95_ms": round(p95, 2),
            "each_ms": [round(w * 1000, 2) for w in s.wakes],
            "round_trip_stdlib_ms": round(floor, 3),
            "round_trip_probe_ms": round(probe, 3),
            "round_trip_poll_ms": round(poll, 3),
            "x_round_trip": round(p50 / floor, 2),
            "x_round_trip_aiohttp": round(p50 / probe, 2),
            "box_threads_looked_at_per_wake": round(s.looks_per_wake, 1),
        }
    print("   (stdlib: a keep-alive http.client HTTPS GET /.well-known/peerd, the floor; probe: the same")
    print("    through aiohttp, pinned TLS; poll: the follower's own authenticated call answered at once;")
    print("    looks: box threads read per wake, whatever N)")
    first, last = r.stages[0], r.stages[-1]
    flat = last.wake_ms(0.5) / first.wake_ms(0.5)
    print(f"   flat in N: p50 at N={last.n} is {flat:.2f}x the p50 at N={first.n}")
    idle_x = first.wake_ms(0.5) / first.rtt_ms("stdlib")
    worst_x = max(s.wake_ms(0.5) / s.rtt_ms("stdlib") for s in r.stages)
    worst_min = max(s.idle.per_min * scale for s in r.stages)
    print("\nGoals (issues 14 and 33; ratios to the stdlib round trip):")
    print(
        f"   wake on an idle link <= {GOALS['wake_idle_x']:g}x a round trip: {idle_x:.1f}x",
        _met(idle_x <= GOALS["wake_idle_x"]),
    )
    print(
        f"   wake at every N <= {GOALS['wake_x']:g}x a round trip: worst {worst_x:.1f}x",
        _met(worst_x <= GOALS["wake_x"]),
    )
    print(
        f"   idle <= {GOALS['requests_per_min']:g} requests/min per link at the production chunk, any N:"
        f" worst {worst_min:.2f} {_met(worst_min <= GOALS['requests_per_min'])}"
    )
    return {
        "wake": {"chunk_s": a.chunk, "sizes": wake_out, "flat_ratio": round(flat, 2)},
        "idle": {"chunk_s": a.chunk, "sizes": idle_out},
    }


def _met(ok: bool) -> str:
    return "(met)" if ok else "(NOT met)"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sizes", default="0,1000,10000", help="other open tasks on the link (default 0,1000,10000)"
    )
    p.add_argument("--chunk", type=float, default=5.0, help="the follower's long-poll chunk, s (default 5)")
    p.add_argument("--window", type=float, default=10.0, help="idle counting window, s (default 10)")
    p.add_argument("--reps", type=int, default=7, help="wakes at N <= 1000 (default 7)")
    p.add_argument("--big-reps", type=int, default=5, help="wakes at larger N (default 5)")
    p.add_argument("--round-trips", type=int, default=30, help="round trips per baseline median (default 30)")
    p.add_argument("--baseline-tasks", type=int, default=1000, help="per-task loops measured (default 1000)")
    p.add_argument(
        "--baseline-at", type=int, default=1000, help="the N the baseline is measured at (default 1000)"
    )
    p.add_argument("--skip-baseline", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-save", action="store_true", help="do not write bench/results.json")
    args = p.parse_args(argv)
    args.sizes = sorted({int(x) for x in args.sizes.split(",")})
    if args.sizes[0] < 0 or args.chunk <= 0 or args.window <= 0 or args.reps < 1 or args.big_reps < 1:
        p.error("sizes must be >= 0; --chunk, --window, --reps and --big-reps positive")
    return args


if __name__ == "__main__":
    arguments = parse()
    configure_logging(json=False, level=logging.WARNING)
    started = time.monotonic()
    figures = report(asyncio.run(run(arguments)))
    if not arguments.no_save:
        save_results(figures)
    print(f"\n(total {time.monotonic() - started:.0f}s)")
