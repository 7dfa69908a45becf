"""The side of a move a link calls on the machine a thread moves to.

    POST /v1/handoff/check {repositoryKey, provider}   the project with that repository here, whether
                                                       the provider is installed and a link may use it
    POST /v1/projects/{id}/moved-branch {moveId, branch, tip}   the branch landing (gitwork.land)
    POST /v1/threads/{id}/moved-from {environmentId, threadId}  the lineage, on a thread the link started

The dry run's view of each linked environment asks its `/v1/handoff/check` (`preflight.py`).
The launch itself is the link's ordinary launch (`POST /v1/threads`, capped by the link, keyed by
the move id). A landing needs write access; the lineage is the link's own claim on a thread it
started (the fence), shown as such.
"""

from __future__ import annotations

from pathlib import Path

from peerd import contracts as c
from peerd.core.access import require_write
from peerd.core.ownership import Owner
from peerd.errors import CapabilityDenied
from peerd.handoff import gitwork
from peerd.handoff import store as moves
from peerd.handoff.wire import (
    BranchLanded,
    BranchLanding,
    MovedFrom,
    MovedRef,
    TakeAnswer,
    TakeCheck,
)
from peerd.operations import Caller, Operations
from peerd.store import ownership, projects, threads


async def take_check(ops: Operations, caller: Caller, req: TakeCheck) -> TakeAnswer:
    installed = [name for name in ops.runs.providers() if ops.provider_installed(name)]
    found: str | None = None
    cursor: str | None = None
    while found is None:
        page = await ops.project_list(Caller.local(), c.ProjectList(cursor=cursor))
        found = next((p.id for p in page.items if p.repository_key == req.repository_key), None)
        cursor = page.next_cursor
        if cursor is None:
            break
    access: c.RuntimeMode = "full-access" if caller.link is None else caller.link.access
    return TakeAnswer(
        project_id=found,
        provider_installed=req.provider in installed,
        provider_allowed=caller.link is None or ops.link_may_use(req.provider),
        providers=installed,
        access=access,
    )


async def land(ops: Operations, caller: Caller, project_id: str, req: BranchLanding) -> BranchLanded:
    if caller.link is not None:
        require_write(caller.link.access, "land a moved thread's branch")
    project = await projects.get(ops.db, project_id)
    me = Owner.person() if caller.link is None else Owner.link(caller.link.client_id)
    recorded = await ownership.owner_of(ops.db, project.id, "ref", f"refs/heads/{req.branch}")

    async def reserve(kept: str) -> None:
        # The kept ref is the caller's before git makes it: another link's move id is refused here.
        await ownership.claim_one(
            ops.db,
            project_id=project.id,
            holding="ref",
            name=kept,
            owner=me,
            purpose="moved",
            now=ops.clock(),
        )

    return await gitwork.land(
        Path(project.path),
        move_id=req.move_id,
        branch=req.branch,
        tip=req.tip,
        recorded=None if recorded is None else recorded.owner,
        caller=me,
        reserve=reserve,
    )


async def moved_from(ops: Operations, caller: Caller, thread_id: str, req: MovedFrom) -> c.Thread:
    thread = await threads.get_thread(ops.db, thread_id)
    if caller.link is None:
        raise CapabilityDenied("Only the link that launched a moved thread records where it came from.")
    await ops.check_can_change(caller, thread, "record where a moved thread came from")
    ref = MovedRef(environment_id=req.environment_id, thread_id=req.thread_id)
    await moves.set_moved_from(ops.db, thread_id, ref, now=ops.clock())
    ops.feed.changed(thread_id)
    return await threads.get_thread(ops.db, thread_id)
