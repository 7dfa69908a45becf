"""The implement hop: a packet's coder thread, its commits (here, after containment, or fetched
from a box), and re-dispatch to another coder when the result is empty or the run failed."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from peerd import contracts as c
from peerd.errors import Conflict, PeerdError
from peerd.orchestrate import gitops
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OUTPUT_TAIL, RETRY_LIMIT, TIMED_OUT, OrchestrationContext, Settings
from peerd.orchestrate.models import CoderChoice, ImplementationReceipt, PacketSpec, VerificationResult
from peerd.orchestrate.verdicts import implementer_prompt
from peerd.runtime import git
from peerd.store import projects


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
        retries={"base": base, "sends": 0},
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
    memo = dict(packet.retries)
    if packet.thread_id is None:
        prompt = implementer_prompt(
            spec,
            workspace_root=f"the git worktree you start in (branch {packet.branch})",
            base_commit=str(memo["base"]),
            branch=str(packet.branch),
            workarounds=settings.workarounds,
            previous_failure=memo.get("previous_failure"),
            review_changes=None,
        )
        memo["prompt"] = prompt
        launched = await ctx.launch(
            run,
            coder,
            prompt,
            key=f"{packet.packet_id}:impl:{packet.attempt}",
            runtime_mode="auto",
            base=str(memo["base"]),
            branch=packet.branch,
        )
        memo["deadline"] = _deadline(ctx, settings)
        await ctx.set(
            run.id, packet.packet_id, thread_id=launched.thread_id, run_id=launched.run_id, retries=memo
        )
        packet.thread_id, packet.run_id = launched.thread_id, launched.run_id
    pending = memo.get("pending_send")
    if isinstance(pending, str) and packet.run_id == memo.get("pending_after"):
        n = int(memo.get("sends", 0)) + 1
        run_id = await ctx.send(
            run.id, packet.thread_id, coder.environment, pending, key=f"{packet.packet_id}:send:{n}"
        )
        memo.update(sends=n, pending_send=None, pending_after=None, deadline=_deadline(ctx, settings))
        await ctx.set(run.id, packet.packet_id, run_id=run_id, retries=memo)
        packet.run_id = run_id
    assert packet.thread_id is not None and packet.run_id is not None  # noqa: S101  # set just above
    status = await ctx.wait(
        run.id, packet.thread_id, packet.run_id, coder.environment, deadline=memo.get("deadline")
    )
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
        n = int(memo.get("resumes", 0)) + 1
        text = (
            "peerd restarted while you were working; what you did so far is in your workspace. Continue "
            "the task below from where you were, then report.\n\n" + str(memo.get("prompt") or "")
        )
        run_ref = await ctx.send(
            run.id, packet.thread_id, coder.environment, text, key=f"{packet.packet_id}:resume:{n}"
        )
        memo["resumes"] = n
        memo["deadline"] = _deadline(ctx, settings)
        await ctx.set(run.id, packet.packet_id, run_id=run_ref, retries=memo)
        return
    report = await ctx.reply(run.id, packet.thread_id, packet.run_id, coder.environment)
    memo["report"] = report
    if status != "completed":
        await redispatch_or_park(
            ctx, run, packet, memo, "coder_error", f"The coder's run ended {status}: {report}"
        )
        return
    tip, recovered = await collect(ctx, run, packet, coder)
    memo["recovered"] = recovered
    if tip is None or tip == memo["base"]:
        await redispatch_or_park(ctx, run, packet, memo, "empty_diff", "The coder changed nothing.")
        return
    await ctx.set(run.id, packet.packet_id, state="verifying", commit_sha=tip, retries=memo)


async def collect(
    ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow, coder: CoderChoice
) -> tuple[str | None, list[str]]:
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
        return tip, []
    thread = await ctx.ops.thread_show(ctx.caller(run.id), packet.thread_id)
    # The worktree's recorded git dir, never the `.git` file its coder could rewrite.
    worktree = await git.locate_worktree(repo, Path(thread.worktree_path))
    # Containment first: edits that escaped into the orchestrator's own checkout come back,
    # scoped to the packet's files only (anything else there may be the user's own work).
    recovered: list[str] = []
    dirty = await gitops.dirty_paths(repo)
    if dirty:
        recovered = await gitops.recover_escaped(repo, worktree, spec.files)
    await gitops.commit_all(worktree, message)
    return await gitops.head(worktree), recovered


async def redispatch_or_park(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    memo: dict[str, Any],
    why: str,
    detail: str,
) -> None:
    """Empty diff, coder error or timeout: another coder once, never more."""
    settings = Settings.from_request(run.request)
    failed = VerificationResult(
        command=PacketSpec.model_validate(packet.spec).verify,
        exit_code=None,
        passed=False,
        timed_out=why == "timeout",
        output_tail=detail[-OUTPUT_TAIL:],
        classification=why,
    )
    await record_impl(ctx, run, packet, memo, None, failed)
    if int(memo.get("redispatch", 0)) >= RETRY_LIMIT:
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
    memo.update(redispatch=int(memo.get("redispatch", 0)) + 1, previous_failure=detail)
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
        retries=memo,
    )


async def record_impl(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    memo: dict[str, Any],
    commit: str | None,
    verification: VerificationResult,
) -> None:
    project = await projects.get(ctx.db, run.project_id)
    repo = Path(project.path)
    base = str(memo.get("base", run.base_commit))
    files: list[str] = []
    stat = ""
    if commit is not None and commit != base:
        files = await gitops.changed_files(repo, base, commit)
        stat = await gitops.diff_stat(repo, base, commit)
    coder = coder_of(packet)
    receipt = ImplementationReceipt(
        packet_id=packet.packet_id,
        attempt=packet.attempt,
        coder=coder,
        environment=coder.environment,
        branch=str(packet.branch),
        base_commit=base,
        commit=commit,
        files_changed=files,
        diff_stat=stat,
        verification=verification,
        report=str(memo.get("report") or ""),
        recovered_paths=list(memo.get("recovered") or []),
    )
    await ostore.add_receipt(
        ctx.db, run.id, packet.packet_id, "implementation", receipt.wire(), now=ctx.clock()
    )
