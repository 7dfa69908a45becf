"""Benchmark: what a store call costs inline on the event loop against a hop to a thread.

Why peerd's writer and point reads run inline (store/db.py): a statement is microseconds of SQLite
work, while aiosqlite runs every call on the connection's own thread, so each call is a thread
wake-up each way. On a VM, waking a thread on the other vCPU is costly, and a launch with its run
made ~110 such hops on the box before. Measured here side by side, in one process, on one WAL file
(`synchronous = NORMAL`, as peerd's store):

- `thread ping-pong`: a bare round trip to a thread and back (queue.SimpleQueue), the floor of a hop;
- `aiosqlite SELECT 1` against `peerd lookup SELECT 1` (Database.lookup: inline, one loop turn);
- a transaction of 8 small inserts through aiosqlite (one hop per statement, as the store's code
  was) against `Database.write()` (inline).

Each figure is CPU microseconds per operation (process time: both threads count) and wall; the
ratios are aiosqlite over inline.

Run: .venv/bin/python bench/store_hops.py [--n 3000] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
from benchlib import load_average, save_results

from peerd.store.db import Database


def timed(n: int, work: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def atimed(n: int, work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await work()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def ping_pong(n: int) -> tuple[float, float]:
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (item := there.get()) is not None:
            back.put(item)

    worker = threading.Thread(target=echo)
    worker.start()
    try:

        def one() -> None:
            there.put(1)
            back.get()

        return timed(n, one)
    finally:
        there.put(None)
        worker.join()


async def measure(root: Path, n: int) -> dict[str, tuple[float, float]]:
    db = await Database.open(root / "peerd.db")
    try:
        async with db.write() as tx:
            await tx.execute("CREATE TABLE bench (id INTEGER PRIMARY KEY, v TEXT)")
        conn = await aiosqlite.connect(str(root / "peerd.db"), isolation_level=None)
        await conn.execute("PRAGMA synchronous = NORMAL")
        try:

            async def hop_tx() -> None:
                await conn.execute("BEGIN IMMEDIATE")
                for _ in range(8):
                    await conn.execute("INSERT INTO bench (v) VALUES (?)", ("x" * 100,))
                await conn.execute("COMMIT")

            async def inline_tx() -> None:
                async with db.write() as tx:
                    for _ in range(8):
                        await tx.execute("INSERT INTO bench (v) VALUES (?)", ("x" * 100,))

            figures = {"thread ping-pong": ping_pong(n)}
            for _ in range(2):  # interleaved, twice: the second pass is kept
                figures["aiosqlite SELECT 1"] = await atimed(n, lambda: conn.execute("SELECT 1"))
                figures["peerd lookup SELECT 1"] = await atimed(n, lambda: db.lookup("SELECT 1"))
                figures["aiosqlite tx, 8 inserts"] = await atimed(n // 10, hop_tx)
                figures["peerd write, 8 inserts"] = await atimed(n // 10, inline_tx)
            return figures
        finally:
            await conn.close()
    finally:
        await db.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=3000, help="operations per figure (transactions: a tenth)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results.json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="peerd-bench-hops-") as tmp:
        figures = asyncio.run(measure(Path(tmp), args.n))
    print("Store calls: inline on the loop against a hop to a thread (us per operation)")
    print(f"   {'':28} {'CPU us':>9} {'wall us':>9}")
    for name, (cpu, wall) in figures.items():
        print(f"   {name:28} {cpu:9.1f} {wall:9.1f}")
    read_x = figures["aiosqlite SELECT 1"][0] / figures["peerd lookup SELECT 1"][0]
    write_x = figures["aiosqlite tx, 8 inserts"][0] / figures["peerd write, 8 inserts"][0]
    print(f"   CPU, aiosqlite over inline: a read x {read_x:.1f}, a transaction of 8 inserts x {write_x:.1f}")
    if not args.no_save:
        save_results(
            {
                "store_hops": {
                    "us_per_op": {
                        k: {"cpu": round(c, 1), "wall": round(w, 1)} for k, (c, w) in figures.items()
                    },
                    "read_cpu_ratio": round(read_x, 2),
                    "write_cpu_ratio": round(write_x, 2),
                    "load_average": load_average(),
                }
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
