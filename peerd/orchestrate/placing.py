"""`auto` in `peerd orchestrate`: a coder spec `auto/codex` (or `--on auto`) is placed per hop.

Each hop (a packet's implementer, a re-dispatch, a reviewer, the planner) asks here once before it
launches: the coder's environment becomes the one placement chose (here: none; a box: its label
when that names one link, else its id), and the reason is added to the coder's, so the
orchestrate report says where each hop ran and why. The choice is kept under the orchestration's
own key for that hop, so a resumed run (after a restart) places the hop where it went before.
"""

from __future__ import annotations

from peerd import contracts as c
from peerd.errors import InvalidRequest
from peerd.orchestrate.context import OrchestrationContext
from peerd.orchestrate.models import CoderChoice
from peerd.orchestrate.store import RunRow
from peerd.store import links, projects

AUTO = "auto"


async def place_coder(
    ctx: OrchestrationContext,
    run: RunRow,
    coder: CoderChoice,
    hop: str,
    *,
    runtime_mode: str | None,
) -> CoderChoice:
    """The coder with a concrete environment, when it was `auto`; else the coder as it is."""
    if coder.environment != AUTO:
        return coder
    placement = ctx.ops.placement
    if placement is None:
        raise InvalidRequest("This daemon cannot place work automatically; name the environment.")
    project = await projects.get(ctx.db, run.project_id)
    mode = next((m for m in c.RUNTIME_MODES if m == runtime_mode), None)
    placed = await placement.for_project(
        project,
        coder.backend,
        mode,
        via_link=False,
        key=f"orchestrate:{run.id}:{hop}",
    )
    environment = placed.environment_id
    if environment is not None:
        labelled = [row for row in await links.all_links(ctx.db) if row.label == placed.label]
        if len(labelled) == 1:
            environment = placed.label
    spec = coder.spec.split("/", 1)[-1]
    return coder.model_copy(
        update={
            "environment": environment,
            "spec": spec if environment is None else f"{environment}/{spec}",
            "reason": f"{coder.reason}; placed by auto: {placed.reason}",
        }
    )
