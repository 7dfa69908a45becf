"""The implement hop: a packet's coder thread, its commits (here, after containment, or fetched
from a box), and re-dispatch to another coder when the result is empty or the run failed."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

from peerd import contracts as c
from peerd.errors import Conflict, PeerdError
from peerd.orchestrate import escapes, prwait, scope, spend, steps
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings
from peerd.orchestrate.escapes import Collected
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import CoderChoice, ImplementationReceipt, PacketSpec, VerificationResult
from peerd.orchestrate.placing import place_coder
from peerd.orchestrate.prompts import implementer_prompt
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
    coder = await place_coder(ctx, run, coder, f"{packet.packet_id}:implement", runtime_mode=settings.access)
    base = await base_for(ctx, run, packet)
    await ctx.set(
        run.id,
        packet.packet_id,
        expect=packet.state,
        state="implementing",
        hop="implement",
        attempt=1,
        coder=coder.model_dump(mode="json"),
        environment=coder.environment,
        branch=f"orchestrate/{run.id}/{packet.packet_id}",
        memo=PacketMemo(base=base),
    )


async def base_for(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> str:
    """The exact commit a packet starts from: the run's base, or its dependencies' work (a fix
    packet of --until: the commit the pull request had)."""
    if (fixed := await prwait.fix_base(ctx, run.id, packet.packet_id)) is not None:
        return fixed
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
                merged = await git.merge_into(repo, worktree, dep.branch, f"Merge {dep.packet_id} as a base")
                if not merged.merged:
                    raise Conflict(
                        f"The dependencies of {packet.packet_id} conflict: {', '.join(merged.conflicts)}"
                    )
        return await git.head(await git.locate_worktree(repo, worktree))
    finally:
        await git.remove_worktree(repo, worktree, delete_branch=None)


def view(run: ostore.RunRow, packet: ostore.PacketRow, settings: Settings) -> steps.Packet:
    """The packet as the hops' decisions see it (`steps.Packet`)."""
    return steps.Packet(
        orchestration_id=run.id,
        packet_id=packet.packet_id,
        attempt=packet.attempt,
        thread_id=packet.thread_id,
        run_id=packet.run_id,
        memo=packet.memo,
        base=packet.memo.base or run.base_commit,
        spec=PacketSpec.model_validate(packet.spec),
        coder=coder_of(packet),
        coders=settings.coders,
        packet_timeout_s=settings.packet_timeout_s,
        commit_sha=packet.commit_sha,
    )


async def implementing(ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow) -> None:
    """The coder's turn: launched (or a pending follow-up sent), waited for, then what it came to,
    each step as `steps.decide_implement` says; the facts it needs are gathered as it asks."""
    settings = Settings.from_request(run.request)
    coder = coder_of(packet)
    while True:
        turn = steps.decide_implement(view(run, packet, settings), steps.Begin())[0]
        if isinstance(turn, steps.Wait):
            break
        if isinstance(turn, steps.Launch):
            event: steps.ImplementEvent = await _launch(ctx, run, packet, settings, turn)
        else:
            assert isinstance(turn, steps.Send)  # noqa: S101  # Begin asks for one of the three
            event = await _send(ctx, run, packet, settings, turn)
        await perform(ctx, run, packet, steps.decide_implement(view(run, packet, settings), event))
    assert packet.thread_id is not None and packet.run_id is not None  # noqa: S101  # set just above
    thread_id, run_ref, env = packet.thread_id, packet.run_id, coder.environment
    status = await ctx.wait(run.id, thread_id, run_ref, env, deadline=turn.deadline)
    await spend.record_run(ctx, run.id, packet.packet_id, thread_id, run_ref, env, "implementer")
    ended = steps.TurnEnded(
        status,
        await spend.check(ctx, run, packet.packet_id),
        await spend.check_by(ctx, run, packet.packet_id),
    )
    while True:
        effects = steps.decide_implement(view(run, packet, settings), ended)
        need = effects[0]
        if isinstance(need, steps.NeedCut):
            ended = replace(ended, cut=await ctx.stopped_by_shutdown(run.id, thread_id, env))
        elif isinstance(need, steps.NeedOutcome):
            ended = replace(ended, outcome=await ctx.outcome(run.id, thread_id, run_ref, env))
        elif isinstance(need, steps.NeedCollect):
            ended = replace(ended, collected=await collect(ctx, run, packet, coder, list(need.hop_runs)))
        else:
            break
    await perform(ctx, run, packet, effects)


async def _launch(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    settings: Settings,
    turn: steps.Launch,
) -> steps.Launched:
    spec, base = PacketSpec.model_validate(packet.spec), packet.memo.base or run.base_commit
    prompt = implementer_prompt(
        spec,
        workspace_root=f"the git worktree you start in (branch {packet.branch})",
        base_commit=base,
        branch=str(packet.branch),
        workarounds=settings.workarounds,
        previous_failure=packet.memo.previous_failure,
        review_changes=None,
    )
    launched = await ctx.launch(
        run,
        coder_of(packet),
        prompt,
        key=turn.key,
        runtime_mode=settings.access,
        base=base,
        role="implementer",
        packet_id=packet.packet_id,
        branch=packet.branch,
        budget=await spend.budget_for(ctx, run, packet.packet_id, turn.key),
    )
    return steps.Launched(launched.thread_id, launched.run_id, prompt, _deadline(ctx, settings), ctx.clock())


async def _send(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    settings: Settings,
    send: steps.Send,
) -> steps.Sent:
    assert packet.thread_id is not None  # noqa: S101  # a follow-up goes to the packet's thread
    budget = await spend.budget_for(ctx, run, packet.packet_id, send.key)
    env = coder_of(packet).environment
    run_ref = await ctx.send(run.id, packet.thread_id, env, send.text, key=send.key, budget=budget)
    return steps.Sent(send, run_ref, _deadline(ctx, settings), ctx.clock())


async def perform(
    ctx: OrchestrationContext, run: ostore.RunRow, packet: ostore.PacketRow, effects: list[steps.Effect]
) -> None:
    """Do what a decision said, in order; `packet` follows what is recorded."""
    settings = Settings.from_request(run.request)
    for effect in effects:
        if isinstance(effect, steps.Record):
            await ctx.set(run.id, packet.packet_id, expect=packet.state, **effect.fields, memo=effect.memo)
            for name, value in effect.fields.items():
                setattr(packet, name, value)
            packet.memo = effect.memo
        elif isinstance(effect, steps.Park):
            await ctx.park(run.id, packet.packet_id, effect.why, expect=packet.state)
        elif isinstance(effect, steps.StopOverBudget):
            await spend.stop_over_budget(ctx, run.id, packet, effect.why)
        elif isinstance(effect, steps.RecordImpl):
            await record_impl(ctx, run, packet, effect.memo, effect.commit, effect.verification)
        elif isinstance(effect, steps.Interrupt):
            assert packet.thread_id is not None  # noqa: S101  # its coder's turn timed out
            with contextlib.suppress(PeerdError):
                stop = c.ThreadInterrupt(
                    stop=True, reason=effect.reason, environment_id=coder_of(packet).environment
                )
                await ctx.ops.thread_interrupt(ctx.caller(run.id), packet.thread_id, stop)
        elif isinstance(effect, steps.Send):  # a resume after a restart cut the coder off
            sent = await _send(ctx, run, packet, settings, effect)
            await perform(ctx, run, packet, steps.decide_implement(view(run, packet, settings), sent))
        elif isinstance(effect, steps.Redispatch):
            await _redispatch(ctx, run, packet, settings, effect)
        else:
            raise AssertionError(f"not an effect of this hop: {effect!r}")


async def _redispatch(
    ctx: OrchestrationContext,
    run: ostore.RunRow,
    packet: ostore.PacketRow,
    settings: Settings,
    effect: steps.Redispatch,
) -> None:
    nxt = await place_coder(
        ctx, run, effect.coder, f"{packet.packet_id}:redispatch", runtime_mode=settings.access
    )
    if effect.archive is not None:
        with contextlib.suppress(PeerdError):
            await ctx.ops.thread_archive(ctx.caller(run.id), effect.archive, c.ThreadArchive(force=True))
    await ctx.set(
        run.id,
        packet.packet_id,
        expect=packet.state,
        state="implementing",
        attempt=effect.attempt,
        coder=nxt.model_dump(mode="json"),
        environment=nxt.environment,
        thread_id=None,
        run_id=None,
        branch=effect.branch,
        memo=effect.memo,
    )


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
    await git.commit_all(worktree, message)
    return Collected(await git.head(worktree), changes)


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
        files = await git.changed_files(repo, base, commit)
        stat = await git.diff_stat(repo, base, commit)
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
    await ostore.add_receipt(
        ctx.db, run.id, packet.packet_id, "implementation", receipt.wire(), now=ctx.clock()
    )
