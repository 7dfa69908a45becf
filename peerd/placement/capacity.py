"""This environment's capacity report (`c.Capacity`): what it tells its links for `auto`.

Live runs (starting or running) and queued ones, `[placement] max_runs` and `preference`, the 1-minute load
average and CPU count, MemAvailable and MemTotal from /proc/meminfo, the installed providers and
the projects by repository key. The load and memory readers are injectable (`Readers`): tests give
each in-process daemon its own through `OVERRIDES`, keyed by the daemon's home, which the daemon
reads when it is built; nothing patches `os` for every daemon in the process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peerd import contracts as c
from peerd.config import PlacementConfig
from peerd.store.db import Database

MEMINFO = Path("/proc/meminfo")


def read_load() -> tuple[float | None, int]:
    """The 1-minute load average (None where the system has none) and the CPU count."""
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return load, os.cpu_count() or 1


def read_memory(path: Path = MEMINFO) -> tuple[int | None, int | None]:
    """MemAvailable and MemTotal in bytes (None where /proc/meminfo does not say)."""
    found: dict[str, int] = {}
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None, None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemAvailable", "MemTotal"):
            value = rest.split()
            if value and value[0].isdigit():
                found[name] = int(value[0]) * 1024  # kB
    return found.get("MemAvailable"), found.get("MemTotal")


@dataclass(frozen=True)
class Readers:
    load: Callable[[], tuple[float | None, int]] = read_load
    memory: Callable[[], tuple[int | None, int | None]] = read_memory


# Tests: a daemon whose home is a key here reads its load and memory from these instead.
OVERRIDES: dict[str, Readers] = {}


def readers_for(home: Path) -> Readers:
    return OVERRIDES.get(str(home), Readers())


async def report(
    db: Database, config: PlacementConfig, providers: Callable[[], dict[str, bool]], readers: Readers
) -> c.Capacity:
    """This environment's capacity now (a few cheap reads)."""
    row = await db.fetchone(
        "SELECT coalesce(sum(status IN ('starting', 'running')), 0) AS live,"
        " coalesce(sum(status = 'queued'), 0) AS queued"
        " FROM runs WHERE status IN ('queued', 'starting', 'running')"
    )
    live, queued = (0, 0) if row is None else (int(row["live"]), int(row["queued"]))
    rows = await db.fetchall(
        "SELECT id, name, repository_key FROM projects ORDER BY created_at LIMIT ?",
        (c.MAX_REPORTED_PROJECTS,),
    )
    load, cpus = readers.load()
    available, total = readers.memory()
    return c.Capacity(
        live_runs=live,
        max_runs=config.max_runs,
        queued_runs=queued,
        load=None if load is None else max(load, 0.0),
        cpus=max(cpus, 1),
        mem_available=available,
        mem_total=total,
        providers=sorted(name for name, found in providers().items() if found)[:64],
        projects=[
            c.ProjectKey(id=r["id"], name=r["name"][:200], repository_key=r["repository_key"]) for r in rows
        ],
        preference=config.preference,
    )
