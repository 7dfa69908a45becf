"""The ownership ledger: who owns each ref, worktree and checkout peerd made or landed (the rules
are `core/ownership.py`; the table is `git_owners`, migration 17).

A record is written in the same transaction as the decision that makes the thing (a thread's
launch, an orchestration's creation, a move's start, a landing), so it is committed before git
is asked to make it. A record is created once and never given to another owner (`claim`): a
second claim by the same owner is a no-op, one by another owner is refused. It is forgotten
when what it names is removed by its owner (`forget`).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiosqlite

from peerd.core.ownership import Holding, Owner, Right, effective_owner, may_change
from peerd.errors import NotYours
from peerd.store.db import Database, Tx


@dataclass(frozen=True, slots=True)
class Owned:
    project_id: str
    holding: Holding
    name: str
    owner: Owner
    purpose: str
    thread_id: str | None
    created_at: float


def _owned(r: aiosqlite.Row) -> Owned:
    return Owned(
        project_id=r["project_id"],
        holding=r["holding"],
        name=r["name"],
        owner=Owner.from_key(r["owner"]),
        purpose=r["purpose"],
        thread_id=r["thread_id"],
        created_at=float(r["created_at"]),
    )


async def claim(
    tx: Tx,
    *,
    project_id: str,
    holding: Holding,
    name: str,
    owner: Owner,
    purpose: str,
    now: float,
    thread_id: str | None = None,
) -> Owned:
    """Record `owner` for `name` inside the caller's transaction; the same owner again is fine (the
    first record stays), another owner raises `NotYours`."""
    await tx.execute(
        "INSERT OR IGNORE INTO git_owners (project_id, holding, name, owner, purpose, thread_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (project_id, holding, name, owner.key, purpose, thread_id, now),
    )
    async with tx.execute(
        "SELECT * FROM git_owners WHERE project_id = ? AND holding = ? AND name = ?",
        (project_id, holding, name),
    ) as cur:
        row = await cur.fetchone()
    assert row is not None  # noqa: S101  # inserted or already there, in this transaction
    found = _owned(row)
    if found.owner != owner:
        raise NotYours(
            f"{name} belongs to {found.owner.describe()} here; {owner.describe()} may not take it."
        )
    return found


async def claim_one(
    db: Database,
    *,
    project_id: str,
    holding: Holding,
    name: str,
    owner: Owner,
    purpose: str,
    now: float,
    thread_id: str | None = None,
) -> Owned:
    """`claim` in a transaction of its own."""
    async with db.write() as tx:
        return await claim(
            tx,
            project_id=project_id,
            holding=holding,
            name=name,
            owner=owner,
            purpose=purpose,
            now=now,
            thread_id=thread_id,
        )


async def owner_of(db: Database, project_id: str, holding: Holding, name: str) -> Owned | None:
    row = await db.lookup(
        "SELECT * FROM git_owners WHERE project_id = ? AND holding = ? AND name = ?",
        (project_id, holding, name),
    )
    return None if row is None else _owned(row)


async def right_to(
    db: Database, project_id: str, ref: str, *, caller: Owner, exists: bool
) -> tuple[Right, Owner | None]:
    """What `caller` may do with `ref` by the ledger (`core/ownership.py:may_change`), and whose it
    is (`effective_owner`: an unrecorded ref git has is the person's; None: nobody's)."""
    owned = await owner_of(db, project_id, "ref", ref)
    recorded = None if owned is None else owned.owner
    return may_change(recorded, exists=exists, caller=caller), effective_owner(recorded, exists)


async def forget(tx: Tx, project_id: str, holding: Holding, name: str, *, owner: Owner) -> None:
    """Drop the record of what `owner` removed (a record of another owner stays)."""
    await tx.execute(
        "DELETE FROM git_owners WHERE project_id = ? AND holding = ? AND name = ? AND owner = ?",
        (project_id, holding, name, owner.key),
    )


async def forget_one(db: Database, project_id: str, holding: Holding, name: str, *, owner: Owner) -> None:
    async with db.write() as tx:
        await forget(tx, project_id, holding, name, owner=owner)


async def listing(db: Database, project_id: str) -> list[Owned]:
    rows = await db.fetchall(
        "SELECT * FROM git_owners WHERE project_id = ? ORDER BY holding, name", (project_id,)
    )
    return [_owned(r) for r in rows]
