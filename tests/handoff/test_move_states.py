"""A move's states (core/moves.py): one transition table, the only way the store changes a state,
and the only place a state is named in SQL. Every transition the store performs, recorded by a
trigger while each path of a move runs, is in the table (and every edge of the table is taken); an
illegal one is refused and changes nothing; the store's state lists are the partial indexes' own
lists, so their queries use them. A real SQLite file, no sockets."""

from __future__ import annotations

import ast
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import get_args

import pytest

from peerd.core import moves
from peerd.errors import Conflict
from peerd.handoff import store as mstore
from peerd.store import sweep as sweep_store
from peerd.store.db import Database
from peerd.store.schema import MIGRATIONS
from peerd.store.sqltext import sql_list
from tests.queryplans import scans, statements

PEERD = Path(__file__).resolve().parents[2] / "peerd"
STATES = get_args(moves.MoveState)
EDGES = {(a, b) for a, targets in moves.TRANSITIONS.items() for b in targets}


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    now = time.time()
    async with database.write() as tx:
        await tx.execute(
            "INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', ?)", (now,)
        )
        for i in range(8):
            await tx.execute(
                "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode,"
                " in_place, worktree_path, created_at, updated_at)"
                " VALUES (?, 'prj_1', 't', 'script', 'auto', 'default', 0, ?, ?, ?)",
                (f"thr_{i}", f"/w{i}", now, now),
            )
        # Every change of a move's state, as SQLite performs it (whoever issues it).
        await tx.execute("CREATE TEMP TABLE seen (old TEXT, new TEXT)")
        await tx.execute(
            "CREATE TEMP TRIGGER seen_state AFTER UPDATE OF state ON moves WHEN old.state IS NOT new.state"
            " BEGIN INSERT INTO seen VALUES (old.state, new.state); END"
        )
    try:
        yield database
    finally:
        await database.close()


async def seen(db: Database) -> set[tuple[str, str]]:
    async with db.write() as tx:
        cur = await tx.execute("SELECT old, new FROM seen")
        return {(r["old"], r["new"]) for r in await cur.fetchall()}


async def recorded(db: Database, thread: str) -> str:
    row, replayed = await mstore.record(
        db, thread_id=thread, environment_id="ENV", message=None, interrupt=False, started_by="local",
        request_key=None, now=time.time(),
    )  # fmt: skip
    assert not replayed
    return str(row["id"])


async def state(db: Database, move_id: str) -> str:
    return str((await mstore.get(db, move_id))["state"])


def test_the_table_covers_every_state_and_final_states_are_final() -> None:
    assert set(moves.TRANSITIONS) == set(STATES)
    assert {s for s in STATES if not moves.TRANSITIONS[s]} == moves.TERMINAL
    assert set(moves.UNFINISHED) == set(STATES) - moves.TERMINAL
    assert set(moves.HELD) == set(moves.UNFINISHED) | {"moved"}
    assert not any(b == moves.FIRST for _, b in EDGES), "nothing goes back to waiting"
    assert moves.check_transition("waiting", "moving") == "moving"
    for current, new in [
        ("moving", "cancelled"),
        ("moved", "failed"),
        ("cancelled", "moving"),
        ("waiting", "moved"),
    ]:
        with pytest.raises(moves.InvalidTransition):
            moves.check_transition(current, new)  # type: ignore[arg-type]


async def test_every_transition_the_store_performs_is_in_the_table(db: Database) -> None:
    now = time.time()
    done = await recorded(db, "thr_0")  # waiting -> moving -> moved
    assert await mstore.commit_point(db, done, now=now) == "committed"
    await mstore.set_fields(db, done, now=now, there_thread_id="thr_there")
    await mstore.finish(db, done, now=now)
    assert await state(db, done) == "moved"

    told = await recorded(db, "thr_1")  # waiting -> cancelled: a message reached it
    assert await mstore.cancel_waiting(db, "thr_1", reason="a message", now=now) == told
    assert await state(db, told) == "cancelled"

    refused = await recorded(db, "thr_2")  # waiting -> failed: a final refusal before the commit point
    await mstore.fail(db, refused, error="refused", now=now)
    assert await state(db, refused) == "failed"

    late = await recorded(db, "thr_3")  # moving -> failed, the thread's queue as it was before
    assert await mstore.commit_point(db, late, now=now) == "committed"
    await mstore.fail(db, late, error="refused", now=now)
    assert await state(db, late) == "failed"

    archived = await recorded(db, "thr_4")  # waiting -> cancelled at the commit point
    async with db.write() as tx:
        await tx.execute("UPDATE threads SET status = 'archived' WHERE id = 'thr_4'")
    assert await mstore.commit_point(db, archived, now=now) == "gone"
    assert await state(db, archived) == "cancelled"

    asked = await recorded(db, "thr_5")  # waiting -> cancelled: a user run after the request
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO runs (id, thread_id, number, status, prompt, origin, created_at)"
            " VALUES ('run_5', 'thr_5', 1, 'completed', 'x', 'user', ?)",
            (now + 60,),
        )
    assert await mstore.commit_point(db, asked, now=now) == "gone"

    # What changes nothing: a finished move is not finished, failed or cancelled again.
    await mstore.finish(db, done, now=now)
    await mstore.fail(db, done, error="late", now=now)
    assert await mstore.cancel_waiting(db, "thr_0", reason="late", now=now) is None
    assert await mstore.commit_point(db, told, now=now) == "gone"

    performed = await seen(db)
    assert performed <= EDGES, performed - EDGES
    assert performed == EDGES, f"the table has edges no path takes: {EDGES - performed}"


async def test_an_illegal_transition_is_refused_and_changes_nothing(db: Database) -> None:
    move_id = await recorded(db, "thr_6")
    await mstore.cancel_waiting(db, "thr_6", reason="a message", now=time.time())
    row = await mstore.get(db, move_id)
    for new in ("waiting", "moving", "moved", "failed"):
        with pytest.raises(moves.InvalidTransition):
            async with db.write() as tx:
                await mstore._move_to(tx, row, new, now=time.time())  # type: ignore[arg-type]
    assert await state(db, move_id) == "cancelled" and await seen(db) == {("waiting", "cancelled")}
    # A legal change from the state a caller read is still refused when the row moved on meanwhile.
    stale = await mstore.get(db, await recorded(db, "thr_7"))  # waiting
    await mstore.cancel_waiting(db, "thr_7", reason="a message", now=time.time())
    with pytest.raises(Conflict):
        async with db.write() as tx:
            await mstore._move_to(tx, stale, "moving", now=time.time())
    assert await state(db, stale["id"]) == "cancelled"


def _sql_strings(path: Path) -> list[str]:
    """Every string in a module (f-strings: their literal parts), implicit concatenations joined."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
    return found


@pytest.mark.slow
def test_sql_names_a_move_state_only_through_the_tables_constants() -> None:
    quoted = re.compile(r"'(" + "|".join(STATES) + r")'")
    offenders = []
    for path in PEERD.rglob("*.py"):
        if path.name == "schema.py":  # migrations are history: their index predicates are checked below
            continue
        for text in _sql_strings(path):
            if re.search(r"\bmoves\b", text) and quoted.search(text):
                offenders.append(f"{path.relative_to(PEERD)}: {text!r}")
    handoff_store = PEERD / "handoff" / "store.py"
    offenders += [f"handoff/store.py: {t!r}" for t in _sql_strings(handoff_store) if quoted.search(t)]
    assert offenders == []
    changes = [t for t in _sql_strings(handoff_store) if re.search(r"UPDATE moves SET state", t)]
    assert len(changes) == 1, "one statement changes a move's state: _move_to"


async def test_the_state_lists_are_the_partial_indexes_own_and_their_queries_use_them(db: Database) -> None:
    ddl = " ".join(sql for migration in MIGRATIONS for sql in migration)
    assert f"moves_open ON moves(thread_id) WHERE state IN {sql_list(moves.HELD)}" in ddl
    assert f"moves_unfinished ON moves(state) WHERE state IN {sql_list(moves.UNFINISHED)}" in ddl
    for i in range(4):
        await recorded(db, f"thr_{i}")
        await mstore.cancel_waiting(db, f"thr_{i}", reason="history", now=time.time())
    await recorded(db, "thr_5")

    async def reads() -> None:
        await mstore.current(db, "thr_5")
        await mstore.unfinished(db)
        await mstore.cancel_waiting(db, "thr_6", reason="none", now=time.time())
        await db.fetchall(sweep_store.QUERIES[-1])

    ran = [sql for sql in await statements(db, reads) if "FROM moves" in sql]
    assert len(ran) == 4
    for sql in ran:
        assert await scans(db, sql) == [], sql


def test_only_plain_state_names_are_spelt_into_sql() -> None:
    assert sql_list(moves.UNFINISHED) == "('waiting', 'moving')"
    for bad in ([], ["it's"], ["Waiting"], ["a b"], ["x') OR 1=1 --"]):
        with pytest.raises(ValueError, match="not a list of state names"):
            sql_list(bad)
