"""The approvals service against a real store: first decision wins, deadlines, who may decide,
standing grants, and a decision owed across a restart landing once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.approvals import store as approvals_store
from peerd.approvals.rules import Decision
from peerd.approvals.service import ApprovalService, RunContext
from peerd.errors import ApprovalDecided, ApprovalNotAllowed, ApprovalNotFound
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk
from peerd.store.db import Database
from tests.support.eventually import eventually

ASK = ApprovalAsk(
    key="t1", kind="command", tool="Bash", summary="run `make test`", detail={"command": "make test"}
)
RUN = RunContext(run_id="run_1", thread_id="thr_1")
LINKED = RunContext(run_id="run_2", thread_id="thr_2", link_origin="cli_laptop", link_label="laptop")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


def service(db: Database, **kw: object) -> ApprovalService:
    s = ApprovalService(db, ChangeFeed(), clock=lambda: asyncio.get_running_loop().time(), **kw)  # type: ignore[arg-type]
    s.start()
    return s


async def pending_one(db: Database) -> str:
    waiting = await eventually(lambda: approvals_store.pending(db), what="a recorded approval", within=2)
    return waiting[0].id


async def asking(s: ApprovalService, asked: asyncio.Task[ApprovalAnswer]) -> None:
    """Until `asked` waits for a person (its question is the service's to answer), or has ended."""
    await eventually(lambda: s._waiting or asked.done(), what="the ask waiting for a decision")


async def test_a_question_waits_for_the_person_and_the_first_decision_wins(db: Database) -> None:
    s = service(db)
    asked = asyncio.create_task(s.ask(RUN, ASK))
    approval_id = await pending_one(db)
    assert not asked.done()  # recorded, and waiting
    first = await s.decide(approval_id, Decision("approve", "owner", decision_id="d1"))
    answer = await asyncio.wait_for(asked, 5)
    assert answer.allow and answer.approval_id == approval_id
    assert first.status == "approved"
    # The same decision retried is answered as the first; another one is refused, naming the first.
    again = await s.decide(approval_id, Decision("approve", "owner", decision_id="d1"))
    assert again.status == "approved"
    with pytest.raises(ApprovalDecided) as late:
        await s.decide(approval_id, Decision("deny", "link:cli_x", decision_id="d2"))
    assert "first decision stands" in late.value.message
    stored = await approvals_store.get(db, approval_id)
    assert stored is not None and stored.delivered_at is not None and stored.decided_by == "owner"
    await s.stop()


async def test_a_denial_reaches_the_model_with_its_reason(db: Database) -> None:
    s = service(db)
    asked = asyncio.create_task(s.ask(RUN, ASK))
    await s.decide(await pending_one(db), Decision("deny", "owner", reason="use make check"))
    answer = await asyncio.wait_for(asked, 5)
    assert not answer.allow and "use make check" in answer.message and "make test" in answer.message
    await s.stop()


async def test_the_deadline_denies(db: Database) -> None:
    s = service(db, deadline_s=0.2)
    answer = await asyncio.wait_for(s.ask(RUN, ASK), 5)
    assert not answer.allow and "deadline" in answer.message
    (record,) = await approvals_store.of_run(db, "run_1")
    assert record.status == "expired" and record.decided_by == "deadline"
    with pytest.raises(ApprovalDecided):
        await s.decide(record.id, Decision("approve", "owner"))
    await s.stop()


async def test_who_may_decide_a_links_question(db: Database) -> None:
    s = service(db)
    asked = asyncio.create_task(s.ask(LINKED, ASK))
    approval_id = await pending_one(db)
    with pytest.raises(ApprovalNotFound):  # another link does not even see it
        await s.decide(approval_id, Decision("approve", "link:cli_other"), link_client="cli_other")
    with pytest.raises(ApprovalNotAllowed):  # its own link, read-only: watch, not act
        await s.decide(
            approval_id,
            Decision("approve", "link:cli_laptop"),
            link_client="cli_laptop",
            link_runtime="read-only",
        )
    assert (await approvals_store.get(db, approval_id)).pending  # type: ignore[union-attr]
    await s.decide(
        approval_id,
        Decision("approve", "link:cli_laptop"),
        link_client="cli_laptop",
        link_runtime="approval-required",
    )
    assert (await asyncio.wait_for(asked, 5)).allow
    await s.stop()


async def test_a_link_whose_policy_is_deny_is_answered_at_once(db: Database) -> None:
    s = service(db, link_policy=lambda client, label: "deny")
    answer = await asyncio.wait_for(s.ask(LINKED, ASK), 5)
    assert not answer.allow and "policy is deny" in answer.message
    assert await approvals_store.pending(db) == []
    # The owner's own runs still ask.
    asked = asyncio.create_task(s.ask(RUN, ASK))
    await pending_one(db)
    asked.cancel()
    await s.stop()


async def test_standing_grants_for_the_run_and_for_the_command(db: Database) -> None:
    s = service(db)
    asked = asyncio.create_task(s.ask(RUN, ASK))
    await s.decide(await pending_one(db), Decision("approve", "owner", scope="command"))
    await asyncio.wait_for(asked, 5)
    assert (await asyncio.wait_for(s.ask(RUN, ASK), 5)).allow  # same command: not asked again
    other = ApprovalAsk(
        key="t2", kind="command", tool="Bash", summary="run `rm x`", detail={"command": "rm x"}
    )
    asked = asyncio.create_task(s.ask(RUN, other))
    await asking(s, asked)
    assert not asked.done()  # another command is asked
    await s.decide((await approvals_store.pending(db))[0].id, Decision("approve", "owner", scope="run"))
    await asyncio.wait_for(asked, 5)
    third = ApprovalAsk(key="t3", kind="tool", tool="WebFetch", summary="fetch", detail={"input": {}})
    assert (await asyncio.wait_for(s.ask(RUN, third), 5)).allow  # the whole run now
    # Another run of the thread is asked again.
    later = asyncio.create_task(s.ask(RunContext(run_id="run_9", thread_id="thr_1"), ASK))
    await asking(s, later)
    assert not later.done()
    later.cancel()
    await s.stop()


async def test_a_decision_owed_across_a_restart_lands_once(db: Database) -> None:
    queued: list[tuple[str, str]] = []

    async def continue_thread(thread_id: str, asked_in: str, prompt: str) -> bool:
        queued.append((thread_id, prompt))
        assert asked_in == "run_1"
        return True

    before = service(db)
    asked = asyncio.create_task(before.ask(RUN, ASK))
    approval_id = await pending_one(db)
    asked.cancel()  # the daemon stops: the run is cut, the question stays pending
    await before.stop()
    assert (await approvals_store.get(db, approval_id)).pending  # type: ignore[union-attr]

    after = service(db, continue_thread=continue_thread)
    await after.decide(approval_id, Decision("approve", "owner"))
    assert [t for t, _ in queued] == ["thr_1"] and "approved" in queued[0][1]
    # The thread's next run asks the same: it inherits the decision, once.
    resumed = RunContext(run_id="run_3", thread_id="thr_1")
    answer = await asyncio.wait_for(after.ask(resumed, ASK), 5)
    assert answer.allow and answer.approval_id == approval_id
    again = asyncio.create_task(after.ask(RunContext(run_id="run_4", thread_id="thr_1"), ASK))
    await asking(after, again)
    assert not again.done()  # a later run asks anew: the decision was used once
    again.cancel()
    await after.stop()


async def test_a_pending_question_asked_again_after_a_restart_is_the_same_record(db: Database) -> None:
    before = service(db)
    asked = asyncio.create_task(before.ask(RUN, ASK))
    approval_id = await pending_one(db)
    asked.cancel()
    await before.stop()
    after = service(db)
    resumed = RunContext(run_id="run_3", thread_id="thr_1")
    again = asyncio.create_task(after.ask(resumed, ASK))
    await asking(after, again)
    assert [a.id for a in await approvals_store.pending(db)] == [approval_id]
    await after.decide(approval_id, Decision("approve", "owner"))
    assert (await asyncio.wait_for(again, 5)).allow
    assert (await approvals_store.get(db, approval_id)).run_id == "run_3"  # type: ignore[union-attr]
    await after.stop()


async def test_a_run_that_ends_withdraws_its_questions(db: Database) -> None:
    s = service(db)
    asked = asyncio.create_task(s.ask(RUN, ASK))
    approval_id = await pending_one(db)
    asked.cancel()
    await asyncio.sleep(0)  # one turn of the loop: the cancelled ask unwinds before the run ends
    await s.run_ended("run_1", cut=False)
    record = await approvals_store.get(db, approval_id)
    assert record is not None and record.status == "cancelled"
    await s.stop()


async def test_an_orphaned_question_that_expires_queues_nothing(db: Database) -> None:
    """Nobody decided it: there is nothing to tell a new run, so no run is queued for it."""
    queued: list[str] = []

    async def continue_thread(thread_id: str, asked_in: str, prompt: str) -> bool:
        queued.append(thread_id)
        return True

    before = service(db)
    asked = asyncio.create_task(before.ask(RUN, ASK))
    approval_id = await pending_one(db)
    asked.cancel()
    await before.stop()
    loop = asyncio.get_running_loop()
    later = ApprovalService(
        db, ChangeFeed(), clock=lambda: loop.time() + 3600, continue_thread=continue_thread
    )
    (expired,) = await later.expire_due()  # an hour on: past its 30-minute deadline
    assert expired.id == approval_id and expired.status == "expired"
    assert queued == []
    await later.stop()


async def test_a_decision_landing_while_the_gate_reads_is_not_missed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate reads the record, then waits: a decision written between the two must still wake it."""
    from peerd.approvals import service as service_module  # noqa: PLC0415

    s = service(db)
    real_get = approvals_store.get
    decided_in_between = False

    async def get_then_decide(database: Database, approval_id: str) -> Any:
        nonlocal decided_in_between
        seen = await real_get(database, approval_id)  # pending, as the gate will see it
        if seen is not None and seen.pending and not decided_in_between:
            decided_in_between = True
            await s.decide(approval_id, Decision("approve", "owner"))
        return seen

    monkeypatch.setattr(service_module.approvals_store, "get", get_then_decide)
    answer = await asyncio.wait_for(s.ask(RUN, ASK), 5)
    assert decided_in_between and answer.allow
    await s.stop()
