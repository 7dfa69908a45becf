"""kill -9 over the phases of a delegation, on both sides: real `peerd serve` subprocesses.

Each trial delegates one child from a fresh parent, kills the laptop or the box at a moment, starts
it again on the same home, and waits until the delegation settled: nothing live on either side,
and the task's parent finished a wake run. The subset (`make test`) kills at chosen phases, found
by watching the stores (deterministic); `make faults` adds PEERD_FAULT_TRIALS kills at random
moments (seeded by PEERD_FAULT_SEED) spread over the whole delegation, both sides in turn.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.faults.harness import (
    REPORT,
    SEED,
    TERMINAL_RUN,
    TRIALS,
    Outcome,
    Row,
    World,
    child_script,
    linked_world,
    parent_script,
    phase_of,
    rows,
    runs_of,
    settle,
    table,
)
from tests.support.eventually import eventually

CHILD_WAIT_S = 1.0
# The subset: the phases that lost work before (a wake run cut on the laptop, a child cut on the box,
# the laptop killed as the box's child ended: its poll cut while the box looked at the child, issue
# 26 case 8; the exact moment is tests/faults/test_cut_look.py).
TARGETED = [
    ("laptop", "child running"),
    ("box", "child running"),
    ("laptop", "child ended"),
    ("laptop", "wake run live"),
]

KillWhen = Callable[[World, str, set[str]], Awaitable[None]]


def box_threads(w: World) -> set[str]:
    return {r["id"] for r in rows(w.box.db, "SELECT id FROM threads")}


def at_phase(phase: str) -> KillWhen:
    async def wait(w: World, parent: str, before: set[str]) -> None:
        async def reached() -> bool:
            if phase in ("child running", "child ended"):
                runs = [r for t in box_threads(w) - before for r in runs_of(w.box.db, t)]
                if phase == "child ended":  # its reply is written: the run ends in a moment
                    replied = [
                        r
                        for t in box_threads(w) - before
                        for r in rows(
                            w.box.db,
                            "SELECT 1 FROM items WHERE thread_id = ? AND kind = ?",
                            (t, "assistant_message"),
                        )
                    ]
                    return bool(replied) or any(r["status"] in TERMINAL_RUN for r in runs)
                return any(r["status"] == "running" for r in runs)
            wakes = [r for r in runs_of(w.laptop.db, parent) if r["origin"] == "wake"]
            return any(r["status"] == "running" for r in wakes)

        await eventually(reached, what=f"phase {phase} reached", within=30)

    return wait


def after(seconds: float) -> KillWhen:
    async def wait(w: World, parent: str, before: set[str]) -> None:
        await asyncio.sleep(seconds)

    return wait


async def trial(w: World, n: int, side: str | None, kill_when: KillWhen) -> Outcome:
    """One delegation; `side` is killed -9 once `kill_when` returns, then started again."""
    before = box_threads(w)
    prompt = parent_script(child_script(n, CHILD_WAIT_S), w.box_id, f"kill-{n}")
    launched = await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": prompt})
    parent = launched["threadId"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    phase = ""
    if side is not None:
        await kill_when(w, parent, before)
        victim = w.side(side)
        victim.kill9()
        phase = phase_of(w, parent, before)
        await victim.restart()
    out = await settle(w, parent, n, before, since=loop.time() if side else started)
    out.phase = phase
    out.notes = [f"[{side} killed at {phase}] {note}" for note in out.notes]
    if not out.settled:
        out.notes.append(f"[{side} killed at {phase}] not settled: {phase_of(w, parent, before)}")
    return out


@pytest.mark.timeout(240 + 120 * TRIALS)
async def test_kill_9_at_the_phases_of_a_delegation(tmp_path: Path) -> None:
    calm = Row("no fault (calibration)")
    kills = {"laptop": Row("kill -9 laptop"), "box": Row("kill -9 box")}
    REPORT.extend([calm, kills["laptop"], kills["box"]])
    async with linked_world(tmp_path) as w:
        clock = asyncio.get_running_loop()
        spans = []
        for n in (-1, 0):  # the first is slower (cold caches): the span is the faster one
            began = clock.time()
            calm.add(await trial(w, n, None, after(0)))
            spans.append(clock.time() - began)
        span = max(2.0, min(spans))  # the whole delegation, launch to finished wake
        n = 0
        for side, phase in TARGETED:
            n += 1
            kills[side].add(await trial(w, n, side, at_phase(phase)))
        rng = random.Random(SEED)
        for i in range(TRIALS):
            n += 1
            side = "laptop" if i % 2 == 0 else "box"
            kills[side].add(await trial(w, n, side, after(rng.uniform(0.0, span))))
    assert calm.clean and all(row.clean for row in kills.values()), "\n".join(table(REPORT))
