"""The verify and review hops: the packet's check in a clean checkout of its commit, with the retry
rules for content and environmental failures; then the reviewer's verdict, gated on a passing
implementation receipt for exactly that commit."""

from __future__ import annotations

from pathlib import Path

from peerd.orchestrate import gitops
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OUTPUT_TAIL, RETRY_LIMIT, OrchestrationContext, ReceiptMissing, Settings
from peerd.orchestrate.implement import record_impl
from peerd.orchestrate.models import PacketSpec, ReviewReceipt, VerificationResult
from peerd.orchestrate.verdicts import parse_review_reply, reviewer_prompt, verification_result
from peerd.runtime import git, gitrun
from peerd.store import projects


async def verifying(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    spec = PacketSpec.model_validate(packet.spec)
    memo = dict(packet.retries)
    assert packet.commit_sha is not None and packet.branch is not None  # noqa: S101
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    worktree = ctx.worktrees_dir / "orchestrate" / run.id / f"verify-{packet.packet_id}"
    await git.remove_worktree(repo, worktree, delete_branch=None)
    await detached_worktree(repo, worktree, packet.commit_sha)
    try:
        check = await gitops.run_check(worktree, spec.verify)
        verification = verification_of(spec.verify, check)
        if verification.classification == "environmental" and int(memo.get("environmental", 0)) < RETRY_LIMIT:
            # The orchestrator's own re-run outside any coder sandbox is authoritative.
            memo["environmental"] = int(memo.get("environmental", 0)) + 1
            check = await gitops.run_check(worktree, spec.verify)
            verification = verification_of(spec.verify, check)
    finally:
        await git.remove_worktree(repo, worktree, delete_branch=None)
    kind = verification.classification
    await record_impl(ctx, run, packet, memo, packet.commit_sha, verification)
    if verification.passed:
        await ctx.set(run.id, packet.packet_id, state="reviewing", hop="review", retries=memo)
        return
    if kind == "content" and int(memo.get("content", 0)) < RETRY_LIMIT:
        memo["content"] = int(memo.get("content", 0)) + 1
        memo["pending_send"] = (
            f"The verification command failed on your work:\n\n$ {spec.verify}\n{check.output[-8000:]}\n\n"
            "Fix it in the same workspace, run the command again, and report."
        )
        memo["pending_after"] = packet.run_id
        await ctx.set(run.id, packet.packet_id, state="implementing", hop="fix", retries=memo)
        return
    await ctx.park(
        run.id,
        packet.packet_id,
        f"Verification failed ({kind}):\n$ {spec.verify}\n{check.output[-OUTPUT_TAIL:]}",
    )


async def reviewing(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    impl = await ctx.gate(run.id, packet.packet_id, "implementation", **{"verification.passed": True})
    if impl.get("commit") != packet.commit_sha:
        raise ReceiptMissing(f"Packet {packet.packet_id}: the passing receipt is for another commit.")
    settings = Settings.from_request(run.request)
    spec = PacketSpec.model_validate(packet.spec)
    memo = dict(packet.retries)
    reviewer = settings.reviewers.get(packet.packet_id) or settings.coders[-1]
    project = await projects.get(ctx.db, run.project_id)
    assert packet.commit_sha is not None  # noqa: S101
    base = str(memo.get("base", run.base_commit))
    diff = await gitops.diff_text(Path(project.path), base, packet.commit_sha)
    verification = VerificationResult.model_validate(impl["verification"])
    round_n = int(memo.get("changes", 0)) + 1
    thread_id = memo.get("review_thread") if memo.get("review_round") == round_n else None
    review_run = memo.get("review_run")
    env = reviewer.environment  # a reviewer on a box gets the packet's commit sent there first
    if not isinstance(thread_id, str):
        previous = memo.get("review_thread")
        if isinstance(previous, str):  # the last round's reviewer is done: its checkout can go
            previous_env = memo.get("review_env")
            await ctx.archive(run.id, previous, previous_env if isinstance(previous_env, str) else None)
        launched = await ctx.launch(
            run, reviewer, reviewer_prompt(spec, diff, verification), key=f"{packet.packet_id}:review:{round_n}",
            runtime_mode="read-only", base=packet.commit_sha,
        )  # fmt: skip
        thread_id, review_run = launched.thread_id, launched.run_id
        memo.update(review_thread=thread_id, review_run=review_run, review_round=round_n, review_env=env)
        await ctx.set(run.id, packet.packet_id, retries=memo)
    assert isinstance(review_run, str)  # noqa: S101
    verdict, errors = None, ["no reply"]
    for ask in (1, 2):
        status = await ctx.wait(run.id, thread_id, review_run, env)
        reply = await ctx.reply(run.id, thread_id, review_run, env)
        verdict, errors = parse_review_reply(reply) if status == "completed" else (None, [f"run {status}"])
        if verdict is not None or ask == 2:
            break
        review_run = await ctx.send(
            run.id, thread_id, env,
            "Your answer was not a valid verdict:\n" + "\n".join(errors) + "\nAnswer with the JSON verdict only.",
            key=f"{packet.packet_id}:review:{round_n}:again",
        )  # fmt: skip
        memo["review_run"] = review_run
        await ctx.set(run.id, packet.packet_id, retries=memo)
    if verdict is None:
        await ctx.park(run.id, packet.packet_id, "The reviewer gave no valid verdict: " + "; ".join(errors))
        return
    receipt = ReviewReceipt(
        packet_id=packet.packet_id,
        attempt=packet.attempt,
        reviewer=reviewer,
        verdict=verdict.verdict,
        evidence=verdict.evidence,
        summary=verdict.summary,
    )
    await ostore.add_receipt(ctx.db, run.id, packet.packet_id, "review", receipt.wire(), now=ctx.clock())
    if verdict.verdict == "approve":
        await ctx.set(run.id, packet.packet_id, state="approved", hop=None, retries=memo)
    elif verdict.verdict == "request_changes" and int(memo.get("changes", 0)) < RETRY_LIMIT:
        memo["changes"] = round_n
        lines = [f"- {e.file}{':' + str(e.line) if e.line else ''}: {e.reason}" for e in verdict.evidence]
        memo["pending_send"] = (
            "The reviewer requested changes:\n" + "\n".join(lines) + "\nMake them, verify, and report."
        )
        memo["pending_after"] = packet.run_id
        await ctx.set(run.id, packet.packet_id, state="implementing", hop="changes", retries=memo)
    else:
        why = "rejected" if verdict.verdict == "reject" else "requested changes again"
        await ctx.park(run.id, packet.packet_id, f"The reviewer {why}: {verdict.summary}")


async def detached_worktree(repo: Path, worktree: Path, commit: str) -> None:
    """A throwaway checkout of `commit` for running a check, on no branch."""
    worktree.parent.mkdir(parents=True, exist_ok=True)
    await gitrun._git(repo, "worktree", "prune")  # the runtime's git runner
    await gitrun._git(repo, "worktree", "add", "--detach", "--", str(worktree), commit)


def verification_of(command: str, check: gitops.CheckResult) -> VerificationResult:
    return verification_result(command, check.exit_code, check.timed_out, check.output, limit=OUTPUT_TAIL)
