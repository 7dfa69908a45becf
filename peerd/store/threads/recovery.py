"""What a daemon stop cut: the runs a dead daemon left live, and their recovery in one transaction."""

from __future__ import annotations

from collections.abc import Collection

from peerd.core.runs import (
    BUDGET_EXCEEDED,
    DAEMON_STOPPED,
    CutHow,
    CutThread,
    continuation_prompt,
    recover_at_startup,
    thread_kind,
)
from peerd.core.usage import scope_budget, scope_exceeded, spent_before
from peerd.store.db import Database, Tx
from peerd.store.threads.rows import add_event, fetch_must, view_from_row
from peerd.store.threads.usage import priced, scope_in
from peerd.store.threads.writes import insert_item, new_run


async def live_run_groups(db: Database) -> list[tuple[str, int]]:
    """(run id, process group) of runs recorded live: at start-up, what a dead daemon left running."""
    rows = await db.fetchall(
        "SELECT id, pgid FROM runs WHERE status IN ('starting', 'running') AND pgid IS NOT NULL"
    )
    return [(r["id"], int(r["pgid"])) for r in rows]


async def recover(
    db: Database,
    *,
    now: float,
    reason: str | None = None,
    label: str | None = None,
    continue_children: bool = False,
    how: CutHow = "crash",
    only: Collection[str] | None = None,
) -> list[str]:
    """Runs a daemon stop cut (every live one, or those in `only`), in one transaction: each is
    interrupted with the reason (naming this environment: `label`) and an error item carrying the
    code `daemon_stopped`; where the run rules say so (`core.runs.recover_at_startup`) a
    continuation is queued in the same transaction, so what is owed is recorded before anything
    starts. `reason` replaces the planned reason. Returns the cut runs."""
    async with db.write() as tx:
        async with tx.execute(
            "SELECT DISTINCT thread_id FROM runs WHERE status IN ('starting', 'running')"
        ) as cur:
            thread_ids = [r["thread_id"] for r in await cur.fetchall()]
        cuts = [await _cut_thread(tx, thread_id) for thread_id in thread_ids]
        live = [run.id for cut in cuts for run in cut.runs if run.status in ("starting", "running")]
        past = {run_id: why for run_id in live if (why := await _past_budget(db, tx, run_id)) is not None}
        plans = recover_at_startup(
            cuts, label=label, continue_children=continue_children, how=how, over_budget=past
        )
        owner = {
            run.id: thread_id for thread_id, cut in zip(thread_ids, cuts, strict=True) for run in cut.runs
        }
        done: list[str] = []
        for plan in plans:
            if only is not None and plan.run_id not in only:
                continue
            thread_id, why = owner[plan.run_id], reason or plan.reason
            if plan.status == "failed":
                why = plan.reason  # the budget's reason, whatever the stop would have said
            await tx.execute(
                "UPDATE runs SET status = ?, reason = ?, ended_at = max(?, created_at), token_hash = NULL"
                " WHERE id = ?",
                (plan.status, why, now, plan.run_id),
            )
            code = BUDGET_EXCEEDED if plan.status == "failed" else DAEMON_STOPPED
            await insert_item(tx, thread_id, plan.run_id, "error", why, {"code": code}, now)
            data = {"runId": plan.run_id, "status": plan.status, "reason": why}
            await add_event(tx, thread_id, "run.updated", data, now)
            if plan.continued:
                repeated = None
                if plan.repeat_prompt_of is not None:
                    row = await fetch_must(
                        tx, "SELECT prompt FROM runs WHERE id = ?", (plan.repeat_prompt_of,)
                    )
                    repeated = str(row["prompt"])
                prompt = continuation_prompt(repeated)
                await new_run(tx, thread_id, prompt, now, origin="continue", continues=plan.run_id)
            done.append(plan.run_id)
    return done


async def _past_budget(db: Database, tx: Tx, run_id: str) -> str | None:
    """Why a cut run's work had already passed its budget, from the usage recorded before the
    stop (the stop the budget asked for may not have landed); None: within it, or no budget."""
    scope = await scope_in(tx, run_id)
    budget = await priced(db, run_id, scope_budget(scope))
    if budget is None or not scope:
        return None
    own = scope[-1].usage
    wall_s = 0.0 if own is None else (own.wall_ms or 0) / 1000
    return scope_exceeded(budget, spent_before(scope), own, wall_s)


async def _cut_thread(tx: Tx, thread_id: str) -> CutThread:
    row = await fetch_must(tx, "SELECT * FROM threads WHERE id = ?", (thread_id,))
    async with tx.execute(
        "SELECT id, number, status, origin, continues FROM runs WHERE thread_id = ? ORDER BY number",
        (thread_id,),
    ) as cur:
        runs = tuple(view_from_row(r) for r in await cur.fetchall())
    return CutThread(
        kind=thread_kind(started_by=row["started_by"], delegated=row["delegated_from"] is not None),
        stopped=bool(row["queue_held"]) or row["status"] == "archived",
        has_session=row["provider_session"] is not None,
        runs=runs,
    )
