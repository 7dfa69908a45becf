"""Benchmark: what placement costs - the capacity report on every change-feed answer, and `auto`.

Two real daemons in this process, "laptop" and "box" (real SQLite files, a real TLS listener on
loopback), linked the way `peerd pair` / `peerd link` link them; each has a checkout of one origin
(the repository key matches). Everything is interleaved, rep by rep, and reported as medians and
ratios against a baseline measured in the same run:

1. Feed answer: the follower's request answered at once (`POST /v1/feed/changes`, timeout 0) with
   the box's capacity report in it, against the same request with the report switched off
   (`FeedHub.capacity = None`, as an older box answers).
2. Launch: `POST /v1/threads` on the laptop with `environmentId: "auto"` (fresh reports: the choice
   reads only the laptop's store), against the same launch naming the box; and `auto` with every
   report stale (one `GET /v1/link` to the box first). The box is the one chosen (it prefers work).
3. Burst split (issue 33): a laptop that takes no `auto` work itself (`manual-only`) linked to
   boxes of equal or weighted `max_runs` (`--weights 1,1,1`: three equal boxes; `--weights 1,2,4`:
   max_runs in those proportions, times `--max-runs`, 4 by default: a burst of 60 is past their
   room, and spreads all the same), and `--burst` `auto` launches sent at once: where each went,
   against each box's share (`max_runs` over the total), then the runs drained. The drain is
   bounded by work done (it gives up after `--stall` seconds without a run ending), never by a
   fixed time; a figure taken with the load past one per CPU, or with a drain given up, is marked
   unreliable, with the reason.

Run: .venv/bin/python bench/placement.py [--reps 30] [--burst 60] [--weights 1,1,1] [--no-save]
     .venv/bin/python bench/placement.py --split-only --burst 12 --no-save   # the split alone, small
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import load_average, overloaded, save_results, unreliable_load

from peerd.api.localclient import LocalClient
from peerd.config import Config, ConsoleConfig, PlacementConfig
from peerd.daemon import Daemon, DaemonConfig
from peerd.logs import configure_logging
from peerd.tasks.feedwire import CHANGES_PATH

GIT_ENV = {
    "GIT_AUTHOR_NAME": "peerd bench",
    "GIT_AUTHOR_EMAIL": "bench@peerd.invalid",
    "GIT_COMMITTER_NAME": "peerd bench",
    "GIT_COMMITTER_EMAIL": "bench@peerd.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
REPLY = "```peerd-script\n" + json.dumps({"steps": [{"reply": "ok"}]}) + "\n```"


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["commit", "-q", "--allow-empty", "-m", "initial"],
        ["remote", "add", "origin", "git@github.com:peerd/bench.git"],
    ):
        subprocess.run(
            ["git", *args], cwd=path, env={**os.environ, **GIT_ENV}, capture_output=True, check=True
        )
    return path


@contextlib.asynccontextmanager
async def linked(root: Path) -> AsyncIterator[tuple[Daemon, Daemon, LocalClient, dict[str, str]]]:
    prefer = Config(placement=PlacementConfig(max_runs=1000, preference="prefer"))
    laptop = Daemon(DaemonConfig(home=root / "laptop", label="laptop", listen="127.0.0.1:0"))
    box = Daemon(DaemonConfig(home=root / "box", label="box", listen="127.0.0.1:0", settings=prefer))
    async with contextlib.AsyncExitStack() as stack:
        for daemon in (box, laptop):
            await daemon.start()
            stack.push_async_callback(daemon.shutdown)
        lc = await stack.enter_async_context(LocalClient(laptop.paths.socket))
        bc = await stack.enter_async_context(LocalClient(box.paths.socket))
        here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "laptop-repo"))})
        there = await bc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "box-repo"))})
        code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
        await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
        yield laptop, box, lc, {"here": here["id"], "there": there["id"]}


@dataclass
class Fleet:
    """A manual-only laptop linked to boxes: the daemons (`laptop` may be replaced, as a restart
    does; the one there at the end is shut down), their clients by label, and each side's project."""

    laptop: Daemon
    boxes: dict[str, Daemon]
    lc: LocalClient
    clients: dict[str, LocalClient]
    project: str
    box_projects: dict[str, str]


@contextlib.asynccontextmanager
async def fleet_daemons(
    root: Path,
    weights: list[int],
    unit: int,
    *,
    laptop_config: DaemonConfig | None = None,
    held: int = 0,
) -> AsyncIterator[Fleet]:
    """A manual-only laptop (or `laptop_config`, on `root / "laptop"`) linked to one box per weight
    (max_runs = weight x unit, plus `held` for runs the caller keeps queued there; labels box00,
    box01, ...), each with a checkout of one origin."""
    quiet = ConsoleConfig(enabled=False)  # several daemons in one process: no console port each
    manual = Config(placement=PlacementConfig(max_runs=unit, preference="manual-only"), console=quiet)
    laptop = Daemon(
        laptop_config
        or DaemonConfig(home=root / "laptop", label="laptop", listen="127.0.0.1:0", settings=manual)
    )
    boxes = {
        f"box{i:02}": Daemon(
            DaemonConfig(
                home=root / f"box{i:02}",
                label=f"box{i:02}",
                listen="127.0.0.1:0",
                settings=Config(placement=PlacementConfig(max_runs=weight * unit + held), console=quiet),
            )
        )
        for i, weight in enumerate(weights)
    }
    async with contextlib.AsyncExitStack() as stack:
        for box in boxes.values():
            await box.start()
            stack.push_async_callback(box.shutdown)
        await laptop.start()
        holder: list[Fleet] = []
        stack.push_async_callback(lambda: holder[0].laptop.shutdown() if holder else laptop.shutdown())
        lc = await stack.enter_async_context(LocalClient(laptop.paths.socket))
        here = await lc.call("POST", "/v1/projects", body={"path": str(make_repo(root / "laptop-repo"))})
        clients: dict[str, LocalClient] = {}
        projects: dict[str, str] = {}
        for label, box in boxes.items():
            bc = clients[label] = await stack.enter_async_context(LocalClient(box.paths.socket))
            there = await bc.call(
                "POST", "/v1/projects", body={"path": str(make_repo(root / f"{label}-repo"))}
            )
            projects[label] = there["id"]
            code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
            await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
        holder.append(Fleet(laptop, boxes, lc, clients, here["id"], projects))
        yield holder[0]


@contextlib.asynccontextmanager
async def fleet(
    root: Path, weights: list[int], unit: int
) -> AsyncIterator[tuple[LocalClient, dict[str, LocalClient], str]]:
    """A manual-only laptop linked to one box per weight (max_runs = weight x unit), each with a
    checkout of one origin: the laptop's client, each box's client by label, the laptop's project."""
    async with fleet_daemons(root, weights, unit) as f:
        yield f.lc, f.clients, f.project


async def drain(
    clients: dict[str, LocalClient], launched: list[dict[str, Any]], stall_s: float
) -> tuple[float, int]:
    """Wait until every launched run has ended, giving up only after `stall_s` seconds in which
    none ended: the seconds taken and how many ended."""
    start = time.perf_counter()
    open_runs = {(a["placement"]["label"], a["threadId"]) for a in launched}
    ended, last_progress = 0, time.perf_counter()
    while open_runs:
        for label, thread_id in list(open_runs):
            thread = await clients[label].call("GET", f"/v1/threads/{thread_id}")
            if thread["latestRun"]["status"] in ("completed", "failed", "cancelled", "interrupted"):
                open_runs.discard((label, thread_id))
                ended += 1
                last_progress = time.perf_counter()
        if open_runs and time.perf_counter() - last_progress > stall_s:
            break
        if open_runs:
            await asyncio.sleep(0.2)  # polled: the runs end in other daemons' tasks
    return time.perf_counter() - start, ended


async def split(burst: int, weights: list[int], unit: int, stall_s: float) -> dict[str, Any]:
    """`burst` auto launches at once over boxes weighted `weights` (max_runs weight x `unit`):
    where each went, and the drain."""
    with tempfile.TemporaryDirectory(prefix="peerd-bench-split-") as tmp:
        async with fleet(Path(tmp), weights, unit) as (lc, clients, project):
            return await split_on(lc, clients, project, burst, weights, unit, stall_s)


async def split_on(
    lc: LocalClient,
    clients: dict[str, LocalClient],
    project: str,
    burst: int,
    weights: list[int],
    unit: int,
    stall_s: float,
) -> dict[str, Any]:
    """The burst over a fleet already linked (box labels box00, box01, ... in the order of
    `weights`): where each launch went against each box's share, and the drain."""
    await lc.call("GET", "/v1/environments")  # every box's report read once, before the burst
    load_before = overloaded()
    body = {"projectId": project, "prompt": REPLY, "environmentId": "auto"}
    start = time.perf_counter()
    launched = await asyncio.gather(
        *(lc.call("POST", "/v1/threads", body={**body, "clientRequestId": f"s{i}"}) for i in range(burst))
    )
    burst_s = time.perf_counter() - start
    drain_s, ended = await drain(clients, launched, stall_s)
    load_after = overloaded()
    got = Counter(a["placement"]["label"] for a in launched)
    total = sum(weights)
    boxes = {}
    for i, weight in enumerate(weights):
        label = f"box{i:02}"
        share = burst * weight / total
        boxes[label] = {"max_runs": weight * unit, "share": round(share, 2), "got": got.get(label, 0)}
    worst = max(abs(b["got"] - b["share"]) / b["share"] for b in boxes.values())
    over = max(b["got"] / b["share"] for b in boxes.values())
    reasons = []
    if load_before is not None or load_after is not None:
        reasons.append(
            f"launches/s and the drain time: load average {load_before} before, {load_after} after, on"
            f" {os.cpu_count() or 1} CPUs (over one per CPU: other work shared the machine; the split"
            " itself is decided by the reservations, not by timing)"
        )
    if ended < burst:
        reasons.append(f"the drain gave up: {ended} of {burst} runs ended, none in the last {stall_s:g} s")
    return {
        "burst": burst,
        "weights": weights,
        "boxes": boxes,
        "worst_deviation": round(worst, 3),
        "max_over_share": round(over, 3),
        "goal_within_20pct": worst <= 0.2,
        "goal_at_most_2x": over <= 2.0,
        "launches_per_s": round(burst / burst_s, 1),
        "drain_s": round(drain_s, 2),
        "ended": ended,
        "load_average": load_average(),
        "unreliable": "; ".join(reasons) or None,
    }


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


def ms(values: list[float]) -> float:
    return round(statistics.median(values), 2)


async def run(reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="peerd-bench-placement-") as tmp:
        async with linked(Path(tmp)) as (laptop, box, lc, project):
            assert laptop.peers is not None and laptop.db is not None and box.identity is not None
            assert box.followers is not None
            hub = box.followers.delegation.ender.watcher.hub
            capacity = hub.capacity
            box_id = box.identity.env_id
            laptop_db, peers = laptop.db, laptop.peers

            async def poll() -> Any:
                return await peers.call(box_id, "POST", CHANGES_PATH, body={"timeout": 0})

            n = 0

            def launch(env: str) -> Callable[[], Awaitable[Any]]:
                async def go() -> Any:
                    nonlocal n
                    n += 1
                    pid = project["here"] if env == "auto" else project["there"]
                    body = {"projectId": pid, "prompt": REPLY, "environmentId": env}
                    answer = await lc.call("POST", "/v1/threads", body={**body, "clientRequestId": f"b{n}"})
                    if env == "auto":
                        assert answer["placement"]["label"] == "box", answer["placement"]
                    return answer

                return go

            async def stale_auto() -> Any:
                async with laptop_db.write() as tx:
                    await tx.execute("UPDATE link_capacity SET seen_at = seen_at - 3600")
                return await launch("auto")()

            await poll()
            await launch("auto")()  # warm: connections, the first report
            figures: dict[str, list[float]] = {k: [] for k in ("poll", "poll_bare", "named", "auto", "stale")}
            for i in range(reps):
                hub.capacity = capacity
                figures["poll"].append(await timed(poll))
                hub.capacity = None
                figures["poll_bare"].append(await timed(poll))
                hub.capacity = capacity
                order = [("named", launch(box_id)), ("auto", launch("auto"))]
                for key, call in order if i % 2 == 0 else reversed(order):
                    figures[key].append(await timed(call))
                async with laptop_db.write() as tx:  # the stale case re-reads the box below
                    await tx.execute("UPDATE link_capacity SET seen_at = ?", (time.time(),))
                # the timed part includes the one write that makes the reports stale (~1 ms)
                figures["stale"].append(await timed(stale_auto))
                print(f"  .. rep {i + 1}/{reps}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {k: ms(v) for k, v in figures.items()}
    out["poll_x"] = round(out["poll"] / out["poll_bare"], 3)
    out["auto_x"] = round(out["auto"] / out["named"], 3)
    out["stale_x"] = round(out["stale"] / out["named"], 3)
    out["reps"] = reps
    out["load_average"] = load_average()
    out["unreliable"] = unreliable_load()  # timings on a loaded machine: the ratios say more
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--burst", type=int, default=60, help="auto launches at once (0: no split)")
    parser.add_argument("--weights", default="1,1,1", help="one box per number, max_runs in proportion")
    parser.add_argument(
        "--max-runs", type=int, default=4, help="max_runs of a box of weight 1 (the default 4)"
    )
    parser.add_argument(
        "--stall", type=float, default=60.0, help="the drain gives up after this long with no run ending"
    )
    parser.add_argument("--split-only", action="store_true", help="only the burst split")
    parser.add_argument("--no-save", action="store_true")
    a = parser.parse_args()
    configure_logging(json=False, level=logging.WARNING)
    results: dict[str, Any] = {}
    if not a.split_only:
        figures = asyncio.run(run(a.reps))
        results["placement"] = figures
        print("\npeerd placement benchmark (medians, ms; ratios against the baseline in the same run)")
        rows = [
            ("feed answer, capacity in it", "poll", "without", "poll_bare", "poll_x"),
            ("launch, environmentId auto", "auto", "named", "named", "auto_x"),
            ("launch, auto, reports stale", "stale", "named", "named", "stale_x"),
        ]
        for title, key, base_name, base, ratio in rows:
            print(
                f"  {title:28} {figures[key]:8.2f}   {base_name:7} {figures[base]:8.2f}   x {figures[ratio]}"
            )
        print(f"  reps {figures['reps']}, load average {figures['load_average']}")
        if figures["unreliable"]:
            print(f"  UNRELIABLE: {figures['unreliable']}")
    if a.burst > 0:
        weights = [int(w) for w in a.weights.split(",") if w.strip()]
        got = asyncio.run(split(a.burst, weights, a.max_runs, a.stall))
        results["placement_split"] = got
        print(
            f"\nburst of {got['burst']} auto launches at once over {len(weights)} boxes (a manual-only laptop)"
        )
        for label, box in got["boxes"].items():
            print(f"  {label}  max_runs {box['max_runs']:4}  share {box['share']:6.2f}  got {box['got']:4}")
        equal = len(set(weights)) == 1
        print(
            f"  worst deviation from the share {got['worst_deviation']:.1%}"
            + (f" (goal <= 20%: {'met' if got['goal_within_20pct'] else 'NOT met'})" if equal else "")
            + f"; most over its share x {got['max_over_share']} (goal <= 2: "
            + ("met" if got["goal_at_most_2x"] else "NOT met")
            + ")"
        )
        print(
            f"  {got['launches_per_s']} launches/s; drained in {got['drain_s']} s ({got['ended']} of"
            f" {got['burst']} ended); load average {got['load_average']}"
        )
        if got["unreliable"]:
            print(f"  UNRELIABLE: {got['unreliable']}")
    if not a.no_save and results:
        save_results(results)


if __name__ == "__main__":
    main()
