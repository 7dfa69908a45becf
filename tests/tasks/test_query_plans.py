"""Rule: no full scans on the follower's and the change feed's hot paths. Every statement the
laptop's follower and the box's feed run (captured as SQLite executes them) is planned with
`EXPLAIN QUERY PLAN` on a store with history in it, and none scans a table."""

from __future__ import annotations

import time
from pathlib import Path

from peerd.store import projects, threads
from peerd.store.db import Database
from peerd.tasks import feedstore
from peerd.tasks import store as tasks
from tests.queryplans import scans, statements


async def seeded(path: Path) -> Database:
    db = await Database.open(path)
    now = time.time()
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', ?)", (now,)
        )
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
            " in_place, worktree_path, created_at, updated_at, link_origin)"
            " VALUES ('thr_1', 'prj_1', 't', 'script', 'auto', 'default', 0, '/w', ?, ?, 'cli_a')",
            (now, now),
        )
        await tx.execute(
            "INSERT INTO runs (id, thread_id, number, status, prompt, created_at)"
            " VALUES ('run_1', 'thr_1', 1, 'running', 'x', ?)",
            (now,),
        )
        for i in range(300):  # history: ended tasks the open-task queries must not read
            status = "running" if i % 50 == 0 else "completed"
            await tx.execute(
                "INSERT INTO tasks (id, parent_thread_id, parent_run_id, namespace, request_key, request_hash,"
                " title, prompt, target_env, provider, launch_key, child_thread_id, child_run_id, status,"
                " created_at, updated_at) VALUES (?, 'thr_1', 'run_1', 'ns', ?, 'h', 't', 'p', ?, 'script',"
                " 'k', 'thr_x', ?, ?, ?, ?)",
                (f"tsk_{i}", f"k{i}", f"env_{i % 3}", f"run_x{i}", status, now + i, now + i),
            )
    return db  # no ANALYZE: peerd never runs it, so the planner sees what a daemon's store gives it


async def test_no_hot_path_statement_scans_a_table(tmp_path: Path) -> None:
    db = await seeded(tmp_path / "peerd.db")
    try:

        async def laptop() -> None:
            await feedstore.open_tasks(db, "env_1")
            await feedstore.open_task(db, "tsk_50")
            await feedstore.note_error(db, "env_1", "down", now=time.time())
            await tasks.envs_with_open_tasks(db)
            await tasks.backoff(db, "env_1")
            await tasks.set_backoff(db, "env_1", attempts=1, next_at=1.0, error="x")
            await tasks.has_open_children(db, "thr_1")

        async def box() -> None:
            await feedstore.subscription(db, "cli_a")
            await feedstore.resolve(db, "cli_a", ["run_1", "run_unknown"])
            await feedstore.save(db, "cli_a", add={"run_1": "thr_1"}, remove=["run_2"], reset=False)
            await feedstore.save(db, "cli_a", add={"run_1": "thr_1"}, remove=[], reset=True)
            await feedstore.thread_facts(db, "cli_a", ["thr_1", "thr_2"])
            await projects.thread_ids_of_project(db, "prj_1")
            await feedstore.last_reply(db, "thr_1", "run_1")
            await threads.last_reply(db, "run_1")  # a local task's result when its child ends

        ran = await statements(db, laptop) + await statements(db, box)
        assert len(ran) >= 13, ran
        found = {sql: await scans(db, sql) for sql in ran}
        assert {sql: plan for sql, plan in found.items() if plan} == {}
        # A link's open tasks are read from the partial index that holds only open tasks (a link
        # with years of ended tasks costs the follower nothing more).
        for sql in ran:
            if "target_env =" in sql and "stop_owed = 1" in sql:
                plan = " ".join(row[3] for row in await db.fetchall("EXPLAIN QUERY PLAN " + sql))
                assert "tasks_followed" in plan, (sql, plan)
    finally:
        await db.close()
