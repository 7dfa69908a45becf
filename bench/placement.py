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

Run: .venv/bin/python bench/placement.py [--reps 30] [--no-save]
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
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from benchlib import load_average, save_results

from peerd.api.localclient import LocalClient
from peerd.config import Config, PlacementConfig
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
            laptop_db = laptop.db

            async def poll() -> Any:
                return await laptop.peers.call(box_id, "POST", CHANGES_PATH, body={"timeout": 0})

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
    out = {k: ms(v) for k, v in figures.items()}
    out["poll_x"] = round(out["poll"] / out["poll_bare"], 3)
    out["auto_x"] = round(out["auto"] / out["named"], 3)
    out["stale_x"] = round(out["stale"] / out["named"], 3)
    out["reps"] = reps
    out["load_average"] = load_average()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--no-save", action="store_true")
    a = parser.parse_args()
    configure_logging(json=False, level=logging.WARNING)
    figures = asyncio.run(run(a.reps))
    print("\npeerd placement benchmark (medians, ms; ratios against the baseline in the same run)")
    rows = [
        ("feed answer, capacity in it", "poll", "without", "poll_bare", "poll_x"),
        ("launch, environmentId auto", "auto", "named", "named", "auto_x"),
        ("launch, auto, reports stale", "stale", "named", "named", "stale_x"),
    ]
    for title, key, base_name, base, ratio in rows:
        print(f"  {title:28} {figures[key]:8.2f}   {base_name:7} {figures[base]:8.2f}   x {figures[ratio]}")
    print(f"  reps {figures['reps']}, load average {figures['load_average']}")
    if not a.no_save:
        save_results({"placement": figures})


if __name__ == "__main__":
    main()
