"""The verify and review hops: the packet's check in a clean checkout of its commit, with the retry
rules for content and environmental failures; then the reviewer's verdict, gated on a passing
implementation receipt for exactly that commit."""

from __future__ import annotations

import json
from pathlib import Path

from peerd.errors import ReceiptMissing
from peerd.orchestrate import gitops, scope, spend
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OUTPUT_TAIL, RETRY_LIMIT, OrchestrationContext, Settings
from peerd.orchestrate.implement import record_impl
from peerd.orchestrate.models import CoderChoice, PacketSpec, ReviewReceipt, VerificationResult
from peerd.orchestrate.prompts import reviewer_prompt, scripted_review, scripted_reviewer_prompt, tail
from peerd.orchestrate.verdicts import parse_review_reply, verification_result
from peerd.placement.orchestrate import place_coder
from peerd.runtime import git, gitrun
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
    where = f"peerd's own checkout of {packet.commit_sha[:12]}, outside any coder sandbox"
    try:
        check = await gitops.run_check(worktree, spec.verify)
        verification = verification_of(spec.verify, check, evidence=_first_evidence(check, where))
        if not check.passed and not check.timed_out and memo.reruns < RETRY_LIMIT:
            # Environmental only by evidence: peerd runs the same check on the same commit again
            # (once per packet); a failure that does not repeat was the machine's, one that
            # repeats is the code's. Never decided on words in the output.
            memo.reruns += 1
            again = await gitops.run_check(worktree, spec.verify)
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
    kind = verification.classification
    await record_impl(ctx, run, packet, memo, packet.commit_sha, verification)
    if verification.passed:
        memo.review_started = ctx.clock()
        await ctx.set(run.id, packet.packet_id, state="reviewing", hop="review", memo=memo)
        return
    if kind == "content" and memo.content < RETRY_LIMIT:
        memo.content += 1
        memo.pending_send = (
            f"The verification command failed on your work:\n\n$ {spec.verify}\n{check.output[-8000:]}\n\n"
            "Fix it in the same workspace, run the command again, and report."
        )
        memo.pending_after = packet.run_id
        await ctx.set(run.id, packet.packet_id, state="implementing", hop="fix", memo=memo)
        return
    await ctx.park(
        run.id,
        packet.packet_id,
        f"Verification failed ({kind}; {verification.evidence}):\n$ {spec.verify}\n{check.output[-OUTPUT_TAIL:]}",
    )


def _first_evidence(check: gitops.CheckResult, where: str) -> str:
    if check.passed:
        return f"exit 0 in {where}"
    if check.timed_out:
        return f"it ran past its time limit in {where} and was stopped"
    return f"exit {check.exit_code} in {where}"


def _after_rerun(
    command: str, first: gitops.CheckResult, again: gitops.CheckResult, where: str
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
    impl = await ctx.gate(run.id, packet.packet_id, "implementation", **{"verification.passed": True})
    if impl.get("commit") != packet.commit_sha:
        raise ReceiptMissing(f"Packet {packet.packet_id}: the passing receipt is for another commit.")
    settings = Settings.from_request(run.request)
    spec = PacketSpec.model_validate(packet.spec)
    memo = packet.memo.copy_for_update()
    reviewer = settings.reviewers.get(packet.packet_id) or settings.coders[-1]
    reviewer = await place_coder(ctx, run, reviewer, f"{packet.packet_id}:review", runtime_mode="read-only")
    project = await projects.get(ctx.db, run.project_id)
    assert packet.commit_sha is not None  # noqa: S101
    base = memo.base or run.base_commit
    diff = await gitops.diff_text(Path(project.path), base, packet.commit_sha)
    verification = VerificationResult.model_validate(impl["verification"])
    # What the commit changes outside the packet's files, and what of it nothing allows.
    outside = scope.Outside(
        list(impl.get("outOfScope") or []),
        scope.held_paths(impl.get("outOfScope") or [], spec, run_allows=scope.run_allows(run.request)),
    )
    round_n = memo.changes + 1
    thread_id = memo.review_thread if memo.review_round == round_n else None
    review_run = memo.review_run
    env = reviewer.environment  # a reviewer on a box gets the packet's commit sent there first
    scripted = reviewer.backend == "script"
    if thread_id is None:
        if memo.review_thread is not None:  # the last round's reviewer is done: its checkout can go
            await ctx.archive(run.id, memo.review_thread, memo.review_env)
        prompt = (
            scripted_reviewer_prompt(spec, diff, verification, round_n, outside.paths, outside.held)
            if scripted
            else reviewer_prompt(spec, diff, verification, outside.paths, outside.held)
        )
        key = f"{packet.packet_id}:review:{round_n}"
        launched = await ctx.launch(
            run, reviewer, prompt, key=key, runtime_mode="read-only", base=packet.commit_sha,
            role="reviewer", packet_id=packet.packet_id, budget=await spend.budget_for(ctx, run, packet.packet_id, key),
        )  # fmt: skip
        thread_id, review_run = launched.thread_id, launched.run_id
        memo.review_thread, memo.review_run, memo.review_round = thread_id, review_run, round_n
        memo.review_env = env
        memo.review_runs = [review_run]
        if memo.review_started is None:
            memo.review_started = ctx.clock()
        await ctx.set(run.id, packet.packet_id, memo=memo)
    assert isinstance(review_run, str)  # noqa: S101
    by = _who(reviewer)
    verdict, errors = None, ["no reply"]
    for ask in (1, 2):
        status = await ctx.wait(run.id, thread_id, review_run, env)
        await spend.record_run(ctx, run.id, packet.packet_id, thread_id, review_run, env, "reviewer")
        if (why := await spend.check(ctx, run, packet.packet_id)) is not None:
            await spend.stop_over_budget(ctx, run.id, packet, why)
            return
        outcome = await ctx.outcome(run.id, thread_id, review_run, env)
        if status != "completed":
            # The reviewer's run itself failed: say so, with what it reported; asking it again for
            # a verdict would not help.
            reported = (
                "\n".join(f"- {line}" for line in outcome.problems) or f"- {outcome.reply or 'no reply'}"
            )
            await ctx.park(
                run.id, packet.packet_id,
                f"The reviewer's run ({by}) ended {status}, so there is no verdict. It reported:\n{reported}",
            )  # fmt: skip
            return
        verdict, errors = parse_review_reply(outcome.reply)
        if verdict is not None or ask == 2:
            break
        again = (
            "Your answer was not a valid verdict:\n"
            + "\n".join(errors)
            + "\nAnswer with the JSON verdict only."
        )
        if scripted:
            script = json.dumps({"steps": [{"reply": scripted_review(spec, round_n)}]})
            again = f"```peerd-script\n{script}\n```\n\n{again}"
        key = f"{packet.packet_id}:review:{round_n}:again"
        budget = await spend.budget_for(ctx, run, packet.packet_id, key)
        review_run = await ctx.send(run.id, thread_id, env, again, key=key, budget=budget)
        memo.review_run = review_run
        memo.review_runs = [*memo.review_runs, review_run]
        await ctx.set(run.id, packet.packet_id, memo=memo)
    if verdict is None:
        await ctx.park(
            run.id,
            packet.packet_id,
            f"The reviewer ({by}) gave no valid verdict, asked twice: " + "; ".join(errors)
            + f"\nIts last reply:\n{tail(outcome.reply or '(empty)', 4000)}",
        )  # fmt: skip
        return
    held = "out_of_scope" if verdict.verdict == "approve" and outside.held else None
    receipt = ReviewReceipt(
        packet_id=packet.packet_id,
        attempt=packet.attempt,
        reviewer=reviewer,
        verdict=verdict.verdict,
        evidence=verdict.evidence,
        summary=verdict.summary,
        round=round_n,
        out_of_scope=outside.paths,
        held=held,
        started_at=memo.review_started,
        ended_at=ctx.clock(),
        **await spend.receipt_fields(ctx, run, packet.packet_id, memo.review_runs or [review_run]),
    )
    await ostore.add_receipt(ctx.db, run.id, packet.packet_id, "review", receipt.wire(), now=ctx.clock())
    memo.review_started = None
    lines = [f"- {e.file}{':' + str(e.line) if e.line else ''}: {e.reason}" for e in verdict.evidence]
    if held is not None:
        # Approved, but it changes files outside its own that nothing allows: held back whole.
        await ctx.set(run.id, packet.packet_id, memo=memo)
        await ctx.park(
            run.id, packet.packet_id, scope.held_message(packet.packet_id, outside.held, packet.branch)
        )
    elif verdict.verdict == "approve":
        await ctx.set(run.id, packet.packet_id, state="approved", hop=None, memo=memo)
    elif verdict.verdict == "request_changes" and memo.changes < RETRY_LIMIT:
        memo.changes = round_n
        memo.pending_send = (
            "The reviewer requested changes:\n" + "\n".join(lines) + "\nMake them, verify, and report."
        )
        memo.pending_after = packet.run_id
        await ctx.set(run.id, packet.packet_id, state="implementing", hop="changes", memo=memo)
    else:
        why = (
            "rejected it"
            if verdict.verdict == "reject"
            else "requested changes again (the one round is used)"
        )
        await ctx.park(
            run.id, packet.packet_id, f"The reviewer ({by}) {why}: {verdict.summary}\n" + "\n".join(lines)
        )


def _who(choice: CoderChoice) -> str:
    return f"{choice.spec}, {'on ' + choice.environment if choice.environment else 'here'}"


async def detached_worktree(repo: Path, worktree: Path, commit: str) -> None:
    """A throwaway checkout of `commit` for running a check, on no branch."""
    worktree.parent.mkdir(parents=True, exist_ok=True)
    await gitrun._git(repo, "worktree", "prune")  # the runtime's git runner
    await gitrun._git(repo, "worktree", "add", "--detach", "--", str(worktree), commit)


def verification_of(command: str, check: gitops.CheckResult, *, evidence: str = "") -> VerificationResult:
    return verification_result(
        command,
        check.exit_code,
        check.timed_out,
        check.output,
        limit=OUTPUT_TAIL,
        evidence=evidence,
        seconds=round(check.seconds, 3),
    )
