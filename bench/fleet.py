"""Benchmark: one laptop linked to a fleet of boxes with many open remote tasks (issue 33).

Everything runs in this one process, as in bench/wake.py: a laptop and `--boxes` (20) boxes, real
daemons (real SQLite files, real TLS listeners on loopback), linked the way `peerd pair` /
`peerd link` link them (bench/placement.py's `fleet_daemons`: a manual-only laptop, boxes of
`--max-runs` each, one origin checked out everywhere). `--tasks` (20,000) open remote tasks are
spread evenly over the boxes, made cheaply with bench/wake.py's `insert_idle_tasks` (box threads
whose run is queued behind a held queue; running laptop tasks pointing at them). Then:

1. Idle cost per link: the follower's requests and bytes per minute, counted at each box by
   bench/wake.py's counting middleware, over `--window` s (a whole number of polls a box), at the
   bench's chunk (`--chunk`, 5 s) and scaled to the production chunk (50 s).
2. Wake ratio: `--wakes` real remote task wakes (bench/wake.py's `one_wake`, round robin over the
   boxes) against the stdlib keep-alive HTTPS round trip to a box (`round_trips`), at that load.
3. Placement split: a burst of `--burst` `auto` launches at once over the boxes
   (bench/placement.py's `split_on`): each box's count against its share, the most over a share.
4. Restart -> all links polling: the laptop daemon stopped and started again on its home; seconds
   from the start until every box has seen its follower's poll (counted at the boxes).
5. RSS: this process's VmRSS (every daemon shares it: divided by the daemons, said so), and the
   laptop as its own `peerd serve` process on the same home afterwards, VmRSS once it served and
   idled `--settle` s (bench/resume.py's `idle_rss`).

Every wait is bounded by work done: it gives up only after `--stall` s without progress. A
figure taken with the load past one per CPU is marked UNRELIABLE, with the reason.

Run: .venv/bin/python bench/fleet.py [--boxes 20] [--tasks 20000] [--burst 60] [--wakes 5] [--no-save]
     .venv/bin/python bench/fleet.py --boxes 3 --tasks 300 --burst 12 --no-save   # small
Figures under "fleet" in bench/results.json; bench/README.md says what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from benchlib import load_average, save_results, unreliable_load
from placement import Fleet, fleet_daemons, split_on
from resume import idle_rss, rss_kib
from wake import (
    COUNTERS,
    GOALS,
    PRODUCTION_CHUNK_S,
    Counter,
    Idle,
    Pair,
    insert_idle_tasks,
    one_wake,
    round_trips,
    window,
)

from peerd.config import Config, ConsoleConfig, PlacementConfig
from peerd.daemon import Daemon, DaemonConfig
from peerd.logs import configure_logging
from peerd.runtime.sandbox_profile import READABLE_ENV
from peerd.tasks.machine import watch_margin

T = TypeVar("T")


def say(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def laptop_config(root: Path, chunk: float, unit: int) -> DaemonConfig:
    """The fleet's laptop (as `fleet_daemons` makes it: manual-only, no console) with the bench's chunk."""
    settings = Config(
        placement=PlacementConfig(max_runs=unit, preference="manual-only"),
        console=ConsoleConfig(enabled=False),
    )
    return DaemonConfig(
        home=root / "laptop", label="laptop", listen="127.0.0.1:0", watch_chunk_s=chunk, settings=settings
    )


def pairs(f: Fleet) -> list[Pair]:
    """The laptop and each box as bench/wake.py's `Pair` (the laptop as it is now)."""
    return [
        Pair(f.laptop, box, f.lc, f.clients[label], f.project, f.box_projects[label])
        for label, box in f.boxes.items()
    ]


async def progressing(measure: Callable[[], int], target: int, stall_s: float) -> tuple[float, int]:
    """Wait until `measure()` reaches `target`, giving up only after `stall_s` s in which it did not
    move: (seconds taken, the last value)."""
    start = last_move = time.monotonic()
    value = measure()
    while value < target:
        await asyncio.sleep(0.01)
        now, seen = time.monotonic(), measure()
        if seen != value:
            value, last_move = seen, now
        elif now - last_move > stall_s:
            break
    return time.monotonic() - start, value


async def bounded(step: Awaitable[T], stall_s: float, what: str) -> T:
    """One unit of work, given up (an error) after `stall_s` s."""
    try:
        return await asyncio.wait_for(step, stall_s)
    except TimeoutError:
        raise SystemExit(f"error: {what}: no progress in {stall_s:g} s") from None


def following(f: Fleet, want: dict[str, int]) -> int:
    """Followers steady with all their box's tasks (polling, subscription settled), and the tasks
    they hold: one number that moves as the sync progresses."""
    assert f.laptop.followers is not None
    score = 0
    for p in pairs(f):
        follower = f.laptop.followers._followers.get(p.box_id)
        if follower is None:
            continue
        m = follower.machine
        held = min(len(m.sub.want), want[p.box.config.label])
        score += held
        if m.polling and m.sub.settled and held == want[p.box.config.label]:
            score += 1
    return score


def per_box(total: int, boxes: int) -> list[int]:
    return [total // boxes + (1 if i < total % boxes else 0) for i in range(boxes)]


async def restart(f: Fleet, config: DaemonConfig, stall_s: float) -> dict[str, Any]:
    """Stop the laptop and start it again on its home: seconds to started, and until each box saw
    a poll (the first arrival after the start, counted at the box)."""
    await f.laptop.shutdown()
    labels = list(f.boxes)
    base = {label: COUNTERS[label].counts["poll"] for label in labels}
    laptop = Daemon(config)
    t0 = time.monotonic()
    await laptop.start()
    started = time.monotonic() - t0
    f.laptop = laptop

    def polled() -> int:
        return sum(COUNTERS[label].counts["poll"] > base[label] for label in labels)

    await progressing(polled, len(labels), stall_s)
    each = {
        label: COUNTERS[label].arrivals["poll"][base[label]] - t0
        for label in labels
        if COUNTERS[label].counts["poll"] > base[label]
    }
    return {
        "started_s": round(started, 3),
        "all_polling_s": round(max(each.values()), 3) if len(each) == len(labels) else None,
        "median_link_polling_s": round(statistics.median(each.values()), 3) if each else None,
        "links_polling": len(each),
        "links": len(labels),
    }


def poll_wait_s(chunk: float) -> float:
    """How long the box holds an idle poll at this chunk (the follower asks for the chunk less
    its margin), so one idle poll per this many seconds."""
    return chunk - watch_margin(chunk)


def idle_figures(idles: dict[str, Idle], chunk: float) -> dict[str, Any]:
    rates = [i.per_min for i in idles.values()]
    # To the production chunk by the poll's wait (45 s at 50 s; 4 s at the bench's 5 s), not by
    # the chunks' ratio: the margin is not a fixed share of the chunk.
    scale = poll_wait_s(chunk) / poll_wait_s(PRODUCTION_CHUNK_S)
    polls = sum(i.requests for i in idles.values())
    return {
        "chunk_s": chunk,
        "poll_wait_s": poll_wait_s(chunk),
        "window_s": round(statistics.median(i.seconds for i in idles.values()), 1),
        "requests_per_min_per_link": round(statistics.mean(rates), 2),
        "requests_per_min_per_link_min_max": [round(min(rates), 2), round(max(rates), 2)],
        "requests_per_min_per_link_at_50s_chunk": round(statistics.mean(rates) * scale, 3),
        "worst_at_50s_chunk": round(max(rates) * scale, 3),
        "bytes_per_min_per_link": round(statistics.mean(i.bytes_per_min for i in idles.values())),
        "bytes_per_poll": round(sum(i.bytes for i in idles.values()) / max(polls, 1)),
        "other_requests": sum(i.other_requests for i in idles.values()),
        "goal_requests_per_min": GOALS["requests_per_min"],
        "met": max(rates) * scale <= GOALS["requests_per_min"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"boxes": args.boxes, "tasks": args.tasks}
    with tempfile.TemporaryDirectory(prefix="peerd-bench-fleet-") as tmp:
        root = Path(tmp)
        holds = root / "holds"  # the files the boxes' confined children wait for: visible to them
        holds.mkdir()
        os.environ[READABLE_ENV] = ":".join(filter(None, [os.environ.get(READABLE_ENV), str(holds)]))
        labels = [f"box{i:02}" for i in range(args.boxes)]
        for label in labels:
            COUNTERS[label] = Counter()
        config = laptop_config(root, args.chunk, args.max_runs)
        weights = [1] * args.boxes
        t0 = time.monotonic()
        # Each box's open tasks are queued runs there, and count against its max_runs: the boxes get
        # room for them plus --max-runs, so the burst finds --max-runs free on each.
        held = -(-args.tasks // args.boxes)
        figures["box_max_runs"] = held + args.max_runs
        async with fleet_daemons(root, weights, args.max_runs, laptop_config=config, held=held) as f:
            say(f"{args.boxes} boxes linked in {time.monotonic() - t0:.1f} s")

            # The open tasks, spread evenly; every follower told, then steady with all of them.
            t0 = time.monotonic()
            want = dict(zip(labels, per_box(args.tasks, args.boxes), strict=True))
            first = 0  # the tasks' request keys are unique on the laptop: numbered across the boxes
            for p in pairs(f):
                await insert_idle_tasks(p, first, want[p.box.config.label])
                first += want[p.box.config.label]
                assert f.laptop.followers is not None
                f.laptop.followers.notify(p.box_id)
            target = args.tasks + args.boxes
            took, reached = await progressing(lambda: following(f, want), target, args.stall)
            if reached < target:
                raise SystemExit(f"error: following {args.tasks} tasks stalled ({reached} of {target})")
            figures["followed_s"] = round(took, 2)
            say(
                f"{args.tasks} tasks inserted and followed in {time.monotonic() - t0:.1f} s (sync {took:.1f} s)"
            )

            # 1. Idle cost per link, at every box at once, a chunk after the sync (the poll that
            # follows a subscription's change is answered at once and sent again).
            await asyncio.sleep(args.chunk)
            gathered = await bounded(
                asyncio.gather(*(window("poll", args.window, counter=COUNTERS[label]) for label in labels)),
                args.window + 3 * args.chunk + args.stall,
                "the idle window",
            )
            idle = idle_figures(dict(zip(labels, gathered, strict=True)), args.chunk)
            idle["unreliable"] = unreliable_load()
            figures["idle"] = idle
            say(
                f"idle: {idle['requests_per_min_per_link']} requests/min per link at the {args.chunk:g} s chunk"
            )

            # 2. Wakes, round robin over the boxes, against the stdlib round trip.
            # The round trips are interleaved with the wakes (a share before each, to that wake's
            # box), so the ratio's two sides see the same load.
            links = pairs(f)
            per_wake = max(3, -(-args.round_trips // args.wakes))
            rtt: dict[str, list[float]] = {"stdlib": [], "probe": []}
            await bounded(one_wake(links[0], holds, "warm-up"), args.stall, "the warm-up wake")
            wakes = []
            for i in range(args.wakes):
                pair = links[i % len(links)]
                for name, times in (await round_trips(pair, per_wake)).items():
                    rtt.setdefault(name, []).extend(times)
                wakes.append(await bounded(one_wake(pair, holds, f"wake-{i}"), args.stall, f"wake {i}"))
            floor = statistics.median(rtt["stdlib"]) * 1000
            p50 = statistics.median(wakes) * 1000
            figures["wake"] = {
                "wakes": len(wakes),
                "each_ms": [round(w * 1000, 2) for w in wakes],
                "p50_ms": round(p50, 2),
                "max_ms": round(max(wakes) * 1000, 2),
                "round_trips": len(rtt["stdlib"]),
                "round_trip_stdlib_ms": round(floor, 3),
                "round_trip_probe_ms": round(statistics.median(rtt["probe"]) * 1000, 3),
                "x_round_trip": round(p50 / floor, 2),
                "goal_x": GOALS["wake_x"],
                "met": p50 / floor <= GOALS["wake_x"],
                "unreliable": unreliable_load(),
            }
            say(f"wakes: p50 {p50:.1f} ms = {p50 / floor:.1f}x the stdlib round trip")

            # 3. The placement split of a burst over the boxes.
            if args.burst:
                figures["split"] = await split_on(
                    f.lc, f.clients, f.project, args.burst, weights, args.max_runs, args.stall
                )
                say(f"burst of {args.burst}: most over a share x {figures['split']['max_over_share']}")

            # 4. Restart -> every link polling.
            rs = await restart(f, config, args.stall)
            rs["unreliable"] = unreliable_load()
            figures["restart"] = rs
            say(
                f"restart: all {rs['links_polling']} of {rs['links']} links polling in {rs['all_polling_s']} s"
            )

            # 5. RSS: this process (every daemon in it), then the laptop as its own process.
            process_kib = rss_kib(os.getpid())
            own = pairs(f)[0]
            own_kib = await idle_rss(own, root, args.settle, config=config)
            f.laptop = own.laptop
            figures["rss"] = {
                "process_mib": round(process_kib / 1024, 1),
                "daemons_in_process": args.boxes + 1,
                "process_mib_per_daemon": round(process_kib / 1024 / (args.boxes + 1), 1),
                "laptop_own_process_idle_mib": round(own_kib / 1024, 1),
                "settle_s": args.settle,
            }
            say(f"RSS: process {process_kib / 1024:.0f} MiB, laptop alone {own_kib / 1024:.1f} MiB")
    figures["load_average_1m"] = load_average()
    figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return figures


def table(f: dict[str, Any]) -> str:
    idle, wake, rs, rss = f["idle"], f["wake"], f["restart"], f["rss"]
    per_link = f["tasks"] / f["boxes"]
    lines = [
        f"\npeerd fleet benchmark: one laptop, {f['boxes']} boxes, {f['tasks']} open remote tasks"
        f" ({per_link:g} a link), every daemon in this one process, loopback TLS",
        f"1. idle, counted at each box over {idle['window_s']:g} s at the {idle['chunk_s']:g} s chunk:"
        f" {idle['requests_per_min_per_link']} requests/min per link (min-max"
        f" {idle['requests_per_min_per_link_min_max'][0]}-{idle['requests_per_min_per_link_min_max'][1]}),"
        f" {idle['bytes_per_min_per_link']} B/min, {idle['bytes_per_poll']} B/poll (the box's capacity report,"
        " at most every 10 s, rides on some of these polls; at the production chunk on each)",
        f"   at the production chunk (50 s; a poll waits {poll_wait_s(PRODUCTION_CHUNK_S):g} s there,"
        f" {idle['poll_wait_s']:g} s here): {idle['requests_per_min_per_link_at_50s_chunk']} per link,"
        f" worst {idle['worst_at_50s_chunk']}"
        f" (goal <= {idle['goal_requests_per_min']:g}: {'met' if idle['met'] else 'NOT met'})",
        f"2. wakes: {wake['wakes']} round robin over the boxes, p50 {wake['p50_ms']} ms (max {wake['max_ms']});"
        f" stdlib round trip {wake['round_trip_stdlib_ms']} ms -> x {wake['x_round_trip']}"
        f" (goal <= {wake['goal_x']:g}: {'met' if wake['met'] else 'NOT met'}; aiohttp probe"
        f" {wake['round_trip_probe_ms']} ms)",
    ]
    if "split" in f:
        s = f["split"]
        counts = " ".join(str(b["got"]) for b in s["boxes"].values())
        lines += [
            f"3. burst of {s['burst']} auto launches over {len(s['boxes'])} boxes (share"
            f" {next(iter(s['boxes'].values()))['share']:g} each): {counts}",
            f"   most over its share x {s['max_over_share']}"
            f" (goal <= 2: {'met' if s['goal_at_most_2x'] else 'NOT met'});"
            f" worst deviation {s['worst_deviation']:.0%}; {s['launches_per_s']} launches/s; drained in"
            f" {s['drain_s']} s ({s['ended']} of {s['burst']} ended)",
        ]
    lines += [
        f"4. restart: started in {rs['started_s']} s; every link polling after {rs['all_polling_s']} s"
        f" ({rs['links_polling']} of {rs['links']}; median link {rs['median_link_polling_s']} s)",
        f"5. RSS: this one process {rss['process_mib']} MiB for {rss['daemons_in_process']} daemons"
        f" ({rss['process_mib_per_daemon']} MiB each if divided evenly: they share one interpreter, so this"
        " understates a daemon alone); the laptop as its own `peerd serve` on the same home, idle"
        f" {rss['settle_s']:g} s: {rss['laptop_own_process_idle_mib']} MiB",
        f"   load average {f['load_average_1m']}",
    ]
    for name, part in (("idle", idle), ("wakes", wake), ("split", f.get("split")), ("restart", rs)):
        if part and part.get("unreliable"):
            lines.append(f"   UNRELIABLE ({name}): {part['unreliable']}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--boxes", type=int, default=20, help="boxes linked to the laptop (default 20)")
    p.add_argument("--tasks", type=int, default=20_000, help="open remote tasks over them (default 20,000)")
    p.add_argument("--burst", type=int, default=60, help="auto launches at once (default 60; 0: none)")
    p.add_argument("--wakes", type=int, default=5, help="remote task wakes timed (default 5)")
    p.add_argument(
        "--max-runs", type=int, default=4, help="each box's max_runs beyond its open tasks (default 4)"
    )
    p.add_argument("--chunk", type=float, default=5.0, help="the follower's long-poll chunk, s (default 5)")
    p.add_argument("--window", type=float, default=10.0, help="idle counting window, s (default 10)")
    p.add_argument(
        "--round-trips",
        type=int,
        default=30,
        help="stdlib round trips for the median, spread over the wakes (default 30)",
    )
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle before the laptop's RSS is read")
    p.add_argument("--stall", type=float, default=120.0, help="give up after this long without progress")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results.json")
    args = p.parse_args(argv)
    if args.boxes < 1 or args.tasks < args.boxes or args.wakes < 1 or args.burst < 0:
        p.error(
            "--boxes >= 1, --tasks >= --boxes (every link has tasks, so every follower polls), --wakes >= 1"
        )
    return args


def main() -> int:
    args = parse()
    configure_logging(json=False, level=logging.WARNING)
    started = time.monotonic()
    figures = asyncio.run(run(args))
    print(table(figures))
    if not args.no_save:
        save_results({"fleet": figures})
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
