"""Where memory goes per delegation: two in-process daemons ("laptop", "box") linked on loopback,
N delegations with the scripted provider, tracemalloc snapshots after a warm-up compared by
traceback. Run: PYTHONPATH=. .venv/bin/python bench/mem_delegation.py [--warm 30] [--count 150]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import logging
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import git, make_repo, two_daemons, wait_terminal


def runs_script(*runs: list[dict[str, Any]]) -> str:
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


READ = [
    {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
    {"reply": "PARENT GOT ${result}"},
]


_SQLITE = ctypes.CDLL("libsqlite3.so.0")
_SQLITE.sqlite3_memory_used.restype = ctypes.c_int64


def sqlite_kb() -> int:
    """What SQLite has allocated (page caches, statements), in this process."""
    return int(_SQLITE.sqlite3_memory_used()) // 1024


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def one(pair: Any, project: str, n: int) -> None:
    child = "```peerd-script\n" + json.dumps({"steps": [{"reply": f"CHILD {n}"}]}) + "\n```"
    step = {
        "tool": {
            "name": "delegate_task",
            "arguments": {
                "task": child,
                "target": {"environmentId": pair.box_id},
                "clientRequestId": f"k{n}",
            },
            "check": True,
        }
    }
    launched = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": project, "prompt": runs_script([step], READ)}
    )
    thread = launched["threadId"]
    await wait_terminal(pair.lc, thread, launched["runId"], total=60)
    for _ in range(600):
        t = await pair.lc.call("GET", f"/v1/threads/{thread}")
        latest = t["latestRun"]
        if latest["number"] >= 2 and latest["status"] in ("completed", "failed", "interrupted", "cancelled"):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"delegation {n} never woke its parent")


def cap_caches(kib: int) -> None:
    """Every store connection's page cache capped at `kib` KiB (to tell SQLite's caches apart)."""
    from peerd.store import db  # noqa: PLC0415

    for name in ("_inline_writer", "_point_reader"):
        made = getattr(db, name)

        def capped(path: Path, made: Any = made) -> Any:
            conn = made(path)
            conn.execute(f"PRAGMA cache_size = -{kib}")
            return conn

        setattr(db, name, capped)
    connect = db._connect

    async def capped_connect(path: Path) -> Any:
        conn = await connect(path)
        await conn.execute(f"PRAGMA cache_size = -{kib}")
        return conn

    db._connect = capped_connect


async def main(args: argparse.Namespace) -> None:
    logging.disable(logging.CRITICAL)
    if args.cache_kib:
        cap_caches(args.cache_kib)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        make_repo(tmp_path / "seed", origin=None)
        origin = tmp_path / "origin.git"
        git(tmp_path, "clone", "-q", "--bare", str(tmp_path / "seed"), str(origin))
        async with two_daemons(tmp_path, laptop_watch_chunk_s=5) as pair:
            for side, client in (("laptop", pair.lc), ("box", pair.bc)):
                git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
                await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
            await pair.link("auto")
            project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]["id"]
            n = 0
            for _ in range(args.warm):
                await one(pair, project, n)
                n += 1
            gc.collect()
            if not args.no_trace:
                tracemalloc.start(args.frames)
                first = tracemalloc.take_snapshot()
            rss0 = rss_kb()
            print(f"after warm-up ({args.warm}): rss {rss0} kB, sqlite {sqlite_kb()} kB", flush=True)
            for i in range(args.count):
                await one(pair, project, n)
                n += 1
                if (i + 1) % 25 == 0:
                    traced = tracemalloc.get_traced_memory()[0] // 1024
                    print(
                        f"  {i + 1}: rss {rss_kb()} kB, sqlite {sqlite_kb()} kB, traced {traced} kB",
                        flush=True,
                    )
            gc.collect()
            rss1 = rss_kb()
            if args.no_trace:
                print(f"rss {rss0} -> {rss1} kB: {(rss1 - rss0) / args.count:.1f} kB per delegation")
                return
            second = tracemalloc.take_snapshot()
            filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
            diff = second.filter_traces(filters).compare_to(first.filter_traces(filters), "traceback")
            grown = sum(d.size_diff for d in diff)
            print(
                f"rss {rss0} -> {rss1} kB: {(rss1 - rss0) / args.count:.1f} kB per delegation; "
                f"traced +{grown / 1024:.0f} kB = {grown / args.count / 1024:.2f} kB per delegation"
            )
            if args.peerd_only:
                diff = [d for d in diff if any("/peerd/" in f.filename for f in d.traceback)]
            for d in diff[: args.top]:
                print(f"\n+{d.size_diff / 1024:.1f} kB, +{d.count_diff} blocks")
                for line in d.traceback.format()[-2 * args.frames :]:
                    print("   ", line)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--warm", type=int, default=30)
    p.add_argument("--count", type=int, default=150)
    p.add_argument("--frames", type=int, default=12)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--cache-kib", type=int, default=0, help="cap every store connection's page cache")
    p.add_argument("--peerd-only", action="store_true", help="only growth with a peerd frame")
    p.add_argument("--no-trace", action="store_true", help="RSS and SQLite only (tracemalloc costs memory)")
    asyncio.run(main(p.parse_args()))
