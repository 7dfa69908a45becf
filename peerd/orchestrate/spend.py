"""What an orchestration's hops spent, and its budgets as stop rules.

Every coder run a hop waited for is recorded when it ends, as a `run` receipt: its run id, thread,
environment, role, its usage (`peerd.core.usage.Usage` JSON, null when its provider reported none)
and its time in seconds. A run here is read from this machine's store; a run on a box from the
box's thread (its latest run, which is the one the hop just waited for), as the link brings it.
A replayed hop records its run again: readers keep the last record of each run id.

From those records:

- a hop's receipt carries the usage of its own runs (the implementer's launch, resumes and
  follow-ups of that attempt; a reviewer's round) and the state of each budget given;
- a packet's spend is every run recorded for it, and the orchestration's every run (the planner's
  too);
- `--packet-budget` stops a packet past it (parked with "budget exceeded: 51,200 of 50,000
  tokens"), `--budget` the whole orchestration (no new hop starts; the run fails with the reason);
- each hop's run gets what is left of both as its own run budget (`hop_budget`), so the run manager
  stops it as its usage arrives, here or on the box.

Pure functions over the receipts, except `record_run`, `check` and `stop_over_budget`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerd import contracts as c
from peerd.core.usage import Budget, Measure, Usage, exceeded, exceeded_by, remaining, tightest, total
from peerd.errors import PeerdError
from peerd.orchestrate import cleanup
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings
from peerd.orchestrate.models import BudgetState
from peerd.store import threads

RUN = "run"  # the receipt kind of one ended coder run
HOP_BUDGET = "hop_budget"  # the run budget a hop's launch or send carried
WHOLE = " (the whole orchestration's --budget)"


@dataclass(frozen=True)
class Spend:
    usage: Usage | None  # None: no run reported any
    seconds: float


def _runs(
    receipts: Iterable[Mapping[str, Any]], packet_id: str | None, *, every: bool
) -> list[dict[str, Any]]:
    """The run records of one packet (or of every packet and the planner), the last of each run id."""
    found: dict[str, dict[str, Any]] = {}
    for receipt in receipts:
        if receipt["kind"] == RUN and (every or receipt["packetId"] == packet_id):
            found[str(receipt["body"]["runId"])] = dict(receipt["body"])
    return list(found.values())


def spend_of(bodies: Iterable[Mapping[str, Any]]) -> Spend:
    listed = list(bodies)
    usage = total(Usage.from_json(b["usage"]) for b in listed if isinstance(b.get("usage"), dict))
    seconds = sum(float(b.get("seconds") or 0.0) for b in listed)
    return Spend(usage, round(seconds, 3))


def packet_spend(receipts: Sequence[Mapping[str, Any]], packet_id: str) -> Spend:
    return spend_of(_runs(receipts, packet_id, every=False))


def whole_spend(receipts: Sequence[Mapping[str, Any]]) -> Spend:
    return spend_of(_runs(receipts, None, every=True))


def hop_usage(receipts: Sequence[Mapping[str, Any]], run_ids: Iterable[Any]) -> c.Usage | None:
    """The usage of a hop's runs (null: none of them reported any)."""
    wanted = {str(r) for r in run_ids}
    bodies = [b for b in _runs(receipts, None, every=True) if b["runId"] in wanted]
    return wire(spend_of(bodies).usage)


def wire(usage: Usage | None) -> c.Usage | None:
    return None if usage is None else c.Usage.model_validate(usage.to_json())


def _state(scope: Any, limit: Budget, spend: Spend) -> BudgetState:
    why = exceeded(limit, spend.usage, spend.seconds)
    return BudgetState(
        scope=scope,
        limit=c.Budget(tokens=limit.tokens, usd=limit.usd, seconds=limit.seconds),
        spent=wire(spend.usage),
        seconds=spend.seconds,
        exceeded=why is not None,
        reason=why,
    )


def states(
    settings: Settings, receipts: Sequence[Mapping[str, Any]], packet_id: str | None
) -> list[BudgetState]:
    """Each budget given, as it stands: the packet's (for a packet's hop) and the whole run's."""
    found = []
    if packet_id is not None and settings.packet_budget is not None:
        found.append(_state("packet", settings.packet_budget, packet_spend(receipts, packet_id)))
    if settings.budget is not None:
        found.append(_state("orchestration", settings.budget, whole_spend(receipts)))
    return found


def past(settings: Settings, receipts: Sequence[Mapping[str, Any]], packet_id: str | None) -> str | None:
    """Why no new hop may start (the packet's budget first, then the whole run's), else None."""
    for state in states(settings, receipts, packet_id):
        if state.reason is not None:
            return state.reason + (WHOLE if state.scope == "orchestration" else "")
    return None


def past_by(
    settings: Settings, receipts: Sequence[Mapping[str, Any]], packet_id: str | None
) -> Measure | None:
    """Which limit `past` finds passed (tokens, usd or seconds; the same order), else None: what
    a stopped hop's evidence says peerd measured."""
    given: list[tuple[Budget, Spend]] = []
    if packet_id is not None and settings.packet_budget is not None:
        given.append((settings.packet_budget, packet_spend(receipts, packet_id)))
    if settings.budget is not None:
        given.append((settings.budget, whole_spend(receipts)))
    for limit, spend in given:
        if (by := exceeded_by(limit, spend.usage, spend.seconds)) is not None:
            return by
    return None


def hop_budget(
    settings: Settings, receipts: Sequence[Mapping[str, Any]], packet_id: str | None
) -> c.Budget | None:
    """A hop's run budget: what is left of the packet's budget and of the whole run's, the lower."""
    left: list[Budget | None] = []
    if packet_id is not None and settings.packet_budget is not None:
        spend = packet_spend(receipts, packet_id)
        left.append(remaining(settings.packet_budget, spend.usage, spend.seconds))
    if settings.budget is not None:
        spend = whole_spend(receipts)
        left.append(remaining(settings.budget, spend.usage, spend.seconds))
    rule = tightest(*left)
    return None if rule is None else c.Budget(tokens=rule.tokens, usd=rule.usd, seconds=rule.seconds)


# --- with the store -------------------------------------------------------------------------------


async def record_run(
    ctx: OrchestrationContext,
    orch_id: str,
    packet_id: str | None,
    thread_id: str,
    run_ref: str,
    env: str | None,
    role: str,
) -> None:
    """Record what one ended run spent (its `run` receipt)."""
    run: c.Run | None = None
    with contextlib.suppress(PeerdError):
        if env is None:
            run = await threads.get_run(ctx.db, run_ref)
        else:
            latest = (await ctx.ops.thread_show(ctx.caller(orch_id), thread_id, env)).latest_run
            run = latest if latest is not None and latest.id == run_ref else None
    usage = None if run is None or run.usage is None else Usage.from_json(run.usage.wire())
    if usage is not None and usage.wall_ms is not None:
        seconds = usage.wall_ms / 1000
    elif run is not None and run.started_at is not None:
        seconds = max(0.0, (run.ended_at or ctx.clock()) - run.started_at)
    else:
        seconds = 0.0
    body = {
        "runId": run_ref,
        "threadId": thread_id,
        "environment": env,
        "role": role,
        "usage": None if usage is None else usage.to_json(),
        "seconds": round(seconds, 3),
    }
    await ostore.add_receipt(ctx.db, orch_id, packet_id, RUN, body, now=ctx.clock())


async def check(ctx: OrchestrationContext, run: ostore.RunRow, packet_id: str | None) -> str | None:
    """`past` for this run as recorded now."""
    settings = Settings.from_request(run.request)
    if settings.budget is None and settings.packet_budget is None:
        return None
    return past(settings, await ostore.receipts(ctx.db, run.id), packet_id)


async def check_by(ctx: OrchestrationContext, run: ostore.RunRow, packet_id: str | None) -> Measure | None:
    """`past_by` for this run as recorded now."""
    settings = Settings.from_request(run.request)
    if settings.budget is None and settings.packet_budget is None:
        return None
    return past_by(settings, await ostore.receipts(ctx.db, run.id), packet_id)


async def budget_for(
    ctx: OrchestrationContext, run: ostore.RunRow, packet_id: str | None, key: str
) -> c.Budget | None:
    """The run budget of the hop launched or sent with idempotency `key`, computed once and kept
    (a `hop_budget` receipt): a launch repeated after a restart must be the same request."""
    settings = Settings.from_request(run.request)
    if settings.budget is None and settings.packet_budget is None:
        return None
    receipts = await ostore.receipts(ctx.db, run.id)
    for receipt in receipts:
        if receipt["kind"] == HOP_BUDGET and receipt["body"].get("key") == key:
            kept = receipt["body"].get("budget")
            return None if kept is None else c.Budget.model_validate(kept)
    budget = hop_budget(settings, receipts, packet_id)
    body = {"key": key, "budget": None if budget is None else budget.wire()}
    await ostore.add_receipt(ctx.db, run.id, packet_id, HOP_BUDGET, body, now=ctx.clock())
    return budget


async def receipt_fields(
    ctx: OrchestrationContext, run: ostore.RunRow, packet_id: str | None, run_ids: Iterable[Any]
) -> dict[str, Any]:
    """`usage` and `budgets` for a hop's receipt."""
    receipts = await ostore.receipts(ctx.db, run.id)
    settings = Settings.from_request(run.request)
    return {"usage": hop_usage(receipts, run_ids), "budgets": states(settings, receipts, packet_id)}


async def stop_over_budget(
    ctx: OrchestrationContext, run_id: str, packet: ostore.PacketRow, why: str
) -> None:
    """Park a packet past a budget, stopping its live threads first (a run may still go: after a
    restart, or one the budget of another packet made the whole run's pass)."""
    fresh = next(p for p in (await ostore.get(ctx.db, run_id)).packets if p.packet_id == packet.packet_id)
    for thread_id, env in cleanup.live_threads(fresh):
        with contextlib.suppress(PeerdError):
            stop = c.ThreadInterrupt(stop=True, reason=why, environment_id=env)
            await ctx.ops.thread_interrupt(ctx.caller(run_id), thread_id, stop)
    await ctx.park(run_id, packet.packet_id, why, expect=fresh.state)
