"""A packet's memo (the `orchestration_packets.retries` column) as the release before the typed memo
stored it loads into `PacketMemo`, keeps every value, and is written back with nothing lost: keys
this release does not know survive; a known key with a value of the wrong kind is dropped, said
once in the log, and never costs the packet.

The memos below were written by that release (main at a083a13) in real orchestrations (the tests of
tests/orchestrate, their `update_packet` calls recorded), long prompts and sentences shortened."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from peerd.orchestrate import store as ostore
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import CheckoutChange
from peerd.store.db import Database

NOTICE = "notice: peerd confines this run (bubblewrap): it sees the system's programs and libraries ..."

# A packet whose check failed once on content, went back to its coder, passed, and was reviewed
# (test_a_content_failure_goes_back_once_then_parks), with a deadline (--packet-timeout).
REVIEWED: dict[str, Any] = {
    "base": "da3c6cb1e28bcdcafe1160affc4c84d46a3fa32c",
    "sends": 1,
    "prompt": "You are a delegated implementation agent. An orchestrator assigned you one work packet ...",
    "deadline": 1796194813.1114542,
    "hop_started": 1796194513.1114542,
    "hop_runs": [],
    "report": "",
    "coder_errors": [NOTICE],
    "recovered": [],
    "not_recovered": [],
    "recovery_problem": None,
    "stray": [],
    "user_paths": [],
    "left": [],
    "checkout": [],
    "reruns": 1,
    "content": 1,
    "pending_send": None,
    "pending_after": None,
    "review_started": 1796194514.4855125,
    "review_thread": "thr_819a3790dc54467e6178",
    "review_run": "run_da616d3b2b53f2be3dc1",
    "review_round": 1,
    "review_env": None,
    "review_runs": ["run_da616d3b2b53f2be3dc1"],
}
# Re-dispatched after an empty diff (test_an_empty_diff_is_redispatched_to_another_coder), resumed
# once after a restart, with an escaped edit recovered and a stray one left
# (test_an_edit_that_escaped_into_the_checkout_is_recovered_in_scope_only).
REDISPATCHED: dict[str, Any] = {
    "base": "75cff84fa18b97bd0fc5aec1d04d076958d17153",
    "sends": 0,
    "prompt": "You are a delegated implementation agent. An orchestrator assigned you one work packet ...",
    "deadline": None,
    "hop_started": 1796194519.5161958,
    "hop_runs": ["run_9650dff0600cb98bb40c", "run_0f1e2d3c4b5a69788796"],
    "resumes": 1,
    "report": "Done: calc.py fixed.",
    "coder_errors": [],
    "recovered": ["calc.py"],
    "not_recovered": [],
    "recovery_problem": None,
    "stray": ["notes.txt"],
    "user_paths": [],
    "left": [],
    "checkout": [
        {"path": "calc.py", "moved": True, "reason": "proven"},
        {"path": "notes.txt", "moved": False, "reason": "outside_files"},
    ],
    "redispatch": 1,
    "previous_failure": "The coder changed nothing.\nIts run reported:\n- " + NOTICE,
}
# Cancelled while its coder ran on a box that could not be told (a reviewer there too)
# (test_a_cancel_the_box_cannot_hear_is_owed_until_it_lands).
OWED: dict[str, Any] = {
    "base": "08e8fe75b3e4edd232b0277e17e2a5ff82d89110",
    "sends": 0,
    "prompt": "You are a delegated implementation agent. An orchestrator assigned you one work packet ...",
    "deadline": None,
    "hop_started": 1796194546.5376287,
    "hop_runs": ["run_9ab99706a44b022194fc"],
    "review_thread": "thr_5e4d3c2b1a0f9e8d7c6b",
    "review_env": "box",
    "review_round": 1,
    "stop_owed": [["thr_f74ef9de97993442d40a", "box"], ["thr_5e4d3c2b1a0f9e8d7c6b", "box"]],
}
STORED_TODAY = {"reviewed": REVIEWED, "redispatched": REDISPATCHED, "owed": OWED, "queued": {}}


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


async def stored_run(db: Database, memos: dict[str, dict[str, Any]]) -> str:
    """A run with one packet per memo, each column holding that JSON exactly as it was written."""
    async with db.write() as tx:
        await tx.execute("INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/p', 0)")
    run = await ostore.create(
        db, project_id="prj_1", task="t", request={"coders": []}, base_commit="b" * 40, now=1.0
    )
    specs = [{"id": pid, "goal": "g", "files": ["calc.py"], "verify": "true"} for pid in memos]
    await ostore.add_packets(db, run.id, specs, now=1.0)
    async with db.write() as tx:
        for pid, memo in memos.items():
            await tx.execute(
                "UPDATE orchestration_packets SET retries = ? WHERE orchestration_id = ? AND packet_id = ?",
                (json.dumps(memo), run.id, pid),
            )
    return run.id


async def column(db: Database, run_id: str, packet_id: str) -> Any:
    row = await db.fetchone(
        "SELECT retries FROM orchestration_packets WHERE orchestration_id = ? AND packet_id = ?",
        (run_id, packet_id),
    )
    assert row is not None
    return json.loads(row["retries"])


def without_defaults(memo: dict[str, Any]) -> dict[str, Any]:
    """What the typed memo writes back: every entry but those holding their default."""
    defaults = PacketMemo().model_dump(mode="json")
    return {k: v for k, v in memo.items() if k not in defaults or v != defaults[k]}


async def test_a_memo_as_stored_today_loads_with_every_value_typed(db: Database) -> None:
    run_id = await stored_run(db, STORED_TODAY)
    packets = {p.packet_id: p for p in (await ostore.get(db, run_id)).packets}
    for pid, stored in STORED_TODAY.items():
        memo = packets[pid].memo
        assert memo.model_extra == {}, f"{pid}: every key this release stores is a typed field"
        assert memo.model_dump(mode="json") | stored == memo.model_dump(mode="json"), pid
    reviewed, redispatched, owed = (
        packets["reviewed"].memo,
        packets["redispatched"].memo,
        packets["owed"].memo,
    )
    assert (reviewed.content, reviewed.reruns, reviewed.sends, reviewed.review_round) == (1, 1, 1, 1)
    assert reviewed.deadline == REVIEWED["deadline"] and reviewed.pending_send is None
    assert redispatched.checkout == [
        CheckoutChange(path="calc.py", moved=True, reason="proven"),
        CheckoutChange(path="notes.txt", moved=False, reason="outside_files"),
    ]
    assert (redispatched.redispatch, redispatched.resumes) == (1, 1)
    assert owed.stop_owed == [("thr_f74ef9de97993442d40a", "box"), ("thr_5e4d3c2b1a0f9e8d7c6b", "box")]
    assert packets["queued"].memo == PacketMemo(), "a packet not started yet: its memo is `{}`"
    # The API's `retries`: the counters above zero, as the old view showed them (less `sends: 0`).
    assert reviewed.counters() == {"content": 1, "reruns": 1, "sends": 1, "review_round": 1}
    assert redispatched.counters() == {"redispatch": 1, "resumes": 1}


async def test_a_memo_as_stored_today_is_written_back_with_nothing_lost(db: Database) -> None:
    run_id = await stored_run(db, STORED_TODAY)
    for packet in (await ostore.get(db, run_id)).packets:
        await ostore.update_packet(db, run_id, packet.packet_id, now=2.0, memo=packet.memo)
        written = await column(db, run_id, packet.packet_id)
        assert written == without_defaults(STORED_TODAY[packet.packet_id]), packet.packet_id
    again = {p.packet_id: p.memo for p in (await ostore.get(db, run_id)).packets}
    assert again["reviewed"].model_dump() == PacketMemo.model_validate(REVIEWED).model_dump()


async def test_unknown_keys_survive_and_a_bad_value_is_dropped_with_its_reason(db: Database) -> None:
    later = {**OWED, "next_release_key": {"kept": [1, 2]}, "sends": "many", "review_round": -1}
    run_id = await stored_run(db, {"p": later})
    with structlog.testing.capture_logs() as logs:
        memo = (await ostore.get(db, run_id)).packets[0].memo
        await ostore.get(db, run_id)  # read again: said once
    assert memo.model_extra == {"next_release_key": {"kept": [1, 2]}}
    assert (memo.sends, memo.review_round, memo.stop_owed[0]) == (0, 0, ("thr_f74ef9de97993442d40a", "box"))
    dropped = [e for e in logs if e["event"] == "orchestrate.memo_dropped"]
    assert sorted(e["key"] for e in dropped) == ["review_round", "sends"]
    assert all(e["packet"] == "p" and e["reason"] for e in dropped)
    memo.sends = 2
    await ostore.update_packet(db, run_id, "p", now=2.0, memo=memo)
    written = await column(db, run_id, "p")
    assert written["next_release_key"] == {"kept": [1, 2]}, "an unknown key is written back as it was"
    assert written["sends"] == 2 and "review_round" not in written


async def test_a_memo_that_is_not_an_object_loads_empty_and_a_write_needs_a_typed_memo(db: Database) -> None:
    run_id = await stored_run(db, {"p": {}})
    async with db.write() as tx:
        await tx.execute(
            "UPDATE orchestration_packets SET retries = '[1, 2]' WHERE orchestration_id = ?", (run_id,)
        )
    with structlog.testing.capture_logs() as logs:
        assert (await ostore.get(db, run_id)).packets[0].memo == PacketMemo()
    assert [e["key"] for e in logs if e["event"] == "orchestrate.memo_dropped"] == [""]
    with pytest.raises(TypeError):
        await ostore.update_packet(db, run_id, "p", now=2.0, memo={"sends": 1})
