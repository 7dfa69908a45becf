"""`--until checks|review|merged`, the shell: the orchestration waits on the pull request it opened.

It polls with the waits' own reads and rules (`waits/gh.py:poll`, `waits/machine.py:step`: the
backoffs, the rate-limit answers, the deadline; `waits/pace.py:GhPace`: one pace for every poller
of this daemon's gh login), and records the wait in the orchestration's own store: a `pr_wait`
receipt when it opens (with the run's status `waiting`, one transaction), after each poll that saw
something new or failed (with its backoff, which a restart honours: `machine.first_delay`) and when
it ends. The engine drives it like its other hops; `Engine.recover` resumes a `waiting` run here.

When the wait ends, `until.decide` says what happens: the run ends, or ONE fix packet goes to the
implementer (`store.add_fix`: the wait's end, the `pr_fix` receipt, the packet and the run back to
`running`, in one transaction, so a kill -9 at any moment leaves one fix or none), and the engine
runs it like any packet, integrates it, pushes it to the same branch and waits again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from peerd.orchestrate import spend, until
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings
from peerd.orchestrate.models import CoderChoice, PacketSpec, PrFixReceipt, PrWaitReceipt
from peerd.runtime.gh import run_gh
from peerd.store import projects
from peerd.waits import gh as ghio
from peerd.waits.machine import (
    Deliver,
    Event,
    NextPoll,
    Polled,
    PollFailed,
    Snapshot,
    first_delay,
    review_mark,
    step,
)
from peerd.waits.pace import GhPace

log = structlog.get_logger(__name__)

POLL_S = 30.0  # `[waits] poll_seconds` by default
PR_WAIT = "pr_wait"
PR_FIX = "pr_fix"


@dataclass(frozen=True)
class Fixing:
    """A fix packet was added: the engine runs it, delivers it and comes back here."""

    packet_id: str


@dataclass(frozen=True)
class Poller:
    """What the engine polls with: the daemon's one gh pace, its interval, gh, jitter."""

    pace: GhPace
    poll_s: float = POLL_S
    gh: ghio.GhRunner = run_gh
    draw: Callable[[], float] = random.random


async def _waits(ctx: OrchestrationContext, run_id: str) -> list[PrWaitReceipt]:
    return [PrWaitReceipt.model_validate(b) for b in await ostore.receipts_of_kind(ctx.db, run_id, PR_WAIT)]


async def _fixes(ctx: OrchestrationContext, run_id: str) -> list[PrFixReceipt]:
    return [PrFixReceipt.model_validate(b) for b in await ostore.receipts_of_kind(ctx.db, run_id, PR_FIX)]


async def follow(
    ctx: OrchestrationContext, run_id: str, summary: str, poller: Poller
) -> until.Finish | Fixing | None:
    """Wait on the run's pull request (None: the run has no --until). Returns how it ended, or
    the fix packet it added."""
    run = await ostore.get(ctx.db, run_id)
    settings = Settings.from_request(run.request)
    if settings.until not in ("checks", "review", "merged"):
        return None
    delivery = await ostore.latest_receipt(ctx.db, run_id, None, "delivery") or {}
    url = delivery.get("prUrl")
    if not url:
        nothing = "pull request: none was opened (see the delivery), so there is nothing to wait on"
        return until.Finish("failed", f"{summary}; {nothing}" if summary else nothing)
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    pr, slug = until.pr_ref(url, run.branch, project.repository_key)
    waits, fixes = await _waits(ctx, run_id), await _fixes(ctx, run_id)
    round_ = len(fixes) + 1
    wait = waits[-1] if waits and waits[-1].round == round_ else None
    if wait is not None and wait.status == "delivered":  # it ended, the run's end was not written
        again = until.decide(
            wait.outcome or "error", wait.detail or "", attempts=len(fixes),
            over_budget=await spend.check(ctx, run, None),
        )  # fmt: skip
        # A fix is written with its wait's end (`add_fix`): an ended round without one finished.
        lost = until.Finish("failed", "pull request: the wait ended but its fix was never recorded")
        return _finish(again if isinstance(again, until.Finish) else lost, wait)
    if wait is None and (unfixed := until.fix_not_made(fixes[-1] if fixes else None, run.packets)):
        # The last fix was not integrated: nothing new reached the pull request, so waiting on it
        # again would wait on the very state the fix was for.
        return until.Finish("failed", f"{summary}; {unfixed}" if summary else unfixed)
    if wait is None:
        now = ctx.clock()
        answered = fixes[-1] if fixes else None
        wait = PrWaitReceipt(
            round=round_,
            until=settings.until,
            pr=pr,
            url=url,
            head=delivery.get("commit") if delivery.get("pushed") else None,
            # After a fix for a review's changes, the next review is waited for, not that one.
            # (A reviewer who asks for changes again, after the fix, is a new request.)
            baseline=review_mark("CHANGES_REQUESTED", answered.answered_review_at)
            if answered is not None and answered.reason == "changes_requested"
            else None,
            deadline_at=now + until.WAIT_HOURS * 3600.0,
            summary=summary,
            at=now,
        )
        if not await ostore.open_wait(ctx.db, run_id, wait.wire(), now=now):
            return None  # the run is not integrating any more (cancelled meanwhile)
        ctx.changed(run_id)
        log.info("orchestrate.pr_wait", run_id=run_id, round=round_, until=settings.until, pr=pr)
    return await _poll(ctx, run, wait, repo, pr, slug, len(fixes), poller)


async def _poll(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    wait: PrWaitReceipt,
    repo: Path,
    pr: str,
    slug: str | None,
    attempts: int,
    poller: Poller,
) -> until.Finish | Fixing | None:
    watch = until.watch_of(wait)
    delay = first_delay(
        delay_s=wait.delay_s, next_at=wait.next_at, wall_now=ctx.clock(), poll_s=poller.poll_s
    )
    key = f"orchestrate:{run.id}"
    poller.pace.join(key)
    try:
        while True:
            await ctx.clock.sleep(delay)
            await poller.pace.ready()
            seen = await ghio.poll(repo, pr, slug, gh=poller.gh)
            now = ctx.clock()
            event: Event = (
                Polled(seen, now) if isinstance(seen, Snapshot) else PollFailed(seen.kind, seen.detail, now)
            )
            watch, actions = step(
                watch, event, poll_s=poller.pace.interval(poller.poll_s), draw=poller.draw()
            )
            snapshot = seen if isinstance(seen, Snapshot) else None
            error = event.detail if isinstance(event, PollFailed) else None
            for action in actions:
                if isinstance(action, NextPoll):
                    after = until.polled(wait, watch, snapshot, error=error, delay_s=action.delay, now=now)
                    if until.worth_recording(wait, after):
                        await ostore.add_receipt(ctx.db, run.id, None, PR_WAIT, after.wire(), now=now)
                        ctx.changed(run.id)
                    wait = after
                    if isinstance(event, PollFailed):
                        log.info(
                            "orchestrate.pr_backoff",
                            run_id=run.id,
                            kind=event.kind,
                            delay_s=round(action.delay, 1),
                        )
                        if event.kind == "rate_limited":  # the same gh login: every poller pauses
                            poller.pace.rate_limited(action.delay)
                    delay = action.delay
                elif isinstance(action, Deliver):
                    ended = until.polled(
                        wait, watch, snapshot, error=error, delay_s=None, now=now
                    ).model_copy(
                        update={
                            "status": "delivered",
                            "outcome": action.outcome,
                            "detail": action.detail or None,
                        }
                    )
                    return await _ended(ctx, run, ended, snapshot, repo, pr, slug, attempts, poller)
    finally:
        poller.pace.leave(key)


async def _ended(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    wait: PrWaitReceipt,
    snapshot: Snapshot | None,
    repo: Path,
    pr: str,
    slug: str | None,
    attempts: int,
    poller: Poller,
) -> until.Finish | Fixing | None:
    now = ctx.clock()
    run = await ostore.get(ctx.db, run.id)
    decision = until.decide(
        wait.outcome or "error",
        wait.detail or "",
        attempts=attempts,
        over_budget=await spend.check(ctx, run, None),
    )
    if isinstance(decision, until.Finish):
        await ostore.add_receipt(ctx.db, run.id, None, PR_WAIT, wait.wire(), now=now)
        ctx.changed(run.id)
        log.info("orchestrate.pr_wait_ended", run_id=run.id, outcome=wait.outcome, status=decision.status)
        return _finish(decision, wait)
    settings = Settings.from_request(run.request)
    fixed = [p for p in run.packets if p.state == "integrated"]
    first = fixed[0] if fixed else run.packets[0]
    coder = CoderChoice.model_validate(first.coder or settings.coders[0].model_dump(mode="json"))
    coder = coder.model_copy(
        update={"reason": f"the implementer of {first.packet_id}, for the pull request's fix"}
    )
    reviewer = (run.request.get("reviewers") or {}).get(first.packet_id)
    failing = until.failing(wait.checks)
    log_tail, remarks = "", []
    if decision.reason == "checks_failed" and snapshot is not None:
        log_tail = await ghio.failing_log_tail(repo, snapshot, slug, gh=poller.gh)
    elif decision.reason == "changes_requested":
        said = await ghio.feedback(repo, pr, slug, gh=poller.gh)
        remarks = [f"{r.author} ({r.state.lower().replace('_', ' ')}): {r.body}".rstrip(": ") for r in said]
    goal = until.fix_goal(
        decision.reason, url=wait.url, failing_checks=failing, log_tail=log_tail, remarks=remarks
    )
    files = sorted({f for p in fixed for f in PacketSpec.model_validate(p.spec).files})
    verify = settings.verify or PacketSpec.model_validate(first.spec).verify
    spec = until.fix_spec(decision.attempt, goal, files, verify)
    fix = PrFixReceipt(
        attempt=decision.attempt,
        round=wait.round,
        reason=decision.reason,
        packet_id=spec.id,
        base=wait.head or run.base_commit,
        coder=coder,
        failing_checks=failing,
        log_tail=log_tail,
        remarks=remarks,
        answered_review_at=snapshot.pr.newest_review_at if snapshot is not None else "",
        at=now,
    )
    added = await ostore.add_fix(
        ctx.db, run.id, wait=wait.wire(), fix=fix.wire(), spec=spec.model_dump(mode="json"),
        coder=coder.model_dump(mode="json"), reviewer=reviewer, now=now,
    )  # fmt: skip
    if not added:
        return None
    ctx.changed(run.id)
    log.info("orchestrate.pr_fix", run_id=run.id, attempt=decision.attempt, reason=decision.reason)
    return Fixing(spec.id)


def _finish(decision: until.Finish, wait: PrWaitReceipt) -> until.Finish:
    """The run's reason: the integration's summary, then how the pull request ended."""
    return until.Finish(decision.status, f"{wait.summary}; {decision.why}" if wait.summary else decision.why)


async def fix_base(ctx: OrchestrationContext, run_id: str, packet_id: str) -> str | None:
    """The commit a fix packet starts from (the delivered one), None for any other packet."""
    fix = await ostore.latest_receipt(ctx.db, run_id, packet_id, PR_FIX)
    return None if fix is None else str(fix["base"])


async def end_wait(ctx: OrchestrationContext, run_id: str, reason: str) -> None:
    """A cancel ends the run's open wait (recorded `cancelled`); nothing when none is open."""
    waits = await _waits(ctx, run_id)
    if not waits or waits[-1].status != "watching":
        return
    ended = waits[-1].model_copy(
        update={"status": "cancelled", "detail": reason, "at": ctx.clock(), "next_at": None}
    )
    await ostore.add_receipt(ctx.db, run_id, None, PR_WAIT, ended.wire(), now=ctx.clock())
    log.info("orchestrate.pr_wait_cancelled", run_id=run_id)
