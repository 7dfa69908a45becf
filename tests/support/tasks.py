"""Tasks written straight into a store (`seed`: many, over parents and targets, in assorted
statuses), for listing and paging tests."""

from __future__ import annotations

import itertools
import time
from typing import Any

from peerd.peer.identity import env_id_from_public_key
from peerd.store.db import Database
from peerd.tasks import store as tasks

BOX = env_id_from_public_key(bytes(range(32)))
GONE = env_id_from_public_key(bytes(range(1, 33)))  # a link since forgotten: its tasks remain


def new_task(parent: str, run: str, n: int, target: str | None) -> tasks.NewTask:
    return tasks.NewTask(
        parent_thread_id=parent,
        parent_run_id=run,
        namespace="test",
        request_key=f"k{n}",
        request_hash=f"h{n}",
        title=f"task {n}",
        prompt="do it " * 50,
        target_env=target,
        target_label={BOX: "box", GONE: "gone"}.get(target or ""),
        project_id=None,
        provider="script",
        model=None,
        runtime_mode=None,
        interaction_mode=None,
        wake="always",
    )


async def seed(db: Database, parents: list[tuple[str, str]], count: int) -> list[dict[str, Any]]:
    """`count` tasks over the parents and targets, in assorted statuses; what each should be."""
    made = []
    targets = itertools.cycle([None, BOX, GONE, None, BOX])
    ends: list[Any] = [None, "completed", "failed", None, "cancelled", "completed", "interrupted"]
    for n in range(count):
        parent, run = parents[n % len(parents)]
        target = next(targets)
        row, _ = await tasks.record(db, new_task(parent, run, n, target), now=time.time())
        status = "pending"
        if n % 3 == 1:
            await tasks.attach(db, row.id, child_thread_id=f"thr_c{n}", child_run_id=None, now=time.time())
            status = "running"
        if (end := ends[n % len(ends)]) is not None:
            await tasks.finish(db, row.id, end, "done", now=time.time(), wake=False)
            status = end
        made.append({"taskId": row.id, "parent": parent, "status": status, "target": target})
    return made
