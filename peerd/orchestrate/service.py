"""The orchestration front: validate and resolve a request, record it, hand it to the engine; read
and wait on runs; cancel. The CLI talks to this through `/v1/orchestrations` on the local socket.
Loaded on first need with the engine (`orchestrate/lazy.py`), built by `build`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from peerd import contracts as c
from peerd.errors import CapabilityDenied, InvalidRequest
from peerd.orchestrate import deliver, userwork, views
from peerd.orchestrate import store as ostore
from peerd.orchestrate.coders import assign, choose_reviewer, load_project_config, resolve_coders
from peerd.orchestrate.engine import Engine, feed_key, plan_checks
from peerd.orchestrate.front import FrontParts, OrchestrateRequest
from peerd.orchestrate.models import CoderChoice, PacketSpec, PlanReceipt, validate_plan
from peerd.runtime import git
from peerd.runtime.feed import ChangeFeed
from peerd.store import links, projects, provider_approvals
from peerd.store.db import Database


async def _branch_of(repo: Path) -> str | None:
    """The branch the user's checkout is on (a pull request's base), None when detached."""
    found = await git.run(repo, "symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1, 128))
    return found.stdout.strip() or None if found.returncode == 0 else None


async def _keep_out_of_git(repo: Path) -> None:
    """The project's `.peerd/` (orchestrate.toml) is local config: exclude it, as the seed says, so
    it is never committed and never looks like a change in the checkout."""
    if not (repo / ".peerd").exists():
        return
    ignored = await git.run(repo, "check-ignore", "-q", ".peerd/", ok=(0, 1))
    if ignored.returncode == 0:
        return
    git_dir = Path((await git.run(repo, "rev-parse", "--git-common-dir")).stdout.strip())
    exclude = (git_dir if git_dir.is_absolute() else repo / git_dir) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a", encoding="utf-8") as handle:
        handle.write("\n.peerd/\n")


class Assigner:
    """Which coders and reviewers a run's packets get, recorded with the run (and why each was
    chosen): asked when a run starts and when its planner made packets (`Engine(assign_more=...)`).
    Built by the daemon before the engine and the service, which both are given it."""

    def __init__(
        self,
        *,
        available: Callable[[], Awaitable[dict[str, bool]]],
        models: Mapping[str, str | None] | None = None,
    ) -> None:
        self.available = available
        self._models = {k: v for k, v in (models or {}).items() if v}

    def with_model(self, choice: CoderChoice) -> CoderChoice:
        """A coder without a model runs its provider's configured one: say which."""
        configured = self._models.get(choice.backend)
        if choice.model is not None or choice.environment is not None or configured is None:
            return choice
        return choice.model_copy(
            update={"model": configured, "reason": f"{choice.reason}; model {configured} from peerd's config"}
        )

    async def assign_more(self, request: dict[str, Any], packets: list[PacketSpec]) -> dict[str, Any]:
        """Coders and reviewers for each packet, recorded with the run (and why each was chosen)."""
        coders = [CoderChoice.model_validate(x) for x in request["coders"]]
        reviewer_flag = request.get("reviewerFlag")
        configured = request.get("reviewerConfigured")
        available = await self.available()
        assignment = assign(packets, coders, reviewer_flag=reviewer_flag)
        reviewers = {
            pid: self.with_model(
                choose_reviewer(choice, coders, reviewer_flag, configured=configured, available=available)
            ).model_dump(mode="json")
            for pid, choice in assignment.items()
        }
        return {
            **request,
            "assignment": {pid: choice.model_dump(mode="json") for pid, choice in assignment.items()},
            "reviewers": reviewers,
        }


class Orchestrations:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        engine: Engine,
        *,
        assigner: Assigner,
        approved: Callable[[str, str], Awaitable[bool]],
        custom_commands: Mapping[str, str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.feed = feed
        self.engine = engine
        self.assigner = assigner
        self._approved = approved
        self._custom = dict(custom_commands)
        self.clock = clock

    async def _environments(self) -> list[str]:
        rows = await links.all_links(self.db)
        return [name for row in rows for name in (row.env_id, row.label)]

    async def _resolve(self, req: OrchestrateRequest, project_dir: Path) -> tuple[Any, Any]:
        config = load_project_config(project_dir)
        approved = [name for name, command in self._custom.items() if await self._approved(name, command)]
        resolution = resolve_coders(
            req.coders,
            config,
            await self.assigner.available(),
            # Interactive: the CLI asked the person about each custom command in a dry run first,
            # and sends the ones they allowed; anything still unconfirmed is refused below.
            interactive=not req.non_interactive,
            allow_commands=req.allow_commands,
            approved=approved,
            custom_commands=self._custom,
            on=req.on,
            known_environments=await self._environments(),
        )
        coders = [self.assigner.with_model(choice) for choice in resolution.coders]
        return config, resolution.model_copy(update={"coders": coders})

    async def start(self, req: OrchestrateRequest) -> dict[str, Any]:
        project = await projects.get(self.db, req.project_id)
        repo = Path(project.path)
        if req.plan is None and not req.task.strip():
            raise InvalidRequest("Say what to do: a task, or --plan DIR with one file per packet.")
        if req.plan is not None and (errors := validate_plan(req.plan)):
            raise InvalidRequest("The plan is not valid:\n" + "\n".join(errors))
        if req.until is not None and not req.pr:
            raise InvalidRequest(
                f"--until {req.until} waits on the pull request the run opens: add --pr, or drop --until."
            )
        config, resolution = await self._resolve(req, repo)
        remote = req.push or ("origin" if req.pr else None)
        if remote is not None:
            await deliver.check_remote(repo, remote)
        request_flags = {"flags": req.model_dump(mode="json", by_alias=True, exclude={"plan"})}
        plan, notes = plan_checks(req.plan, request_flags) if req.plan is not None else (None, [])
        warnings = list(notes)
        if req.pr and (problem := await deliver.gh_problem(repo)):
            warnings.append(f"--pr: {problem}; the run goes on, and its report says what to run instead.")
        # The user's own work, recorded before anything else happens (kept with the run).
        user_work = await userwork.snapshot(repo)
        if (
            plan is not None
            and not req.include_dirty
            and (overlap := userwork.dirty_in_packets(plan, user_work))
        ):
            raise userwork.refusal(overlap, repo)
        preview = {
            "coders": [x.model_dump(mode="json", by_alias=True) for x in resolution.coders],
            "log": resolution.log,
            "skipped": resolution.skipped,
            "needsConfirmation": [{"name": n, "command": cmd} for n, cmd in resolution.needs_confirmation],
            "defaultOptions": list(resolution.default_options),
            "configFile": str(repo / ".peerd" / "orchestrate.toml"),
            "warnings": warnings,
            "dirtyPaths": sorted(user_work),
        }
        if req.dry_run:
            return {"dryRun": True, **preview}
        if resolution.needs_confirmation:
            names = ", ".join(f"{n} (`{cmd}`)" for n, cmd in resolution.needs_confirmation)
            raise CapabilityDenied(
                f"Custom commands need your confirmation before their first run: {names}. Run again and "
                "confirm, or pass --allow-command NAME."
            )
        for name, command in resolution.commands.items():
            if name in req.allow_commands or command in req.allow_commands:
                # The owner confirmed (or named) this exact command on their own socket: that is an
                # approval, bound to the command's text like `peerd provider approve`.
                await provider_approvals.approve(self.db, name, command, now=self.clock())
        await _keep_out_of_git(repo)
        run_id = ostore.new_run_id()
        base = await git.head(repo)
        if req.include_dirty:
            scratch = self.engine.ctx.worktrees_dir / "orchestrate" / run_id / "start"
            base = await userwork.working_state_commit(
                repo, scratch, f"orchestrate/{run_id}/start", user_work
            )
        request: dict[str, Any] = {
            "coders": [x.model_dump(mode="json") for x in resolution.coders],
            "concurrency": req.concurrency,
            "packetTimeoutS": req.packet_timeout_s,
            "verify": req.verify or config.verify,
            "workarounds": list(config.sandbox_workarounds),
            "planner": resolution.coders[0].model_dump(mode="json"),
            "reviewerFlag": req.reviewer,
            "reviewerConfigured": config.reviewer,
            "userWork": user_work,
            "userBranch": await _branch_of(repo),
            "includeDirty": req.include_dirty,
            "keep": req.keep,
            "push": remote,
            "pr": req.pr,
            "ready": req.ready,
            "until": req.until,
            "budget": None if req.budget is None else req.budget.rule().to_json(),
            "packetBudget": None if req.packet_budget is None else req.packet_budget.rule().to_json(),
            "access": req.access,
            **request_flags,
        }
        if plan is not None:
            request.update(await self.assigner.assign_more(request, plan))
        run = await ostore.create(
            self.db, project_id=project.id, task=req.task, request=request, base_commit=base,
            now=self.clock(), run_id=run_id,
        )  # fmt: skip
        await ostore.add_receipt(self.db, run.id, None, "resolution", preview, now=self.clock())
        if plan is not None:
            receipt = PlanReceipt(
                run_id=run.id, task=req.task, packets=plan, source="plan_dir", planner=None, notes=notes
            )
            await self.engine.record_given_plan(run.id, receipt)
        self.engine.spawn(run.id)
        return await self.info(run.id)

    async def info(self, run_id: str) -> dict[str, Any]:
        return await views.describe(self.db, run_id)

    async def list(self) -> list[dict[str, Any]]:
        items = []
        for run_id in await ostore.all_runs(self.db):
            run = await ostore.get(self.db, run_id)
            items.append(
                {"id": run.id, "task": run.task, "status": run.status, "branch": run.branch,
                 "packets": len(run.packets), "createdAt": run.created_at, "reason": run.reason}
            )  # fmt: skip
        return items

    async def wait(self, run_id: str, *, after: float, seconds: float) -> dict[str, Any]:
        """Long-poll: the run once it changed past `after` (its updatedAt), or at the timeout."""
        deadline = self.feed.deadline(min(seconds, c.LONG_POLL_MAX_S))
        while True:
            changed = self.feed.watch(feed_key(run_id))
            run = await ostore.get(self.db, run_id)
            remaining = self.feed.remaining(deadline)
            if run.updated_at > after or run.terminal or remaining <= 0 or self.feed.closed:
                return await self.info(run_id)
            with contextlib.suppress(TimeoutError):
                await self.feed.wait(changed, remaining)

    async def cancel(self, run_id: str, reason: str | None) -> dict[str, Any]:
        await self.engine.cancel(run_id, reason)
        return await self.info(run_id)


def build(parts: FrontParts) -> Orchestrations:
    """The assigner, the engine and the service, from what the daemon gave (`orchestrate/lazy.py`
    calls this once the modules are loaded)."""
    assigner = Assigner(available=parts.available, models=parts.models)
    engine = Engine(
        parts.db,
        parts.feed,
        parts.ops,
        worktrees_dir=parts.worktrees_dir,
        assign_more=assigner.assign_more,
        clock=parts.clock,
        gh_pace=parts.gh_pace,
        **({} if parts.pr_poll_s is None else {"pr_poll_s": parts.pr_poll_s}),
    )
    return Orchestrations(
        parts.db,
        parts.feed,
        engine,
        assigner=assigner,
        approved=parts.approved,
        custom_commands=parts.custom_commands,
        clock=parts.clock,
    )
