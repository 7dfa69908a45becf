"""Orchestration state in SQLite: runs, packets (one row each, rewritten as it moves) and the
append-only receipts each hop ends with. Every change is one transaction, committed before the
engine acts on it, so a restarted daemon resumes from exactly what was recorded.

The states are `orchestrate/states.py`'s, spelled in SQL only through it. A packet's state changes
by compare-and-set in the write transaction (`update_packet`): the row is written only while it is
in the state the writer decided from (or, when it names none, one the table lets go to the new
state); otherwise nothing is written and `StateChanged` says what it is now."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import structlog

from peerd.core.ownership import Owner
from peerd.errors import Conflict, OrchestrationNotFound, StateChanged
from peerd.orchestrate.memo import PacketMemo, parse
from peerd.orchestrate.states import (
    FIRST_PACKET,
    FIRST_RUN,
    OPEN_RUN,
    TERMINAL_PACKET,
    TERMINAL_RUN,
    PacketState,
    RunState,
    can_transition,
    may_become,
)
from peerd.store import ownership
from peerd.store.db import Database
from peerd.store.ids import new_id
from peerd.store.sqltext import sql_list

log = structlog.get_logger(__name__)


@dataclass
class PacketRow:
    orchestration_id: str
    packet_id: str
    position: int
    spec: dict[str, Any]
    state: PacketState
    hop: str | None
    attempt: int
    memo: PacketMemo  # the `retries` column: per-class retry counts, and what a resumed hop needs
    coder: dict[str, Any] | None
    environment: str | None
    thread_id: str | None
    run_id: str | None
    branch: str | None
    commit_sha: str | None
    failure: str | None
    updated_at: float

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_PACKET


@dataclass
class RunRow:
    id: str
    project_id: str
    task: str
    request: dict[str, Any]
    status: RunState
    base_commit: str
    branch: str
    reason: str | None
    created_at: float
    updated_at: float
    ended_at: float | None
    packets: list[PacketRow] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN


WAITING: RunState = "waiting"  # --until: the run waits on its pull request

_DROP_LOGGED: set[tuple[str, str, str]] = set()  # said once per process, not at every read


def _memo(row: Any) -> PacketMemo:
    """The packet's memo, the one place the column is read; a value it cannot keep is logged (and
    is gone from the column at the packet's next write)."""
    try:
        raw = json.loads(row["retries"])
    except ValueError:
        raw = row["retries"]
    memo, dropped = parse(raw)
    for key, why in dropped.items():
        said = (row["orchestration_id"], row["packet_id"], key)
        if said not in _DROP_LOGGED:
            _DROP_LOGGED.add(said)
            log.warning("orchestrate.memo_dropped", run_id=said[0], packet=said[1], key=key, reason=why)
    return memo


def _packet(row: Any) -> PacketRow:
    return PacketRow(
        orchestration_id=row["orchestration_id"],
        packet_id=row["packet_id"],
        position=row["position"],
        spec=json.loads(row["spec"]),
        state=row["state"],
        hop=row["hop"],
        attempt=row["attempt"],
        memo=_memo(row),
        coder=json.loads(row["coder"]) if row["coder"] else None,
        environment=row["environment"],
        thread_id=row["thread_id"],
        run_id=row["run_id"],
        branch=row["branch"],
        commit_sha=row["commit_sha"],
        failure=row["failure"],
        updated_at=row["updated_at"],
    )


def new_run_id() -> str:
    return new_id("orc")


async def create(
    db: Database,
    *,
    project_id: str,
    task: str,
    request: dict[str, Any],
    base_commit: str,
    now: float,
    run_id: str | None = None,
) -> RunRow:
    run_id = run_id or new_run_id()
    # git cannot hold both refs/heads/orchestrate/<run> and .../<run>/<packet>: the packets' branches
    # are orchestrate/<run>/<packet>, the integration branch orchestrate/<run>/integrated.
    branch = f"orchestrate/{run_id}/integrated"
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO orchestrations (id, project_id, task, request, status, base_commit, branch,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, project_id, task, json.dumps(request), FIRST_RUN, base_commit, branch, now, now),
        )
        # The integration branch is the orchestration's before git makes it (core/ownership.py).
        await ownership.claim(
            tx,
            project_id=project_id,
            holding="ref",
            name=f"refs/heads/{branch}",
            owner=Owner.orchestration(run_id),
            purpose="integration",
            now=now,
        )
    return await get(db, run_id)


async def get(db: Database, run_id: str) -> RunRow:
    row = await db.fetchone("SELECT * FROM orchestrations WHERE id = ?", (run_id,))
    if row is None:
        raise OrchestrationNotFound(
            f"No orchestration {run_id!r} here (`peerd orchestrate list` shows them)."
        )
    packets = await db.fetchall(
        "SELECT * FROM orchestration_packets WHERE orchestration_id = ? ORDER BY position", (run_id,)
    )
    return RunRow(
        id=row["id"],
        project_id=row["project_id"],
        task=row["task"],
        request=json.loads(row["request"]),
        status=row["status"],
        base_commit=row["base_commit"],
        branch=row["branch"],
        reason=row["reason"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        ended_at=row["ended_at"],
        packets=[_packet(p) for p in packets],
    )


async def all_runs(db: Database, *, open_only: bool = False, status: RunState | None = None) -> list[str]:
    sql = "SELECT id FROM orchestrations"
    params: tuple[str, ...] = ()
    if open_only:
        sql += f" WHERE status IN {sql_list(OPEN_RUN)}"
    elif status is not None:
        sql, params = sql + " WHERE status = ?", (status,)
    return [r["id"] for r in await db.fetchall(sql + " ORDER BY created_at", params)]


async def packet_state(db: Database, orch_id: str, packet_id: str) -> PacketState:
    row = await db.fetchone(
        "SELECT state FROM orchestration_packets WHERE orchestration_id = ? AND packet_id = ?",
        (orch_id, packet_id),
    )
    if row is None:
        raise OrchestrationNotFound(f"No packet {packet_id!r} in orchestration {orch_id!r}.")
    state: PacketState = row["state"]
    return state


async def set_status(
    db: Database, run_id: str, status: RunState, *, now: float, reason: str | None = None
) -> None:
    ended = now if status in TERMINAL_RUN else None
    async with db.write() as tx:
        await tx.execute(
            "UPDATE orchestrations SET status = ?, reason = COALESCE(?, reason), updated_at = ?,"
            " ended_at = COALESCE(?, ended_at) WHERE id = ?",
            (status, reason, now, ended, run_id),
        )


async def add_packets(db: Database, run_id: str, specs: list[dict[str, Any]], *, now: float) -> None:
    """The plan's packets, once: a replayed plan hop finds them already there."""
    async with db.write() as tx:
        await _insert_packets(tx, run_id, specs, now)


async def record_plan(
    db: Database,
    run_id: str,
    receipt: dict[str, Any],
    specs: list[dict[str, Any]],
    *,
    request: dict[str, Any] | None,
    now: float,
) -> None:
    """The plan hop's end, in one transaction: its receipt, the packets, and (for a planner's
    packets) the coders assigned to them. A crash leaves either all of it or none."""
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO orchestration_receipts (orchestration_id, packet_id, kind, body, created_at)"
            " VALUES (?, NULL, 'plan', ?, ?)",
            (run_id, json.dumps(receipt), now),
        )
        if request is not None:
            await tx.execute(
                "UPDATE orchestrations SET request = ? WHERE id = ?", (json.dumps(request), run_id)
            )
        await _insert_packets(tx, run_id, specs, now)
        await tx.execute("UPDATE orchestrations SET updated_at = ? WHERE id = ?", (now, run_id))


async def _insert_packets(tx: Any, run_id: str, specs: list[dict[str, Any]], now: float) -> None:
    for position, spec in enumerate(specs):
        await tx.execute(
            "INSERT OR IGNORE INTO orchestration_packets (orchestration_id, packet_id, position, spec,"
            " state, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, spec["id"], position, json.dumps(spec), FIRST_PACKET, now),
        )


_PACKET_FIELDS = frozenset(
    {"state", "hop", "attempt", "memo", "coder", "environment", "thread_id", "run_id", "branch",
     "commit_sha", "failure"}
)  # fmt: skip


def _column(key: str, value: Any) -> tuple[str, Any]:
    if key == "memo":  # the one place the column is written
        if not isinstance(value, PacketMemo):
            raise TypeError(f"a packet's memo is a PacketMemo, not {type(value).__name__}")
        return "retries", json.dumps(value.stored())
    return key, json.dumps(value) if key == "coder" and value is not None else value


async def update_packet(
    db: Database,
    orch_id: str,
    packet_id: str,
    *,
    now: float,
    expect: PacketState | None = None,
    **changes: Any,
) -> None:
    """Write a packet's `changes` in one transaction, by compare-and-set: only while the packet is
    in `expect` (the state the writer decided from), or, with no `expect`, for a new `state` only
    while it is in one the table lets go to it. Otherwise nothing is written: `StateChanged` with
    the state it is in (a move the table forbids from `expect` is a bug: `Conflict`)."""
    unknown = set(changes) - _PACKET_FIELDS
    if unknown:
        raise ValueError(f"unknown packet fields: {sorted(unknown)}")
    new: PacketState | None = changes.get("state")
    if new is not None and expect is not None and not can_transition(expect, new):
        raise Conflict(f"Packet {packet_id} cannot go from {expect} to {new}.")
    values = dict(_column(k, v) for k, v in changes.items())
    assignments = ", ".join(f"{key} = ?" for key in values)
    where, params = "orchestration_id = ? AND packet_id = ?", [orch_id, packet_id]
    if expect is not None:
        where, params = where + " AND state = ?", [*params, expect]
    elif new is not None:
        where += f" AND state IN {sql_list(may_become(new))}"
    async with db.write() as tx:
        cur = await tx.execute(
            f"UPDATE orchestration_packets SET {assignments}, updated_at = ? WHERE {where}",  # noqa: S608  # keys checked above, states from states.py
            (*values.values(), now, *params),
        )
        if (cur.rowcount or 0) == 0:
            found = await (
                await tx.execute(
                    "SELECT state FROM orchestration_packets WHERE orchestration_id = ? AND packet_id = ?",
                    (orch_id, packet_id),
                )
            ).fetchone()
            if found is None:
                raise OrchestrationNotFound(f"No packet {packet_id!r} in orchestration {orch_id!r}.")
            said = (
                f"Packet {packet_id} is {found['state']} now, not {expect}: nothing was written."
                if expect is not None
                else f"Packet {packet_id} cannot go from {found['state']} to {new}."
            )
            raise StateChanged(said, current=found["state"])
        await tx.execute("UPDATE orchestrations SET updated_at = ? WHERE id = ?", (now, orch_id))


async def add_receipt(
    db: Database, run_id: str, packet_id: str | None, kind: str, body: dict[str, Any], *, now: float
) -> None:
    async with db.write() as tx:
        await tx.execute(
            "INSERT INTO orchestration_receipts (orchestration_id, packet_id, kind, body, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (run_id, packet_id, kind, json.dumps(body), now),
        )
        await tx.execute("UPDATE orchestrations SET updated_at = ? WHERE id = ?", (now, run_id))


async def receipts(db: Database, run_id: str) -> list[dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT seq, packet_id, kind, body, created_at FROM orchestration_receipts"
        " WHERE orchestration_id = ? ORDER BY seq",
        (run_id,),
    )
    return [
        {"seq": r["seq"], "packetId": r["packet_id"], "kind": r["kind"], "body": json.loads(r["body"]),
         "createdAt": r["created_at"]}
        for r in rows
    ]  # fmt: skip


async def latest_receipt(
    db: Database, run_id: str, packet_id: str | None, kind: str
) -> dict[str, Any] | None:
    row = await db.fetchone(
        "SELECT body FROM orchestration_receipts WHERE orchestration_id = ? AND packet_id IS ? AND kind = ?"
        " ORDER BY seq DESC LIMIT 1",
        (run_id, packet_id, kind),
    )
    return None if row is None else dict(json.loads(row["body"]))


# --- --until: the wait on the pull request (`prwait.py`) ------------------------------------------


async def open_wait(db: Database, run_id: str, wait: dict[str, Any], *, now: float) -> bool:
    """The run waits on its pull request: its `pr_wait` receipt and the status `waiting`, in one
    transaction, only while the run is integrating (or waiting already); False when it is not."""
    async with db.write() as tx:
        cur = await tx.execute(
            "UPDATE orchestrations SET status = ?, updated_at = ? WHERE id = ? AND status IN (?, ?)",
            (WAITING, now, run_id, "integrating", WAITING),
        )
        if (cur.rowcount or 0) == 0:
            return False
        await tx.execute(
            "INSERT INTO orchestration_receipts (orchestration_id, packet_id, kind, body, created_at)"
            " VALUES (?, NULL, 'pr_wait', ?, ?)",
            (run_id, json.dumps(wait), now),
        )
    return True


async def add_fix(
    db: Database,
    run_id: str,
    *,
    wait: dict[str, Any],
    fix: dict[str, Any],
    spec: dict[str, Any],
    coder: dict[str, Any],
    reviewer: dict[str, Any] | None,
    now: float,
) -> bool:
    """A fix attempt, in ONE transaction, only while the run is `waiting`: the wait's end, the
    `pr_fix` receipt, the fix packet (queued, last, with its coder and reviewer recorded in the
    request) and the run back to `running`. A crash leaves all of it or none, so a restart never
    sends a second fix for the same failure; False (nothing written) when the run is not waiting."""
    async with db.write() as tx:
        row = await (
            await tx.execute("SELECT status, request FROM orchestrations WHERE id = ?", (run_id,))
        ).fetchone()
        if row is None or row["status"] != WAITING:
            return False
        request = json.loads(row["request"])
        request["assignment"] = {**(request.get("assignment") or {}), spec["id"]: coder}
        if reviewer is not None:
            request["reviewers"] = {**(request.get("reviewers") or {}), spec["id"]: reviewer}
        position = await (
            await tx.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 AS next FROM orchestration_packets"
                " WHERE orchestration_id = ?",
                (run_id,),
            )
        ).fetchone()
        for packet_id, kind, body in ((None, "pr_wait", wait), (spec["id"], "pr_fix", fix)):
            await tx.execute(
                "INSERT INTO orchestration_receipts (orchestration_id, packet_id, kind, body, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (run_id, packet_id, kind, json.dumps(body), now),
            )
        await tx.execute(
            "INSERT OR IGNORE INTO orchestration_packets (orchestration_id, packet_id, position, spec,"
            " state, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                run_id,
                spec["id"],
                0 if position is None else position["next"],
                json.dumps(spec),
                FIRST_PACKET,
                now,
            ),
        )
        await tx.execute(
            "UPDATE orchestrations SET status = ?, request = ?, updated_at = ? WHERE id = ?",
            ("running", json.dumps(request), now, run_id),
        )
    return True


async def receipts_of_kind(db: Database, run_id: str, kind: str) -> list[dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT body FROM orchestration_receipts WHERE orchestration_id = ? AND kind = ? ORDER BY seq",
        (run_id, kind),
    )
    return [dict(json.loads(r["body"])) for r in rows]
