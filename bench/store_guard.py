"""What the store-file check costs (store/fileguard.py): one `os.stat` of `peerd.db` per write
transaction, against the write itself, in this process's CPU time (a loaded machine's wall time
would count other processes). Run: PYTHONPATH=. .venv/bin/python bench/store_guard.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peerd.store.db import Database
from peerd.store.fileguard import StoreFile

N = 3000


async def writes(db: Database, start: int) -> float:
    began = time.process_time()
    for n in range(start, start + N):
        async with db.write() as tx:
            await tx.execute(
                "INSERT INTO projects (id, name, path, created_at) VALUES (?, ?, ?, 0)",
                (f"p{n}", "x", f"/{n}"),
            )
    return (time.process_time() - began) / N


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = await Database.open(Path(tmp) / "peerd.db")
        guard = StoreFile(db.path)
        began = time.process_time()
        for _ in range(N * 10):
            guard.look()
        look = (time.process_time() - began) / (N * 10)
        began = time.process_time()
        for _ in range(N * 10):
            os.stat(os.fsencode(db.path))  # noqa: PTH116  # what the guard does
        stat = (time.process_time() - began) / (N * 10)
        per_write = statistics.median([await writes(db, k * N) for k in range(5)])
        await db.close()
    print(
        f"os.stat {stat * 1e6:.2f} us, StoreFile.look {look * 1e6:.2f} us; "
        f"a one-row write transaction (with the look) {per_write * 1e6:.1f} us: "
        f"the check is {100 * look / per_write:.1f}% of it"
    )


asyncio.run(main())
