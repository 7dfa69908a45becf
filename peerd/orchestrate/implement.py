"""The implement hop: a packet's coder thread, its commits (here, after containment, or fetched
from a box), and re-dispatch to another coder when the result is empty or the run failed."""

from __future__ import annotations

import contextlib
from pathlib import Path

from peerd import contracts as c
from peerd.errors import Conflict, PeerdError
from peerd.orchestrate import escapes, gitops, scope, spend
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import (
    OUTPUT_TAIL,
    RETRY_LIMIT,
    TIMED_OUT,
    OrchestrationContext,
    RunOutcome,
    Settings,
)
from peerd.orchestrate.escapes import Collected
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import (
    Classification,
    CoderChoice,
    ImplementationReceipt,
    PacketSpec,
    VerificationResult,
)
from peerd.orchestrate.prompts import implementer_prompt, tail
from peerd.placement.orchestrate import place_coder
from peerd.runtime import git
from peerd.store import projects

_COMMON_EVIDENCE: dict[str, str] = {
    "empty_diff": "the coder's run completed and its worktree holds no change from the base commit",
    "coder_error": "the coder's run did not complete (its status, and what it reported, are below)",
    "timeout": "peerd stopped the coder's turn at --packet-timeout",
}


def _deadline(ctx: OrchestrationContext, settings: Settings) -> float | None:
    return None if settings.packet_timeout_s is None else ctx.clock() + settings.packet_timeout_s


def coder_of(packet: ostore.PacketRow) -> CoderChoice:
    return CoderChoice.model_validate(packet.coder)


async def start_packet(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    await ctx.gate(run.id, None, "plan")
    settings = Settings.from_request(run.request)
    coder = (
        settings.assignment.get(packet.packet_id) or settings.coders[packet.position % len(settings.coders)]
    )
    coder = await place_coder(ctx, run, coder, f"{packet.packet_id}:implement", runtime_mode=settings.access)
    base = await base_for(ctx, run, packet)
    await ctx.set(
        run.id,
        packet.packet_id,
        state="implementing",
        hop="implement",
        attempt=1,
        coder=coder.model_dump(mode="json"),
        environment=coder.environment,
        branch=f"orchestrate/{run.id}/{packet.packet_id}",
        memo=PacketMemo(base=base),
    )


async def base_for(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> str:
    """The exact commit a packet starts from: the run's base, or its dependencies' work."""
    deps = PacketSpec.model_validate(packet.spec).depends_on
    tips = [p.commit_sha for p in run.packets if p.packet_id in deps and p.commit_sha]
    if not tips:
        return run.base_commit
    if len(tips) == 1:
        return tips[0]
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    branch = f"orchestrate/{run.id}/base-{packet.packet_id}"
    worktree = ctx.worktrees_dir / "orchestrate" / run.id / f"base-{packet.packet_id}"
    await git.create_worktree(repo, worktree, branch, tips[0])
    try:
        for dep in run.packets:
            if dep.packet_id in deps and dep.commit_sha and dep.commit_sha != tips[0] and dep.branch:
                merged = await gitops.merge_into(
                    repo, worktree, dep.branch, f"Merge {dep.packet_id} as a base"
                )
                if not merged.merged:
                    raise Conflict(
                        f"The dependencies of {packet.packet_id} conflict: {', '.join(merged.conflicts)}"
                    )
        return await gitops.head(await git.locate_worktree(repo, worktree))
    finally:
        await git.remove_worktree(repo, worktree, delete_branch=None)


async def implementing(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    settings = Settings.from_request(run.request)
    spec = PacketSpec.model_validate(packet.spec)
    coder = coder_of(packet)
    memo = packet.memo.copy_for_update()
    base = memo.base or run.base_commit
    if packet.thread_id is None:
        prompt = implementer_prompt(
            spec,
            workspace_root=f"the git worktree you start in (branch {packet.branch})",
            base_commit=base,
            branch=str(packet.branch),
            workarounds=settings.workarounds,
            previous_failure=memo.previous_failure,
            review_changes=None,
        )
        memo.prompt = prompt
        key = f"{packet.packet_id}:impl:{packet.attempt}"
        launched = await ctx.launch(
            run,
            coder,
            prompt,
            key=key,
            runtime_mode=settings.access,
            base=base,
            role="implementer",
            packet_id=packet.packet_id,
            branch=packet.branch,
            budget=await spend.budget_for(ctx, run, packet.packet_id, key),
        )
        memo.deadline = _deadline(ctx, settings)
        memo.hop_started = ctx.clock()
        memo.hop_runs = [launched.run_id]
        await ctx.set(
            run.id, packet.packet_id, thread_id=launched.thread_id, run_id=launched.run_id, memo=memo
        )
        packet.thread_id, packet.run_id = launched.thread_id, launched.run_id
    pending = memo.pending_send
    if pending is not None and packet.run_id == memo.pending_after:
        n = memo.sends + 1
        key = f"{packet.packet_id}:send:{n}"
        budget = await spend.budget_for(ctx, run, packet.packet_id, key)
        run_id = await ctx.send(run.id, packet.thread_id, coder.environment, pending, key=key, budget=budget)
        memo.sends = n
        memo.pending_send = memo.pending_after = None
        memo.deadline = _deadline(ctx, settings)
        memo.hop_started = ctx.clock()
        memo.hop_runs = [run_id]
        await ctx.set(run.id, packet.packet_id, run_id=run_id, memo=memo)
        packet.run_id = run_id
    assert packet.thread_id is not None and packet.run_id is not None  # noqa: S101  # set just above
    status = await ctx.wait(
        run.id, packet.thread_id, packet.run_id, coder.environment, deadline=memo.deadline
    )
    await spend.record_run(
        ctx, run.id, packet.packet_id, packet.thread_id, packet.run_id, coder.environment, "implementer"
    )
    if (why := await spend.check(ctx, run, packet.packet_id)) is not None:
        await _over_budget(ctx, run, packet, memo, why)
        return
    if status == TIMED_OUT:
        with contextlib.suppress(PeerdError):
            stop = c.ThreadInterrupt(
                stop=True, reason="Past the packet's time limit.", environment_id=coder.environment
            )
            await ctx.ops.thread_interrupt(ctx.caller(run.id), packet.thread_id, stop)
        limit = settings.packet_timeout_s or 0
        await redispatch_or_park(
            ctx, run, packet, memo, "timeout", f"The coder ran past its {limit:g} s limit."
        )
        return
    if status == "interrupted" and await ctx.stopped_by_shutdown(run.id, packet.thread_id, coder.environment):
        # A daemon restart (here or on the box) cut the coder off: it goes on in the same
        # session, without counting as a retry.
        n = memo.resumes + 1
        text = (
            "peerd restarted while you were working; what you did so far is in your workspace. Continue "
            "the task below from where you were, then report.\n\n" + (memo.prompt or "")
        )
        key = f"{packet.packet_id}:resume:{n}"
        budget = await spend.budget_for(ctx, run, packet.packet_id, key)
        run_ref = await ctx.send(run.id, packet.thread_id, coder.environment, text, key=key, budget=budget)
        memo.resumes = n
        memo.hop_runs = [*memo.hop_runs, run_ref]
        memo.deadline = _deadline(ctx, settings)
        await ctx.set(run.id, packet.packet_id, run_id=run_ref, memo=memo)
        return
    outcome = await ctx.outcome(run.id, packet.thread_id, packet.run_id, coder.environment)
    memo.report = outcome.reply
    memo.coder_errors = outcome.problems
    denial = _denial_evidence(outcome)
    if status != "completed":
        detail = f"The coder's run ended {status}." + _quoted(outcome)
        await redispatch_or_park(
            ctx, run, packet, memo, denial[0] if denial else "coder_error", detail, denial
        )
        return
    found = await collect(ctx, run, packet, coder, memo.hop_runs or [packet.run_id])
    found.record(memo)
    if found.tip is None or found.tip == base:
        detail = "The coder changed nothing." + _quoted(outcome)
        await redispatch_or_park(
            ctx, run, packet, memo, denial[0] if denial else "empty_diff", detail, denial
        )
        return
    await ctx.set(run.id, packet.packet_id, state="verifying", commit_sha=found.tip, memo=memo)


async def _over_budget(
    ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow, memo: PacketMemo, why: str
) -> None:
    """The hop's runs passed a budget: its receipt says so (with what they spent), the packet parks."""
    stopped = VerificationResult(
        command=PacketSpec.model_validate(packet.spec).verify,
        exit_code=None,
        passed=False,
        timed_out=False,
        output_tail=why,
        classification="budget",
        evidence="the usage its runs reported, summed by peerd, passed the budget",
    )
    await record_impl(ctx, run, packet, memo, None, stopped)
    await spend.stop_over_budget(ctx, run.id, packet, why)


def _denial_evidence(outcome: RunOutcome) -> tuple[Classification, str] | None:
    """Environmental by evidence: the coder's own structured events say its sandbox (or policy)
    declined a step; never decided on the words of its reply or output."""
    if not outcome.denials:
        return None
    listed = "; ".join(outcome.denials[:5])
    return "environmental", f"the coder's own events report that its sandbox declined: {listed}"


def _quoted(outcome: RunOutcome) -> str:
    """The coder's reported problems and its last reply, quoted for the report."""
    parts = []
    if outcome.problems:
        parts.append("Its run reported:\n" + "\n".join(f"- {line}" for line in outcome.problems))
    if outcome.reply.strip():
        parts.append("Its last reply:\n" + tail(outcome.reply.strip(), 2000))
    return ("\n" + "\n".join(parts)) if parts else ""


async def collect(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    coder: CoderChoice,
    hop_runs: list[str],
) -> Collected:
    """Commit the coder's work on the packet branch, here (after containment) or on the box (only
    the worktree: containment there is the box's confinement, never a recovery from the box
    owner's checkout, which a link may not ask for)."""
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    spec = PacketSpec.model_validate(packet.spec)
    message = f"{spec.id}: {spec.goal}"[:200]
    assert packet.thread_id is not None and packet.branch is not None  # noqa: S101
    if coder.environment is not None:
        tip = await ctx.transport.fetch_result(
            coder.environment, packet.thread_id, repo, packet.branch, message
        )
        return Collected(tip)
    thread = await ctx.ops.thread_show(ctx.caller(run.id), packet.thread_id)
    # The worktree's recorded git dir, never the `.git` file its coder could rewrite.
    worktree = await git.locate_worktree(repo, Path(thread.worktree_path))
    # Containment first: a change in the user's checkout comes back only when peerd can prove
    # this hop's coder wrote it there (`attribution`); everything else is the user's, left.
    changes = await escapes.settle(
        ctx, run.id, repo=repo, worktree=worktree, files=spec.files,
        baseline=Settings.from_request(run.request).user_work or {},
        thread_id=packet.thread_id, hop_runs=hop_runs,
    )  # fmt: skip
    await gitops.commit_all(worktree, message)
    return Collected(await gitops.head(worktree), changes)


async def redispatch_or_park(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    memo: PacketMemo,
    why: Classification,
    detail: str,
    denial: tuple[Classification, str] | None = None,
) -> None:
    """Empty diff, coder error, timeout, or a sandbox denial: another coder once, never more."""
    settings = Settings.from_request(run.request)
    failed = VerificationResult(
        command=PacketSpec.model_validate(packet.spec).verify,
        exit_code=None,
        passed=False,
        timed_out=why == "timeout",
        output_tail=detail[-OUTPUT_TAIL:],
        classification=why,
        evidence=denial[1] if denial else _COMMON_EVIDENCE.get(why, ""),
    )
    await record_impl(ctx, run, packet, memo, None, failed)
    if memo.redispatch >= RETRY_LIMIT:
        await ctx.park(run.id, packet.packet_id, f"{detail} (already re-dispatched once)")
        return
    current = coder_of(packet)
    others = [
        x
        for x in settings.coders
        if (x.backend, x.model, x.environment) != (current.backend, current.model, current.environment)
    ]
    if not others:
        await ctx.park(run.id, packet.packet_id, f"{detail} (no other coder to re-dispatch to)")
        return
    nxt = others[0].model_copy(update={"reason": f"re-dispatched after {why} from {current.spec}"})
    nxt = await place_coder(ctx, run, nxt, f"{packet.packet_id}:redispatch", runtime_mode=settings.access)
    memo.redispatch += 1
    memo.previous_failure = detail
    if packet.thread_id is not None and current.environment is None:
        # The first coder's worktree goes (its branch stays, for a look); the next coder
        # starts clean from the same base on a branch of its own.
        with contextlib.suppress(PeerdError):
            await ctx.ops.thread_archive(ctx.caller(run.id), packet.thread_id, c.ThreadArchive(force=True))
    await ctx.set(
        run.id,
        packet.packet_id,
        state="implementing",
        attempt=packet.attempt + 1,
        coder=nxt.model_dump(mode="json"),
        environment=nxt.environment,
        thread_id=None,
        run_id=None,
        branch=f"orchestrate/{run.id}/{packet.packet_id}-{packet.attempt + 1}",
        memo=memo,
    )


async def record_impl(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    memo: PacketMemo,
    commit: str | None,
    verification: VerificationResult,
) -> None:
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    base = memo.base or run.base_commit
    files: list[str] = []
    stat = ""
    if commit is not None and commit != base:
        files = await gitops.changed_files(repo, base, commit)
        stat = await gitops.diff_stat(repo, base, commit)
    coder = coder_of(packet)
    spec = PacketSpec.model_validate(packet.spec)
    receipt = ImplementationReceipt(
        packet_id=packet.packet_id,
        attempt=packet.attempt,
        hop=packet.hop,
        coder=coder,
        environment=coder.environment,
        branch=str(packet.branch),
        base_commit=base,
        commit=commit,
        files_changed=files,
        diff_stat=stat,
        verification=verification,
        report=memo.report or "",
        recovered_paths=list(memo.recovered),
        not_recovered=list(memo.not_recovered),
        recovery_problem=memo.recovery_problem,
        stray_paths=list(memo.stray),
        user_paths=list(memo.user_paths),
        left_paths=list(memo.left),
        checkout_changes=list(memo.checkout),
        out_of_scope=scope.outside(files, spec.files),
        coder_errors=list(memo.coder_errors),
        started_at=memo.hop_started,
        ended_at=ctx.clock(),
        **await spend.receipt_fields(ctx, run, packet.packet_id, memo.hop_runs),
    )
    memo.hop_runs = []  # the next receipt of this packet is for the runs after this one
    await ostore.add_receipt(
        ctx.db, run.id, packet.packet_id, "implementation", receipt.wire(), now=ctx.clock()
    )
