"""Benchmark: the laptop's restart with N open remote tasks - resume time and an idle daemon's RSS.

Two daemons linked over TLS on loopback, as in bench/wake.py (whose helpers make the N open tasks
cheaply: box threads whose run is queued behind a held queue, and running laptop tasks pointing at
them). The box runs in this process all along; the laptop is the one restarted:

1. Resume (in this process): the laptop daemon is shut down and a new one started on its home;
   from the start to `Daemon.start` returning ("started"), and to every open task watched again
   ("resumed": the link's follower holds all N in its subscription, synced with the box, and a
   poll is in flight). At N = 0 (baseline, measured first) and at `--tasks` (10,000); `--reps`
   restarts each, medians.
2. RSS: the laptop as its own process (`peerd serve`), idle once its follower polls: `VmRSS` from
   /proc, `--settle` seconds after it answered; at N = 0 (baseline) and at N = `--tasks`.

Run: .venv/bin/python bench/resume.py [--tasks 10000] [--reps 3] [--no-save]
Figures under "resume" in bench/results.json; bench/README.md says what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchlib import load_average, peerd_argv, save_results
from wake import Pair, insert_idle_tasks, make_repo

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon, DaemonConfig
from peerd.errors import DaemonNotRunning
from peerd.logs import configure_logging

GOAL_RESUME_S = 1.0  # issue 14: resume at start-up with 10,000 open remote tasks


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def laptop_config(root: Path) -> DaemonConfig:
    return DaemonConfig(home=root / "laptop", label="laptop", listen="127.0.0.1:0")


@contextlib.asynccontextmanager
async def box_and_laptop(root: Path) -> AsyncIterator[Pair]:
    box = Daemon(DaemonConfig(home=root / "box", label="box", listen="127.0.0.1:0"))
    laptop = Daemon(laptop_config(root))
    await box.start()
    try:
        await laptop.start()
        async with LocalClient(laptop.paths.socket) as lc, LocalClient(box.paths.socket) as bc:
            here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "laptop-repo"))})
            there = await bc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "box-repo"))})
            code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
            await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
            pair = Pair(laptop, box, lc, bc, here["id"], there["id"])
            try:
                yield pair
            finally:
                await pair.laptop.shutdown()
    finally:
        await box.shutdown()


def steady(pair: Pair, n: int) -> bool:
    f = pair.follower()
    return f is not None and f.machine.polling and f.machine.sub.settled and len(f.machine.sub.want) == n


async def until(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} did not happen within {within:.0f} s")
        await asyncio.sleep(0.002)


async def restart(pair: Pair, root: Path, n: int) -> tuple[float, float]:
    """Shut the laptop down and start it again; (seconds to started, seconds to resumed)."""
    await pair.laptop.shutdown()
    laptop = Daemon(laptop_config(root))
    t0 = time.perf_counter()
    await laptop.start()
    started = time.perf_counter() - t0
    pair.laptop = laptop
    if n:
        await until(lambda: steady(pair, n), 60, f"resuming {n} tasks")
    return started, time.perf_counter() - t0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def idle_rss(pair: Pair, root: Path, settle_s: float, *, config: DaemonConfig | None = None) -> int:
    """The laptop as its own `peerd serve` process, idle: its RSS (KiB). The in-process laptop is
    stopped first and started again afterwards (with `config`, whose home it serves, if given)."""
    config = config or laptop_config(root)
    await pair.laptop.shutdown()
    home = config.home
    argv = [*peerd_argv(), "--home", str(home), "serve", "--listen", "127.0.0.1:0", "--log-level", "warning"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                async with LocalClient(pair.laptop.paths.socket) as client:
                    await client.call("GET", "/v1/projects")  # the whole daemon serving
                break
            except DaemonNotRunning:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError("the laptop's peerd serve did not start") from None
                await asyncio.sleep(0.05)
        await asyncio.sleep(settle_s)
        return rss_kib(proc.pid)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        pair.laptop = Daemon(config)
        await pair.laptop.start()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"tasks": args.tasks, "reps": args.reps}
    with tempfile.TemporaryDirectory(prefix="peerd-bench-resume-") as tmp:
        root = Path(tmp)
        async with box_and_laptop(root) as pair:
            for n in (0, args.tasks):
                if n:
                    t0 = time.monotonic()
                    await insert_idle_tasks(pair, 0, n)
                    assert pair.laptop.followers is not None
                    pair.laptop.followers.notify(pair.box_id)
                    await until(lambda n=n: steady(pair, n), 120, f"following {n} tasks")
                    say(f"N={n}: inserted and followed in {time.monotonic() - t0:.1f} s")
                times = [await restart(pair, root, n) for _ in range(args.reps)]
                rss = await idle_rss(pair, root, args.settle)
                figures[str(n)] = {
                    "started_s": round(statistics.median(t for t, _ in times), 3),
                    "resumed_s": round(statistics.median(r for _, r in times), 3),
                    "each_resumed_s": [round(r, 3) for _, r in times],
                    "idle_rss_mib": round(rss / 1024, 1),
                }
                say(f"N={n}: {figures[str(n)]}")
    base, big = figures["0"], figures[str(args.tasks)]
    figures["ratio_resumed_to_empty"] = round(big["resumed_s"] / base["resumed_s"], 2)
    figures["ratio_rss_to_empty"] = round(big["idle_rss_mib"] / base["idle_rss_mib"], 2)
    figures["goal_resume_s"] = GOAL_RESUME_S
    figures["met"] = big["resumed_s"] <= GOAL_RESUME_S
    figures["load_average_1m"] = load_average()
    figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return figures


def table(f: dict[str, Any]) -> str:
    n = str(f["tasks"])
    lines = [
        f"Laptop restart with open remote tasks (median of {f['reps']})",
        f"   {'open tasks':<14}{'started s':>10}{'resumed s':>10}{'idle RSS MiB':>14}",
    ]
    for key in ("0", n):
        row = f[key]
        lines.append(
            f"   {key:<14}{row['started_s']:>10.3f}{row['resumed_s']:>10.3f}{row['idle_rss_mib']:>14.1f}"
        )
    lines.append(
        f"   x empty: resumed {f['ratio_resumed_to_empty']}, RSS {f['ratio_rss_to_empty']}; "
        f"goal resumed <= {GOAL_RESUME_S:.0f} s at {n}: {'met' if f['met'] else 'NOT met'}"
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle before RSS is read")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    configure_logging(json=True, level=40)  # errors only: the bench's own lines are on stderr
    figures = asyncio.run(run(args))
    print(table(figures))
    if not args.no_save:
        save_results({"resume": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
