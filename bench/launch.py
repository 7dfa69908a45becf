"""Benchmark: forwarded launches over TLS, retry storms, and delegate_task -> remote child running.

Two real daemons, "laptop" and "box", each its own `peerd serve` process (real SQLite files, a
real TLS listener on loopback), linked the way `peerd pair` / `peerd link` link them. This process
is only the client: it talks to the laptop's Unix socket, and the laptop forwards through the link.

1. Launch throughput. `POST /v1/threads` on the laptop naming the box (`environmentId`), the
   scripted provider with an immediate reply, each with its own `clientRequestId`, at concurrency
   1, 10 and 50. An ack is the laptop's answer (the thread exists on the box, its run queued there);
   acks per second over the whole phase, and p50/p95 of one ack. Baseline, interleaved at the same
   concurrency: a forwarded read through the same link (`GET /v1/threads?environmentId=box&limit=1`),
   answered per second. The box's runs (worktree, process) drain before the next phase starts.
2. Retry storm. K new keys, each sent 10 times (shuffled, concurrency 50): every answer for a key
   must name the same thread, and the box must hold exactly K new threads (counted in its store).
3. delegate_task -> remote child running: a scripted parent on the laptop calls `delegate_task`
   with the box as target; from the task's record on the laptop (`tasks.created_at`) to the box's
   `run.updated` event for `running` of the child (both stored by the same clock). Measured on a
   fresh repository and again with at least 1,000 worktrees in the box's checkout (topped up with
   plain `git worktree add`). Baseline: the forwarded read's median latency.

Run: .venv/bin/python bench/launch.py [--launches 300] [--storm-keys 30] [--reps 5] [--no-save]
     [--profile DIR]: py-spy (if installed) samples both daemons during parts 1-2.
See bench/README.md for what the columns mean and the numbers measured.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import save_results, unreliable_load

from peerd.api.localclient import LocalClient
from peerd.errors import DaemonNotRunning

GIT_ENV = {
    "GIT_AUTHOR_NAME": "peerd bench",
    "GIT_AUTHOR_EMAIL": "bench@peerd.invalid",
    "GIT_COMMITTER_NAME": "peerd bench",
    "GIT_COMMITTER_EMAIL": "bench@peerd.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
ORIGIN = "git@github.com:peerd/bench-launch.git"
GOAL_ACKS = 200.0  # acks/s at c=50 (issue 14)
GOAL_DELEGATE_MS = 50.0  # delegate_task -> remote child running, at 1,000 worktrees
# Issue 14's goals are absolute, set on this machine when it was quiet; the machine is shared and its
# speed varies by 2x and more from hour to hour (a forwarded read: 3.8 to 17 ms). So the verdict is
# taken, like bench/cli_start.py's, against the baseline measured side by side in the same run: the
# goal scaled by the forwarded reads of the quiet run in which the goals were first met (2026-12-01:
# 528.6 reads/s at c=50, a read's median 3.84 ms). The absolute figures are printed beside it.
REF_READS_PER_S_C50 = 528.6
REF_READ_MS = 3.84
GOAL_ACKS_X_READS = GOAL_ACKS / REF_READS_PER_S_C50  # 0.378: acks/s over reads/s at c=50, at least
GOAL_DELEGATE_X_READ = GOAL_DELEGATE_MS / REF_READ_MS  # 13.0: delegate p50 over a read's median, at most


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    )
    return done.stdout


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# bench\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    git(path, "remote", "add", "origin", ORIGIN)
    return path


def script(*steps: dict[str, Any]) -> str:
    return "```peerd-script\n" + json.dumps({"steps": list(steps)}) + "\n```"


# --- the daemons ---------------------------------------------------------------------------------


@dataclass
class Proc:
    home: Path
    label: str
    proc: subprocess.Popen[bytes]

    @property
    def socket(self) -> Path:
        from peerd.paths import Paths  # noqa: PLC0415

        return Paths(self.home).socket

    @property
    def db(self) -> Path:
        return self.home / "peerd.db"

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read of the daemon's store from outside (WAL: readers never block its writer)."""
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return con.execute(sql, params).fetchall()
        finally:
            con.close()


def start_daemon(home: Path, label: str, start_slots: int | None = None) -> Proc:
    home.mkdir(parents=True)
    if start_slots is not None:  # else the default (the CPUs, at least 2)
        (home / "config.toml").write_text(f"[runs]\nstart_slots = {start_slots}\n")
    log = open(home / "daemon.log", "ab")  # noqa: SIM115  # closed after the spawn
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--label", label, "--log-level", "warning"], stdout=log, stderr=log, stdin=subprocess.DEVNULL
    )
    log.close()
    return Proc(home, label, proc)


async def ready(daemon: Proc, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            async with LocalClient(daemon.socket) as client:
                await client.call("GET", "/v1/status")
                await client.call("GET", "/v1/projects")  # served by the whole daemon, not only status
                return
        except DaemonNotRunning:
            if daemon.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((daemon.home / "daemon.log").read_text()) from None
            await asyncio.sleep(0.05)


def stop(daemon: Proc) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(20)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait()


@dataclass
class Setup:
    laptop: Proc
    box: Proc
    lc: LocalClient
    box_id: str
    box_project: str
    laptop_project: str
    box_repo: Path


@contextlib.asynccontextmanager
async def linked(root: Path, start_slots: int | None = None) -> AsyncIterator[Setup]:
    box = start_daemon(root / "box", "box", start_slots)
    laptop = start_daemon(root / "laptop", "laptop")
    try:
        await ready(box)
        await ready(laptop)
        box_repo = make_repo(root / "box-repo")
        async with LocalClient(box.socket) as bc, LocalClient(laptop.socket) as lc:
            there = await bc.call("POST", "/v1/projects", body={"path": str(box_repo)})
            here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "laptop-repo"))})
            code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
            await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
            box_id = (await bc.call("GET", "/v1/status"))["envId"]
            yield Setup(laptop, box, lc, box_id, there["id"], here["id"], box_repo)
    finally:
        for daemon in (laptop, box):
            stop(daemon)


def cpu_s(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its reaped children's), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def cpu_mark(s: Setup) -> tuple[float, float, float]:
    laptop, _ = cpu_s(s.laptop.proc.pid)
    box, runs = cpu_s(s.box.proc.pid)
    return laptop, box, runs


def cpu_per(
    before: tuple[float, float, float], after: tuple[float, float, float], n: int
) -> dict[str, float]:
    names = ("laptop", "box", "box_runs")
    return {k: round((b - a) * 1000 / n, 2) for k, a, b in zip(names, before, after, strict=True)}


def box_busy(s: Setup) -> int:
    return int(
        s.box.query("SELECT count(*) FROM runs WHERE status IN ('queued', 'starting', 'running')")[0][0]
    )


def box_threads(s: Setup) -> int:
    return int(s.box.query("SELECT count(*) FROM threads")[0][0])


STALL_S = 120.0  # a drain gives up only after this long without a single run ending


async def drained(s: Setup, stall_s: float = STALL_S) -> float:
    """Wait until the box has no queued or live run; returns the seconds it took. Bounded by work
    done, not by a fixed time (issue 33): a loaded machine drains slowly but drains; only a drain
    that makes no progress for `stall_s` is given up."""
    t0 = last_progress = time.monotonic()
    left = box_busy(s)
    while left:
        await asyncio.sleep(0.1)
        now_left = box_busy(s)
        if now_left < left:
            last_progress = time.monotonic()
        left = now_left
        if left and time.monotonic() - last_progress > stall_s:
            raise RuntimeError(f"the box still has {left} runs, none ended in the last {stall_s:.0f} s")
    return time.monotonic() - t0


# --- 1 and 2: launches ---------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    concurrency: int
    count: int
    seconds: float
    latencies: list[float]
    errors: int = 0
    drain_s: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per launch: laptop, box, box's runs

    @property
    def per_s(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def pool(concurrency: int, jobs: list[Callable[[], Awaitable[None]]]) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def launch_body(s: Setup, key: str) -> dict[str, Any]:
    return {
        "projectId": s.box_project,
        "environmentId": s.box_id,
        "prompt": script({"reply": "done"}),
        "title": "bench launch",
        "clientRequestId": key,
    }


async def launches(
    s: Setup, name: str, concurrency: int, keys: list[str]
) -> tuple[Phase, dict[str, set[str]]]:
    latencies: list[float] = []
    seen: dict[str, set[str]] = {}
    errors = 0

    def job(key: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                answer = await s.lc.call("POST", "/v1/threads", body=launch_body(s, key))
            except Exception as exc:  # counted and shown, the bench goes on
                errors += 1
                if errors <= 3:
                    say(f"   launch error: {type(exc).__name__}: {exc}")
                return
            latencies.append(time.perf_counter() - t0)
            seen.setdefault(key, set()).add(answer["threadId"])

        return go

    t0 = time.perf_counter()
    await pool(concurrency, [job(k) for k in keys])
    phase = Phase(name, concurrency, len(keys), time.perf_counter() - t0, latencies, errors)
    return phase, seen


async def reads(s: Setup, concurrency: int, count: int) -> Phase:
    latencies: list[float] = []

    async def go() -> None:
        t0 = time.perf_counter()
        await s.lc.call("GET", "/v1/threads", params={"environmentId": s.box_id, "limit": 1})
        latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await pool(concurrency, [go] * count)
    return Phase("forwarded read", concurrency, count, time.perf_counter() - t0, latencies)


# --- 3: delegate -> running ----------------------------------------------------------------------


def worktree_count(repo: Path) -> int:
    admin = repo / ".git" / "worktrees"
    return sum(1 for _ in admin.iterdir()) if admin.is_dir() else 0


def top_up_worktrees(repo: Path, root: Path, at_least: int) -> int:
    have = worktree_count(repo)
    missing = max(0, at_least - have)
    if missing:
        (root / "fill").mkdir(exist_ok=True)
        # One repository's worktree bookkeeping is not safe under concurrent adds: one at a time.
        for i in range(missing):
            git(repo, "worktree", "add", "-q", "-b", f"fill/{i}", str(root / "fill" / f"w{i}"))
    return worktree_count(repo)


async def one_delegate(s: Setup, i: int) -> float:
    child = script({"reply": "child done"})
    delegate = {
        "tool": {
            "name": "delegate_task",
            "arguments": {
                "task": child,
                "target": {"environmentId": s.box_id, "projectId": s.box_project},
                "clientRequestId": f"delegate-{i}-{time.monotonic_ns()}",
            },
            "check": True,
        }
    }
    launched = await s.lc.call(
        "POST", "/v1/threads", body={"projectId": s.laptop_project, "prompt": script(delegate)}
    )
    parent = launched["threadId"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = s.laptop.query(
            "SELECT created_at, child_thread_id, status FROM tasks WHERE parent_thread_id = ?", (parent,)
        )
        if rows and rows[0][1]:
            created, child_thread = float(rows[0][0]), str(rows[0][1])
            running = s.box.query(
                "SELECT min(created_at) FROM events WHERE thread_id = ? AND type = 'run.updated'"
                " AND json_extract(data, '$.status') = 'running'",
                (child_thread,),
            )
            if running and running[0][0] is not None:
                return float(running[0][0]) - created
        await asyncio.sleep(0.02)
    raise RuntimeError(f"the delegated child of {parent} never ran")


async def delegates(s: Setup, reps: int) -> list[float]:
    found = []
    for i in range(reps):
        found.append(await one_delegate(s, i))
        await drained(s)
    return found


# --- profiling -----------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled(s: Setup, out: Path | None) -> Any:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if out is None or not Path(spy).exists():
        if out is not None:
            say("   (py-spy is not installed: no profile)")
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--nonblocking",
                "--gil",  # only samples holding the GIL: where the CPU goes, not the waits
                "-r",
                "200",
                "-f",
                "raw",
                "-o",
                str(out / f"{d.label}.txt"),
                "-p",
                str(d.proc.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for d in (s.laptop, s.box)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait(30)
        say(f"   profiles (collapsed stacks) in {out}")


# --- report --------------------------------------------------------------------------------------


@dataclass
class Results:
    phases: list[tuple[Phase, Phase]] = field(default_factory=list)
    storm: Phase | None = None
    storm_keys: int = 0
    duplicates: int = 0
    split_keys: int = 0
    delegate_fresh: list[float] = field(default_factory=list)
    delegate_loaded: list[float] = field(default_factory=list)
    worktrees: int = 0
    read_ms: float = 0.0
    # Why a figure may be off: the machine's load when a phase was measured (none: quiet).
    unreliable: list[str] = field(default_factory=list)

    def note_load(self, phase: str) -> None:
        why = unreliable_load()
        if why is not None:
            self.unreliable.append(f"{phase}: {why}")


def med_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else 0.0


def table(r: Results) -> str:
    lines = ["1. Forwarded launches over TLS (scripted, immediate reply)"]
    lines.append(
        f"   {'':<26}{'n':>5}{'acks/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'reads/s':>9}{'x read':>8}{'errors':>7}"
    )
    for launch, read in r.phases:
        ratio = launch.per_s / read.per_s if read.per_s else 0.0
        lines.append(
            f"   {'c=' + str(launch.concurrency):<26}{launch.count:>5}{launch.per_s:>9.1f}{launch.p(0.5):>9.1f}"
            f"{launch.p(0.95):>9.1f}{read.per_s:>9.1f}{ratio:>8.2f}{launch.errors:>7}"
            f"   CPU ms/launch: laptop {launch.cpu_ms.get('laptop', 0):.1f}, box {launch.cpu_ms.get('box', 0):.1f},"
            f" its runs {launch.cpu_ms.get('box_runs', 0):.1f}"
        )
    if r.storm is not None:
        lines.append(
            f"2. Retry storm: {r.storm_keys} keys x 10 = {r.storm.count} launches at c={r.storm.concurrency}: "
            f"{r.storm.per_s:.1f} answers/s, duplicates on the box {r.duplicates}, keys answered with "
            f"two threads {r.split_keys}, errors {r.storm.errors}"
        )
    lines.append("3. delegate_task -> remote child running (ms)")
    lines.append(f"   forwarded read, median: {r.read_ms:.2f} ms")
    for name, values in (
        ("fresh repository", r.delegate_fresh),
        (f"{r.worktrees} worktrees", r.delegate_loaded),
    ):
        if values:
            lines.append(
                f"   {name:<22} n={len(values)}  p50 {med_ms(values):7.1f}  max {max(values) * 1000:7.1f}"
                f"  x read {med_ms(values) / r.read_ms if r.read_ms else 0:6.1f}"
            )
    goals = figures(r)["goals"]
    acks, delegate = goals["acks_per_s_c50"], goals["delegate_ms_1000_worktrees"]
    lines.append(
        f"   goal: acks/s at c=50 >= {GOAL_ACKS:g} on the quiet machine = x reads >= {GOAL_ACKS_X_READS:.3f}: "
        f"x {acks['x_reads']} ({'met' if acks['met'] else 'NOT met'}; {acks['measured']} acks/s here)"
    )
    lines.append(
        f"   goal: delegate -> running at {r.worktrees} worktrees <= {GOAL_DELEGATE_MS:g} ms on the quiet machine"
        f" = x read <= {GOAL_DELEGATE_X_READ:.1f}: x {delegate['x_read']}"
        f" ({'met' if delegate['met'] else 'NOT met'}; {delegate['measured']} ms here)"
    )
    for why in r.unreliable:
        lines.append(f"   UNRELIABLE {why}")
    return "\n".join(lines)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def figures(r: Results) -> dict[str, Any]:
    c50, c50_reads = next(
        ((launch, read) for launch, read in r.phases if launch.concurrency == 50), (None, None)
    )
    acks_x = None if c50 is None or c50_reads is None else _ratio(c50.per_s, c50_reads.per_s)
    delegate_x = _ratio(med_ms(r.delegate_loaded), r.read_ms) if r.delegate_loaded else None
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "unreliable": r.unreliable,
        "launches": [
            {
                "concurrency": launch.concurrency,
                "count": launch.count,
                "acks_per_s": round(launch.per_s, 1),
                "p50_ms": round(launch.p(0.5), 1),
                "p95_ms": round(launch.p(0.95), 1),
                "errors": launch.errors,
                "baseline_reads_per_s": round(read.per_s, 1),
                "ratio_to_reads": round(launch.per_s / read.per_s, 3) if read.per_s else None,
                "drain_s": round(launch.drain_s, 2),
                "cpu_ms_per_launch": launch.cpu_ms,
            }
            for launch, read in r.phases
        ],
        "storm": None
        if r.storm is None
        else {
            "keys": r.storm_keys,
            "requests": r.storm.count,
            "answers_per_s": round(r.storm.per_s, 1),
            "duplicates": r.duplicates,
            "split_keys": r.split_keys,
            "errors": r.storm.errors,
        },
        "delegate_to_running_ms": {
            "baseline_read_ms": round(r.read_ms, 2),
            "fresh_p50": round(med_ms(r.delegate_fresh), 1),
            "worktrees": r.worktrees,
            "loaded_p50": round(med_ms(r.delegate_loaded), 1),
            "loaded_max": round(max(r.delegate_loaded) * 1000, 1) if r.delegate_loaded else None,
        },
        "goals": {
            "acks_per_s_c50": {
                "goal": GOAL_ACKS,
                "measured": None if c50 is None else round(c50.per_s, 1),
                "goal_x_reads": round(GOAL_ACKS_X_READS, 3),
                "x_reads": acks_x,
                "met": acks_x is not None and acks_x >= GOAL_ACKS_X_READS,
            },
            "storm_duplicates": {"goal": 0, "met": r.duplicates == 0 and r.split_keys == 0},
            "delegate_ms_1000_worktrees": {
                "goal": GOAL_DELEGATE_MS,
                "measured": round(med_ms(r.delegate_loaded), 1) if r.delegate_loaded else None,
                "goal_x_read": round(GOAL_DELEGATE_X_READ, 1),
                "x_read": delegate_x,
                "met": delegate_x is not None and delegate_x <= GOAL_DELEGATE_X_READ,
            },
        },
    }


async def measure_launches(s: Setup, r: Results, args: argparse.Namespace) -> None:
    with profiled(s, args.profile):
        for c, n in ((1, max(10, args.launches // 10)), (10, args.launches // 2), (50, args.launches)):
            say(f"1. {n} launches at concurrency {c} ...")
            read = await reads(s, c, max(c * 4, n // 2))
            mark = cpu_mark(s)
            launch, _ = await launches(s, f"c={c}", c, [f"l{c}-{i}" for i in range(n)])
            r.note_load(f"launches at c={c}")
            launch.drain_s = await drained(s)
            launch.cpu_ms = cpu_per(mark, cpu_mark(s), n)  # the runs' CPU counted once reaped
            r.phases.append((launch, read))
        say(f"2. retry storm: {args.storm_keys} keys x 10 ...")
        before = box_threads(s)
        keys = [f"storm-{i}" for i in range(args.storm_keys)] * 10
        random.shuffle(keys)
        r.storm, seen = await launches(s, "storm", 50, keys)
        r.note_load("retry storm")
        await drained(s)
        r.storm_keys = args.storm_keys
        r.duplicates = box_threads(s) - before - args.storm_keys
        r.split_keys = sum(1 for ids in seen.values() if len(ids) > 1)


async def measure_delegates(s: Setup, r: Results, args: argparse.Namespace, root: Path) -> None:
    say("3b. topping the box's checkout up to 1,000 worktrees ...")
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        r.worktrees = await loop.run_in_executor(ex, top_up_worktrees, s.box_repo, root, args.worktrees)
    say(f"3b. delegate -> running with {r.worktrees} worktrees ...")
    r.delegate_loaded = await delegates(s, args.reps)


async def main(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="peerd-bench-launch-"))
    r = Results()
    parts = set(args.parts.split(","))
    try:
        say("starting two daemons (subprocesses) and linking them ...")
        async with linked(root, args.start_slots) as s:
            if "delegate" in parts:
                say("3a. delegate -> running on a fresh repository ...")
                r.delegate_fresh = await delegates(s, args.reps)
            if "launches" in parts:
                await measure_launches(s, r, args)
            r.read_ms = med_ms((await reads(s, 1, 50)).latencies)
            if "delegate" in parts:
                await measure_delegates(s, r, args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            say(f"kept {root}")
    print(table(r))
    if not args.no_save:
        save_results({"launch": figures(r)})
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=300, help="launches at c=50 (c=10: half, c=1: a tenth)")
    p.add_argument("--storm-keys", type=int, default=30, help="distinct keys in the retry storm (x10)")
    p.add_argument("--reps", type=int, default=5, help="delegate -> running measurements per setting")
    p.add_argument("--profile", type=Path, default=None, help="py-spy raw profiles of both daemons here")
    p.add_argument(
        "--parts", default="launches,delegate", help="what to measure: launches (1-2), delegate (3)"
    )
    p.add_argument("--worktrees", type=int, default=1000, help="worktrees in the box's checkout for 3b")
    p.add_argument(
        "--start-slots", type=int, default=None, help="the box's [runs] start_slots (default: its default)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results.json")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
