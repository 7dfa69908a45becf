"""Issue 26, case 9: a wall clock that steps back or forward moves no backoff and no deadline.

Pure: `rules.backoff_wait` (what a restart resumes) and the machine fed monotonic time. Store:
a backoff stored, the wall clock stepped, the follower's start-up read (`backoff_wait`) waits at
most the delay; a task ended after a step back does not end before it was created."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.store import threads
from peerd.store.db import Database
from peerd.tasks import store as tasks
from peerd.tasks.machine import FollowerMachine, SaveBackoff, Sleep
from peerd.tasks.rules import LINK_BACKOFF, backoff_wait
from tests.support.follower import running, synced, watch_of

STEP_S = 600.0


# --- pure -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [-STEP_S, -31 * 86400.0, 0.0])
def test_a_restart_waits_at_most_the_stored_delay_whatever_the_wall_clock_did(step: float) -> None:
    decided = 1_700_000_000.0
    delay = 4.5
    wait = backoff_wait(3, decided + delay, delay, decided + 1.0 + step)
    assert 0.0 <= wait <= delay, "stepped back: never longer than the delay itself"
    if step == 0.0:
        assert wait == pytest.approx(delay - 1.0), "no step: what was left of it"


def test_a_wall_clock_stepped_forward_ends_a_stored_backoff() -> None:
    assert backoff_wait(3, 1000.0 + 8.0, 8.0, 1000.0 + STEP_S) == 0.0


def test_a_row_without_its_delay_is_bounded_by_its_attempts() -> None:
    """A row an older release wrote (no `delay_s`): at most the delay its attempts allow."""
    assert backoff_wait(2, 1000.0 + 4.0, None, 1000.0 - STEP_S) == LINK_BACKOFF.longest(2)


def test_the_machine_backs_off_in_its_own_time_and_says_the_delay() -> None:
    """The machine's `now` is the shell's monotonic clock; what it asks to store is the delay."""
    m = FollowerMachine(chunk_s=50.0, jitter=lambda: 0.5)
    mono = 10.0  # monotonic seconds: small, unrelated to any wall time
    watch_of(synced(m, mono, running()))
    [save, *_] = m.poll_failed(mono, "unreachable", "down")
    assert isinstance(save, SaveBackoff) and save.delay_s == LINK_BACKOFF.delay(1, 0.5)
    assert m.plan(mono + 1.0) == [Sleep(mono + save.delay_s)]


# --- the store: a restart after a wall clock step -------------------------------------------------


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "laptop.db")
    yield database
    await database.close()


async def test_a_restart_after_a_wall_clock_step_back_waits_at_most_the_delay(db: Database) -> None:
    wall = time.time()
    delay = LINK_BACKOFF.delay(4, 0.3)  # 16.3 s
    await tasks.set_backoff(db, "env_box", attempts=4, next_at=wall + delay, delay_s=delay, error="down")
    attempts, wait = await tasks.backoff_wait(db, "env_box", wall_now=wall + 2.0 - STEP_S)
    assert attempts == 4
    assert wait <= delay, f"waited {wait:.0f} s for a {delay:.1f} s backoff"
    _, after_forward = await tasks.backoff_wait(db, "env_box", wall_now=wall + STEP_S)
    assert after_forward == 0.0


async def a_running_task(db: Database, now: float) -> str:
    """A parent thread with a run, and a task of it (remote, attached: running)."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', ?)", (now,)
        )
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
            " in_place, worktree_path, created_at, updated_at) VALUES"
            " ('thr_p', 'prj_1', 't', 'script', 'auto', 'default', 0, '/w', ?, ?)",
            (now, now),
        )
        await tx.execute(
            "INSERT INTO runs (id, thread_id, number, status, prompt, created_at)"
            " VALUES ('run_p', 'thr_p', 1, 'queued', 'x', ?)",
            (now,),
        )
    new = tasks.NewTask(
        parent_thread_id="thr_p",
        parent_run_id="run_p",
        namespace="n",
        request_key="k",
        request_hash="h",
        title="t",
        prompt="p",
        target_env="env_box",
        target_label="box",
        project_id="prj_b",
        provider="script",
        model=None,
        runtime_mode=None,
        interaction_mode=None,
        wake="always",
    )
    task, _ = await tasks.record(db, new, now=now)
    await tasks.attach(db, task.id, child_thread_id="thr_c", child_run_id="run_c", now=now)
    return task.id


async def test_a_task_ended_after_a_step_back_ends_no_earlier_than_it_was_created(db: Database) -> None:
    created = time.time()
    task_id = await a_running_task(db, created)
    ended = await tasks.finish(db, task_id, "completed", "done", now=created - STEP_S)
    assert ended is not None and ended.ended_at is not None
    assert ended.ended_at >= ended.created_at, "ended_at >= created_at, whatever the wall clock did"


async def test_a_run_ended_after_a_step_back_ends_no_earlier_than_it_began(db: Database) -> None:
    """The same flaw in runs (`store/threads/writes.py:_transition`): clamped there too."""
    created = time.time()
    await a_running_task(db, created)
    started = await threads.transition_run(db, "run_p", "starting", now=created - 1.0)
    assert started.started_at is not None and started.started_at >= created
    await threads.transition_run(db, "run_p", "running", now=created + 1.0)
    ended = await threads.transition_run(db, "run_p", "completed", now=created + 1.0 - STEP_S)
    assert ended.ended_at is not None and ended.ended_at >= ended.started_at


def test_any_wall_clock_step_leaves_a_wait_within_the_delay() -> None:
    """Random delays, elapsed times and steps (back and forward, up to 40 days): the wait after a
    restart is within [0, delay], and without a step it is exactly what was left."""
    rng = random.Random(26)
    for _ in range(5_000):
        attempts = rng.randint(1, 30)
        delay = LINK_BACKOFF.delay(attempts, rng.random())
        decided = rng.uniform(0, 2e9)
        elapsed = rng.uniform(0, 2 * delay)
        step = rng.choice([0.0, rng.uniform(-40 * 86400, 40 * 86400)])
        wait = backoff_wait(attempts, decided + delay, delay, decided + elapsed + step)
        assert 0.0 <= wait <= delay
        if step == 0.0:
            assert wait == pytest.approx(max(delay - elapsed, 0.0), abs=1e-6)
