"""The verify and review hops: the packet's check in a clean checkout of its commit, with the retry
rules for content and environmental failures; then the reviewer's verdict, gated on a passing
implementation receipt for exactly that commit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from peerd.errors import ReceiptMissing
from peerd.orchestrate import checks, scope, spend, steps
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OUTPUT_TAIL, RETRY_LIMIT, OrchestrationContext, Settings
from peerd.orchestrate.implement import perform, view
from peerd.orchestrate.models import CoderChoice, PacketSpec, ReviewReceipt, VerificationResult
from peerd.orchestrate.placing import place_coder
from peerd.orchestrate.prompts import reviewer_prompt, scripted_reviewer_prompt
from peerd.orchestrate.verdicts import verification_result
from peerd.runtime import git
from peerd.store import projects


async def verifying(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    spec = PacketSpec.model_validate(packet.spec)
    memo = packet.memo.copy_for_update()
    assert packet.commit_sha is not None and packet.branch is not None  # noqa: S101
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    worktree = ctx.worktrees_dir / "orchestrate" / run.id / f"verify-{packet.packet_id}"
    await git.remove_worktree(repo, worktree, delete_branch=None)
    await detached_worktree(repo, worktree, packet.commit_sha)
    await checks.seed_caches(repo, worktree)  # the checkout's tool caches, warm (checks.py)
    where = f"peerd's own checkout of {packet.commit_sha[:12]}, outside any coder sandbox"
    try:
        check = await checks.run_check(worktree, spec.verify)
        verification = verification_of(spec.verify, check, evidence=_first_evidence(check, where))
        if not check.passed and not check.timed_out and memo.reruns < RETRY_LIMIT:
            # Environmental only by evidence: peerd runs the same check on the same commit again
            # (once per packet); a failure that does not repeat was the machine's, one that
            # repeats is the code's. Never decided on words in the output.
            memo.reruns += 1
            again = await checks.run_check(worktree, spec.verify)
            verification = _after_rerun(spec.verify, check, again, where)
            if again.passed:
                memo.environmental += 1
            check = again
        elif not check.passed and not check.timed_out:
            verification = verification.model_copy(
                update={
                    "evidence": f"{verification.evidence} (peerd's one re-run for this packet was used earlier)"
                }
            )
    finally:
        await git.remove_worktree(repo, worktree, delete_branch=None)
    event = steps.Checked(verification, memo, check.output)
    decided = steps.decide_verify(
        view(run, packet, Settings.from_request(run.request)), event, now=ctx.clock()
    )
    await perform(ctx, run, packet, decided)


def _first_evidence(check: checks.CheckResult, where: str) -> str:
    if check.passed:
        return f"exit 0 in {where}"
    if check.timed_out:
        return f"it ran past its time limit in {where} and was stopped"
    return f"exit {check.exit_code} in {where}"


def _after_rerun(
    command: str, first: checks.CheckResult, again: checks.CheckResult, where: str
) -> VerificationResult:
    """The verification after peerd's re-run: the re-run decides, and the first run is kept."""
    if again.passed:
        evidence = (
            f"the first run failed (exit {first.exit_code}) and peerd's re-run of the same commit in "
            f"{where} passed: the failure was the environment's, not the code's"
        )
        first_class = "environmental"
    elif again.timed_out:
        evidence = f"exit {first.exit_code}, then the re-run ran past its time limit, in {where}"
        first_class = "content"
    else:
        evidence = (
            f"exit {first.exit_code}, and exit {again.exit_code} again when peerd re-ran it, in {where}: "
            "the failure repeats, so it is the code's"
        )
        first_class = "content"
    earlier = verification_of(command, first).model_copy(
        update={"classification": first_class, "evidence": f"exit {first.exit_code} in {where}"}
    )
    return verification_of(command, again, evidence=evidence).model_copy(update={"first_run": earlier})


async def reviewing(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    """The reviewer's verdict on the packet's commit, gated on a passing implementation receipt for
    exactly that commit; each step as `steps.decide_review` says."""
    impl = await ctx.gate(run.id, packet.packet_id, "implementation", **{"verification.passed": True})
    if impl.get("commit") != packet.commit_sha:
        raise ReceiptMissing(f"Packet {packet.packet_id}: the passing receipt is for another commit.")
    settings = Settings.from_request(run.request)
    spec = PacketSpec.model_validate(packet.spec)
    reviewer = settings.reviewers.get(packet.packet_id) or settings.coders[-1]
    reviewer = await place_coder(ctx, run, reviewer, f"{packet.packet_id}:review", runtime_mode="read-only")
    project = await projects.get(ctx.db, run.project_id)
    assert packet.commit_sha is not None  # noqa: S101
    base = packet.memo.base or run.base_commit
    diff = await git.diff_text(Path(project.path), base, packet.commit_sha)
    verification = VerificationResult.model_validate(impl["verification"])
    # What the commit changes outside the packet's files, and what of it nothing allows.
    outside = scope.Outside(
        list(impl.get("outOfScope") or []),
        scope.held_paths(impl.get("outOfScope") or [], spec, run_allows=scope.run_allows(run.request)),
    )
    env = reviewer.environment  # a reviewer on a box gets the packet's commit sent there first

    def seen() -> steps.Reviewed:
        return steps.Reviewed(
            packet_id=packet.packet_id,
            run_id=packet.run_id,
            branch=packet.branch,
            memo=packet.memo,
            spec=spec,
            reviewer=reviewer,
            held=outside.held,
        )

    thread_id: str | None = None
    review_run: str | None = None
    for effect in steps.decide_review(seen(), steps.ReviewBegin()):
        if isinstance(effect, steps.WaitReviewer):  # resumed: this round's reviewer
            thread_id, review_run = effect.thread_id, effect.run_id
        elif isinstance(effect, steps.ArchiveReviewer):
            await ctx.archive(run.id, effect.thread_id, effect.environment)
        elif isinstance(effect, steps.LaunchReviewer):
            prompt = (
                scripted_reviewer_prompt(spec, diff, verification, effect.round, outside.paths, outside.held)
                if reviewer.backend == "script"
                else reviewer_prompt(spec, diff, verification, outside.paths, outside.held)
            )
            launched = await ctx.launch(
                run, reviewer, prompt, key=effect.key, runtime_mode="read-only", base=packet.commit_sha,
                role="reviewer", packet_id=packet.packet_id,
                budget=await spend.budget_for(ctx, run, packet.packet_id, effect.key),
            )  # fmt: skip
            thread_id, review_run = launched.thread_id, launched.run_id
            event = steps.ReviewerLaunched(launched.thread_id, launched.run_id, ctx.clock())
            await perform(ctx, run, packet, steps.decide_review(seen(), event))
    assert thread_id is not None and isinstance(review_run, str)  # noqa: S101
    for ask in (1, 2):
        status = await ctx.wait(run.id, thread_id, review_run, env)
        await spend.record_run(ctx, run.id, packet.packet_id, thread_id, review_run, env, "reviewer")
        ended = steps.ReviewerEnded(ask, status, await spend.check(ctx, run, packet.packet_id))
        effects = steps.decide_review(seen(), ended)
        if isinstance(effects[0], steps.NeedOutcome):
            ended = replace(ended, outcome=await ctx.outcome(run.id, thread_id, review_run, env))
            effects = steps.decide_review(seen(), ended)
        again = effects[0]
        if not isinstance(again, steps.AskReviewerAgain):
            await _perform_review(ctx, run, packet, effects, outside.paths, reviewer)
            return
        budget = await spend.budget_for(ctx, run, packet.packet_id, again.key)
        review_run = await ctx.send(run.id, thread_id, env, again.text, key=again.key, budget=budget)
        await perform(ctx, run, packet, steps.decide_review(seen(), steps.ReviewerAsked(review_run)))


async def _perform_review(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    effects: list[steps.Effect],
    out_of_scope: list[str],
    reviewer: CoderChoice,
) -> None:
    """The review's end, in order: its receipt, then what the verdict does to the packet."""
    for effect in effects:
        if not isinstance(effect, steps.WriteReview):
            await perform(ctx, run, packet, [effect])
            continue
        verdict = effect.verdict
        receipt = ReviewReceipt(
            packet_id=packet.packet_id,
            attempt=packet.attempt,
            reviewer=reviewer,
            verdict=verdict.verdict,
            evidence=verdict.evidence,
            summary=verdict.summary,
            round=effect.round,
            out_of_scope=out_of_scope,
            held=effect.held,
            started_at=effect.started_at,
            ended_at=ctx.clock(),
            **await spend.receipt_fields(ctx, run, packet.packet_id, list(effect.runs)),
        )
        await ostore.add_receipt(ctx.db, run.id, packet.packet_id, "review", receipt.wire(), now=ctx.clock())


async def detached_worktree(repo: Path, worktree: Path, commit: str) -> None:
    """A throwaway checkout of `commit` for running a check, on no branch."""
    worktree.parent.mkdir(parents=True, exist_ok=True)
    await git.add_detached(repo, worktree, commit)


def verification_of(command: str, check: checks.CheckResult, *, evidence: str = "") -> VerificationResult:
    return verification_result(
        command,
        check.exit_code,
        check.timed_out,
        check.output,
        limit=OUTPUT_TAIL,
        evidence=evidence,
        seconds=round(check.seconds, 3),
    )
