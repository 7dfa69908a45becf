"""The last hops of a run: integrate the approved packets into one branch and run the full check
once (the `integration` receipt), then deliver it when asked (`--push`, `--pr`: the `delivery`
receipt). Both are safe to repeat after a restart: a merge already in the branch merges nothing,
the receipt of a finished delivery is found and not done again, a push of the same tip changes
nothing and an open pull request of the branch is reused."""

from __future__ import annotations

from pathlib import Path

from peerd.core.ownership import Owner
from peerd.errors import NotYours
from peerd.orchestrate import checks, deliver, report, spend, views
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings
from peerd.orchestrate.models import IntegrationReceipt
from peerd.orchestrate.review import verification_of
from peerd.orchestrate.states import RunState, end_state
from peerd.runtime import git
from peerd.store import ownership, projects


async def _require_own_branch(ctx: OrchestrationContext, run: ostore.RunRow) -> None:
    """The integration branch is merged into only while the ownership ledger gives it to this run
    (recorded when the run was made: `store.create`); a store older than the ledger records it now
    when git has no such branch yet."""
    ref = f"refs/heads/{run.branch}"
    mine = Owner.orchestration(run.id)
    repo = Path((await projects.get(ctx.db, run.project_id)).path)
    right, whose = await ownership.right_to(
        ctx.db, run.project_id, ref, caller=mine, exists=await git.branch_exists(repo, run.branch)
    )
    if right == "new":
        await ownership.claim_one(
            ctx.db,
            project_id=run.project_id,
            holding="ref",
            name=ref,
            owner=mine,
            purpose="integration",
            now=ctx.clock(),
        )
    elif right == "not_yours" and whose == Owner.person():
        raise NotYours(
            f"Branch {run.branch} exists but peerd has no record of making it for orchestration "
            f"{run.id}: it is yours, and nothing is merged into it. Rename it and resume the run."
        )
    elif right == "not_yours" and whose is not None:
        raise NotYours(f"Branch {run.branch} belongs to {whose.describe()}: nothing is merged into it.")


async def integrate(ctx: OrchestrationContext, run_id: str) -> str:
    """Merge the approved packets in plan order; returns the run's summary line."""
    run = await ostore.get(ctx.db, run_id)
    settings = Settings.from_request(run.request)
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    started = ctx.clock()
    worktree = ctx.worktrees_dir / "orchestrate" / run.id / "integration"
    await _require_own_branch(ctx, run)
    await git.create_worktree(repo, worktree, run.branch, run.base_commit)
    merged: list[str] = []
    conflicts: dict[str, list[str]] = {}
    try:
        for packet in run.packets:
            if packet.state == "integrated" and packet.branch:
                merged.append(packet.packet_id)
                continue
            if packet.state != "approved" or not packet.branch:
                continue
            # An approval peerd held back (changes outside the packet's files) never merges.
            await ctx.gate(run.id, packet.packet_id, "review", verdict="approve", held=None)
            result = await git.merge_into(repo, worktree, packet.branch, f"Integrate {packet.packet_id}")
            if result.merged:
                merged.append(packet.packet_id)
                await ctx.set(run.id, packet.packet_id, expect="approved", state="integrated")
            else:
                conflicts[packet.packet_id] = result.conflicts
                await ctx.park(
                    run.id,
                    packet.packet_id,
                    "Merge conflict in " + ", ".join(result.conflicts) + ":\n" + result.output,
                    expect="approved",
                )
        verification = None
        if settings.verify and merged:
            await checks.seed_caches(repo, worktree)  # the checkout's tool caches, warm (checks.py)
            check = await checks.run_check(worktree, settings.verify)
            verification = verification_of(
                settings.verify, check, evidence="the full check, run once by peerd on the integrated result"
            )
        # The recorded git dir: the check ran the packets' code in this worktree.
        tip = await git.head(await git.locate_worktree(repo, worktree))
    finally:
        await git.remove_worktree(repo, worktree, delete_branch=None)
    receipt = IntegrationReceipt(
        branch=run.branch, base_commit=run.base_commit, merged=merged, conflicts=conflicts,
        verification=verification, commit=tip if merged else None, started_at=started, ended_at=ctx.clock(),
        usage=None, budgets=(await spend.receipt_fields(ctx, run, None, []))["budgets"],
    )  # fmt: skip
    await ostore.add_receipt(ctx.db, run.id, None, "integration", receipt.wire(), now=ctx.clock())
    ctx.changed(run.id)
    parked = [
        p.packet_id for p in (await ostore.get(ctx.db, run_id)).packets if p.state in ("parked", "cancelled")
    ]
    if verification is None:
        check_text = "nothing merged, no full check" if settings.verify else "no full check"
    else:
        check_text = "check passed" if verification.passed else "check FAILED"
    summary = f"{len(merged)} packet(s) integrated on {run.branch} ({check_text})"
    return summary + (f"; parked: {', '.join(parked)}" if parked else "")


async def ending(ctx: OrchestrationContext, run_id: str) -> RunState:
    """The state a run that reached its integration ends in, from its integration receipt
    (`states.end_state`): `completed`, `not_integrated` or `check_failed`."""
    integration = await ostore.latest_receipt(ctx.db, run_id, None, "integration") or {}
    verification = integration.get("verification")
    passed = None if not isinstance(verification, dict) else bool(verification.get("passed"))
    return end_state(len(integration.get("merged") or []), passed)


async def deliver_run(ctx: OrchestrationContext, run_id: str, summary: str) -> None:
    """`--push REMOTE` / `--pr`, once: the `delivery` receipt is written when it is done."""
    run = await ostore.get(ctx.db, run_id)
    settings = Settings.from_request(run.request)
    if settings.push is None and not settings.pr:
        return
    integration = await ostore.latest_receipt(ctx.db, run_id, None, "integration") or {}
    delivered = await ostore.latest_receipt(ctx.db, run_id, None, "delivery")
    # Once per integrated tip: with --until, a fix integrated since goes to the same branch again.
    if delivered is not None and (not settings.until or delivered.get("commit") == integration.get("commit")):
        return
    project = await projects.get(ctx.db, run.project_id)
    # The body is the report as it will read once the run completes (the next step).
    info = {**await views.describe(ctx.db, run_id), "status": await ending(ctx, run_id), "reason": summary}
    receipt = await deliver.deliver(
        Path(project.path),
        branch=run.branch,
        remote=settings.push,
        pr=settings.pr,
        ready=settings.ready,
        base=settings.user_branch,
        title=deliver.pr_title(run.task, run.branch, list(integration.get("merged") or [])),
        body=report.pr_body(info),
        merged=bool(integration.get("merged")),
    )
    receipt = receipt.model_copy(update={"commit": integration.get("commit")})
    await ostore.add_receipt(ctx.db, run_id, None, "delivery", receipt.wire(), now=ctx.clock())
    ctx.changed(run_id)
