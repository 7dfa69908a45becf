"""What a run leaves behind, removed at its end (completed, failed or cancelled alike) unless
`--keep`: the worktrees of every thread it started (here, and on boxes through the link), the
`peerd/<thread>` branches of its planner and reviewer threads, and the empty directories under
`<home>/worktrees/orchestrate/<run>/`. The packets' own branches (`orchestrate/<run>/...`) and the
integration branch stay: they are the work.

Stops of a cancel (`Engine.cancel`) live here too: each live thread of a packet is stopped, and a
stop a box cannot hear now is owed (kept in the packet's memo) and retried until it lands.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

import structlog

from peerd import contracts as c
from peerd.core.backoff import Backoff
from peerd.core.ownership import Owner
from peerd.core.runs import is_live
from peerd.core.text import path_segment
from peerd.errors import Conflict, PeerdError, PeerUnreachable, StateChanged
from peerd.orchestrate import store as ostore
from peerd.orchestrate.context import OrchestrationContext, Settings
from peerd.runtime import git
from peerd.store import ownership, projects

log = structlog.get_logger(__name__)

# A cancel a box could not be told: retried after 2 s, 4 s ... then every 5 minutes, until it lands.
OWED_STOP_BACKOFF = Backoff(first=2.0, cap=300.0)
# How long a stopped thread's run gets to end before its worktree is removed anyway (next time).
STOP_SETTLE_S = 15.0


def live_threads(packet: ostore.PacketRow) -> list[tuple[str, str | None]]:
    """The packet's current thread and its current review thread."""
    found: list[tuple[str, str | None]] = []
    if packet.thread_id:
        found.append((packet.thread_id, packet.environment))
    if packet.memo.review_thread is not None:
        found.append((packet.memo.review_thread, packet.memo.review_env))
    return found


async def stop_thread(ctx: OrchestrationContext, run_id: str, thread_id: str, env: str | None) -> bool:
    """True when the stop landed, or can never land (the link is gone, the thread is gone)."""
    try:
        await ctx.ops.thread_interrupt(
            ctx.caller(run_id),
            thread_id,
            c.ThreadInterrupt(stop=True, reason=f"Orchestration {run_id} cancelled.", environment_id=env),
        )
    except PeerUnreachable as exc:
        log.info("orchestrate.stop_owed", run_id=run_id, thread_id=thread_id, error=exc.message)
        return False
    except PeerdError as exc:
        log.warning("orchestrate.stop_refused", run_id=run_id, thread_id=thread_id, error=exc.message)
    return True


async def stop_packets(ctx: OrchestrationContext, run_id: str, reason: str) -> int:
    """Stop every live packet and review thread; a stop a box could not be told now is kept
    (`stop_owed`) and delivered later. Returns how many are owed."""
    run = await ostore.get(ctx.db, run_id)
    owed = 0
    for packet in run.packets:
        if packet.terminal or packet.state == "approved":
            continue
        pending = [
            (thread_id, env)
            for thread_id, env in live_threads(packet)
            if not await stop_thread(ctx, run_id, thread_id, env)
        ]
        memo = packet.memo.copy_for_update()
        memo.stop_owed = pending
        try:
            await ostore.update_packet(
                ctx.db,
                run_id,
                packet.packet_id,
                now=ctx.clock(),
                state="cancelled",
                failure=reason,
                memo=memo,
            )
        except StateChanged:  # it became final (or approved) meanwhile: that state stands
            continue
        owed += len(pending)
    return owed


async def deliver_owed(ctx: OrchestrationContext, run_id: str) -> None:
    """Owed stops, retried with backoff (across restarts, from the store) until each lands; then
    that thread is cleaned up like the others."""
    for attempt in itertools.count(1):
        remaining = 0
        for packet in (await ostore.get(ctx.db, run_id)).packets:
            owed = packet.memo.stop_owed
            if not owed:
                continue
            landed = [(t, e) for t, e in owed if await stop_thread(ctx, run_id, t, e)]
            memo = packet.memo.copy_for_update()
            memo.stop_owed = [pair for pair in owed if pair not in landed]
            still = memo.stop_owed
            await ostore.update_packet(ctx.db, run_id, packet.packet_id, now=ctx.clock(), memo=memo)
            remaining += len(still)
            run = await ostore.get(ctx.db, run_id)
            if not Settings.from_request(run.request).keep:
                for thread_id, env in landed:
                    await retire(ctx, run, thread_id, env)
        ctx.changed(run_id)
        if not remaining:
            return
        await ctx.clock.sleep(OWED_STOP_BACKOFF.delay(attempt))


async def clean_up(ctx: OrchestrationContext, run_id: str) -> None:
    """Remove what the run made (see the module docstring); errors are logged, never raised: the
    run's outcome does not depend on its clean-up."""
    run = await ostore.get(ctx.db, run_id)
    if Settings.from_request(run.request).keep:
        return
    owed = {thread for p in run.packets for thread, _ in p.memo.stop_owed}
    for thread_id, env, _role in await ctx.threads_of(run_id):
        if thread_id not in owed:  # an owed stop's thread goes once the stop lands
            await retire(ctx, run, thread_id, env)
    remove_empty_dirs(ctx.worktrees_dir / "orchestrate" / run_id)


async def retire(ctx: OrchestrationContext, run: ostore.RunRow, thread_id: str, env: str | None) -> None:
    """Archive one of the run's threads (its worktree goes); a live one is stopped first and
    given `STOP_SETTLE_S` to end. Here, a thread's own `peerd/<thread>` branch goes too."""
    try:
        if env is None:
            await _retire_here(ctx, run, thread_id)
        else:
            await _retire_there(ctx, run.id, thread_id, env)
    except PeerdError as exc:
        log.warning("orchestrate.cleanup_failed", run_id=run.id, thread_id=thread_id, error=exc.message)


async def _settle(ctx: OrchestrationContext, run_id: str, thread: c.Thread, env: str | None) -> None:
    latest = thread.latest_run
    if latest is None or not is_live(latest.status):
        return
    stop = c.ThreadInterrupt(stop=True, reason=f"Orchestration {run_id} ended.", environment_id=env)
    await ctx.ops.thread_interrupt(ctx.caller(run_id), thread.id, stop)
    wait = c.ThreadWait(run_id=latest.id, timeout=STOP_SETTLE_S, environment_id=env)
    await ctx.ops.thread_wait(ctx.caller(run_id), thread.id, wait)


async def _retire_here(ctx: OrchestrationContext, run: ostore.RunRow, thread_id: str) -> None:
    thread = await ctx.ops.thread_show(ctx.caller(run.id), thread_id)
    await _settle(ctx, run.id, thread, None)
    await ctx.ops.thread_archive(ctx.caller(run.id), thread_id, c.ThreadArchive(force=True))
    if thread.branch and thread.branch.startswith("peerd/"):
        # The planner's and reviewers' threads ran read-only on a branch of their own: nothing
        # of theirs is on it. (Packet branches, orchestrate/..., are the work and stay.) Only a
        # branch the ledger gives to this orchestration is deleted.
        ref = f"refs/heads/{thread.branch}"
        owned = await ownership.owner_of(ctx.db, run.project_id, "ref", ref)
        if owned is None or owned.owner != Owner.orchestration(run.id):
            log.info("orchestrate.branch_kept", run_id=run.id, branch=thread.branch, reason="not this run's")
            return
        project = await projects.get(ctx.db, run.project_id)
        await git.remove_worktree(Path(project.path), Path(thread.worktree_path), delete_branch=thread.branch)
        await ownership.forget_one(ctx.db, run.project_id, "ref", ref, owner=owned.owner)


async def _retire_there(ctx: OrchestrationContext, run_id: str, thread_id: str, env: str) -> None:
    """Archive a thread on a box, its branch too: its work came back in a bundle (packets are
    integrated here), so nothing of the run's is left only there."""
    path = f"/v1/threads/{path_segment(thread_id)}/archive"
    body = {"force": True, "deleteBranch": True}
    try:
        await ctx.ops.forward_raw(env, "POST", path, body=body)
    except Conflict:  # still live: stop it, let it end, then archive
        thread = await ctx.ops.thread_show(ctx.caller(run_id), thread_id, env)
        await _settle(ctx, run_id, thread, env)
        await ctx.ops.forward_raw(env, "POST", path, body=body)


def remove_empty_dirs(root: Path) -> None:
    """`root` and the directories below it, when empty (deepest first); anything else stays."""
    if not root.is_dir() or root.is_symlink():
        return
    for current, _dirs, _files in sorted(os.walk(root), key=lambda x: -len(x[0])):
        with contextlib.suppress(OSError):
            Path(current).rmdir()
