"""An orchestration's packet states (`peerd/orchestrate/states.py`): one table, the store's SQL built
from it, each state change a compare-and-set in the write transaction (a stale writer cannot write
over a newer state), and what the API shows of a packet read through the same sets."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from pathlib import Path
from typing import get_args

import pytest

from peerd.approvals import store as approvals_store
from peerd.errors import Conflict, OrchestrationNotFound, StateChanged
from peerd.orchestrate import states, views
from peerd.orchestrate import store as ostore
from peerd.orchestrate.memo import PacketMemo
from peerd.store.db import Database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    async with database.write() as tx:
        await tx.execute("INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', 0)")
    try:
        yield database
    finally:
        await database.close()


async def a_run(db: Database) -> str:
    run = await ostore.create(db, project_id="prj_1", task="t", request={}, base_commit="c" * 40, now=1.0)
    await ostore.add_packets(db, run.id, [{"id": "a"}, {"id": "b"}], now=1.0)
    return run.id


def test_the_table_names_every_state_and_the_terminal_ones_go_nowhere() -> None:
    assert get_args(states.PacketState) == states.PACKET_STATES
    assert set(states.TRANSITIONS) == set(states.PACKET_STATES)
    assert {s for s, to in states.TRANSITIONS.items() if not to} == states.TERMINAL_PACKET
    assert states.FAILED_PACKET <= states.TERMINAL_PACKET and "failed" not in states.PACKET_STATES
    assert set(states.OPEN_RUN) | states.TERMINAL_RUN == set(get_args(states.RunState))
    assert not set(states.OPEN_RUN) & states.TERMINAL_RUN
    assert states.may_become("verifying") == ("implementing", "verifying")
    assert states.may_become("approved") == ("reviewing", "approved")
    assert "approved" not in states.may_become("cancelled")


async def test_a_stale_writer_cannot_overwrite_a_newer_state(db: Database) -> None:
    run_id = await a_run(db)
    # Two writers read the packet queued; the first moves it on.
    await ostore.update_packet(db, run_id, "a", now=2.0, expect="queued", state="implementing", attempt=1)
    with pytest.raises(StateChanged) as stale:
        await ostore.update_packet(db, run_id, "a", now=3.0, expect="queued", state="parked", failure="late")
    assert stale.value.current == "implementing"
    packet = (await ostore.get(db, run_id)).packets[0]
    assert (packet.state, packet.failure, packet.attempt, packet.updated_at) == ("implementing", None, 1, 2.0)
    # Without an expected state, a write lands only from a state the table lets go to the new one.
    await ostore.update_packet(db, run_id, "a", now=4.0, state="verifying")
    await ostore.update_packet(db, run_id, "a", now=5.0, state="cancelled", failure="stop")
    with pytest.raises(StateChanged) as late:
        await ostore.update_packet(db, run_id, "a", now=6.0, state="reviewing")
    assert late.value.current == "cancelled"
    assert (await ostore.packet_state(db, run_id, "a")) == "cancelled"
    # A move the table forbids is a bug, refused before the store is asked; an unknown packet is named.
    with pytest.raises(Conflict, match="cannot go from queued to approved"):
        await ostore.update_packet(db, run_id, "b", now=7.0, expect="queued", state="approved")
    with pytest.raises(OrchestrationNotFound):
        await ostore.update_packet(db, run_id, "nope", now=7.0, expect="queued", state="implementing")
    # A change without a state still checks the expected one.
    await ostore.update_packet(db, run_id, "b", now=8.0, expect="queued", memo=PacketMemo(base="x"))
    with pytest.raises(StateChanged):
        await ostore.update_packet(db, run_id, "b", now=9.0, expect="reviewing", memo=PacketMemo(base="y"))
    assert (await ostore.get(db, run_id)).packets[1].memo.base == "x"


async def test_open_runs_are_the_table_s(db: Database) -> None:
    run_id = await a_run(db)
    assert await ostore.all_runs(db, open_only=True) == [run_id]
    for status in states.OPEN_RUN:
        await ostore.set_status(db, run_id, status, now=2.0)
        assert await ostore.all_runs(db, open_only=True) == [run_id], status
    for status in sorted(states.TERMINAL_RUN):
        await ostore.set_status(db, run_id, status, now=3.0)
        assert await ostore.all_runs(db, open_only=True) == [], status
        assert (await ostore.get(db, run_id)).terminal


async def test_a_finished_packet_awaits_no_approval(db: Database) -> None:
    """`awaitingApproval` of a packet: its coder's question while one waits; a packet in a final
    state waits on nothing, even when a box's stale question for its thread is still mirrored."""
    run_id = await a_run(db)
    question = {"id": "apr_1", "threadId": "thr_box", "status": "pending", "summary": "rm -rf build"}
    await approvals_store.mirror(db, "env_box", [question], now=1.0)
    await ostore.update_packet(
        db, run_id, "a", now=2.0, state="implementing", environment="env_box", thread_id="thr_box"
    )
    packet = (await ostore.get(db, run_id)).packets[0]
    assert await views._awaiting(db, packet) == {
        "approvalId": "apr_1",
        "summary": "rm -rf build",
        "environmentId": "env_box",
    }
    for final in sorted(states.TERMINAL_PACKET):
        packet.state = final
        assert await views._awaiting(db, packet) is None, final


def test_the_store_and_views_spell_no_state_in_sql_or_sets() -> None:
    """A state named as a string in the store's SQL, or a set of states written out in the store
    or the views, is how `failed` and `merged` (states that do not exist) got there."""
    names = set(states.PACKET_STATES) | set(get_args(states.RunState)) | {"failed", "merged"}
    found = []
    for name in ("store.py", "views.py"):
        path = ROOT / "peerd" / "orchestrate" / name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if any(f"'{s}'" in text for s in names):
                found.append(f"{name}:{node.lineno} SQL {node.value!r}")
            if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
                spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
                if len(spelled) > 1:
                    found.append(f"{name}:{node.lineno} {spelled}")
    assert not found
