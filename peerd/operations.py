"""The operations of the contract, one method each, shared by the HTTP API and the agent tools.

Each takes a `Caller` (who asks: the local owner, an agent's run, later a linked environment) and a
validated input model from `peerd.contracts`, and returns an output model. Bad input raises a typed
`PeerdError` before anything changes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from peerd import contracts as c
from peerd.core import diffparse, shortid
from peerd.core.access import (
    LinkContext,
    ModeCap,
    cap_for,
    interaction_rank,
    require_write,
    resolve_modes,
    runtime_rank,
)
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.idempotency import request_hash
from peerd.core.ownership import Owner, owner_of_thread
from peerd.core.runs import is_live, is_terminal
from peerd.core.text import clean_label, path_segment
from peerd.core.usage import DAY_S, ceiling_refusal
from peerd.errors import (
    AmbiguousId,
    CapabilityDenied,
    Conflict,
    InteractionModeEscalationDenied,
    InvalidRequest,
    LinkRevoked,
    NotYours,
    PeerdError,
    ProviderUnavailable,
    RunNotFound,
    RuntimeModeEscalationDenied,
    ThreadNotFound,
    WorktreeDirty,
)
from peerd.events import Events, ThreadArchived, ThreadStopped
from peerd.peer.forwarding import Forwarder
from peerd.runtime import git
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.runner import RunManager
from peerd.store import clients, ids, links, ownership, projects, thread_homes, threads
from peerd.store.db import Database, Tx
from peerd.store.threads import usage as usage_store

log = structlog.get_logger(__name__)

# A shortened thread id a person may type: `thr_` and 4 to 19 of its 20 hex digits.
AMBIGUOUS_SHOWN = shortid.AMBIGUOUS_SHOWN
THREAD_ID = re.compile(r"thr_[0-9a-f]{20}")
ASK_LINKS_S = 5.0  # how long a lookup waits for each linked machine to say whether it has a thread

DEFAULT_RUNTIME_MODE: c.RuntimeMode = "full-access"
DEFAULT_INTERACTION_MODE: c.InteractionMode = "default"


@dataclass(frozen=True)
class Caller:
    """Who is asking. `namespace` scopes idempotency keys so two callers never collide.

    One identity follows every request and every run: the owner (no link, no thread), a link
    calling over the network (`link`), or a run (`thread_id`, `run_id`) - and a run a link started
    carries that link too, so its agent tools, its delegations and its children stay inside the
    link's fence, cap, in-place ban and no-chaining rule exactly as the link's own calls do.
    """

    namespace: str
    thread_id: str | None = None
    run_id: str | None = None
    link: LinkContext | None = None
    started_by: str | None = None  # what a thread it launches records, when not derived (`started_by`)

    @classmethod
    def local(cls) -> Caller:
        return cls(namespace="local")

    @classmethod
    def for_link(cls, link: LinkContext) -> Caller:
        return cls(namespace=f"link:{link.client_id}", link=link)

    @property
    def via_network(self) -> bool:
        """A linked environment calling over the network (not a run on this machine)."""
        return self.link is not None and self.namespace == f"link:{self.link.client_id}"


def _read_fence(caller: Caller, thread: c.Thread) -> c.Thread:
    """A signed-in agent (`own_threads_only`) reads only threads it started; any other thread is
    answered as if it did not exist (no oracle for ids)."""
    link = caller.link
    if link is not None and link.own_threads_only and thread.link_origin != link.client_id:
        raise ThreadNotFound(f"Thread {thread.id} was not found.")
    return thread


def _fence(caller: Caller, thread: c.Thread, what: str, cap: ModeCap | None) -> None:
    """Links need write access and may change only threads they started; any capped caller (a link,
    an agent's run) may change only threads whose modes fit under its cap."""
    link = caller.link
    if link is not None:
        require_write(link.access, what)
        if thread.link_origin != link.client_id:
            raise CapabilityDenied(
                f"This link may change only threads it started; thread {thread.id} was not started through it."
            )
    if cap is None:
        return
    above_runtime = runtime_rank(thread.runtime_mode) > runtime_rank(cap.runtime)
    if above_runtime or interaction_rank(thread.interaction_mode) > interaction_rank(cap.interaction):
        error = RuntimeModeEscalationDenied if above_runtime else InteractionModeEscalationDenied
        raise error(
            f"Thread {thread.id} runs in {thread.runtime_mode}/{thread.interaction_mode} mode, above what this "
            f"caller may change ({cap.describe()})."
        )


class Placer(Protocol):
    """What `auto` asks of placement: `peerd/placement/service.py:Placement`, given by the daemon
    (placement is a feature above this layer, so operations and delegation see it only so)."""

    async def for_project(
        self,
        project: c.Project,
        provider: str,
        runtime_mode: c.RuntimeMode | None,
        *,
        via_link: bool,
        key: str | None,
    ) -> c.Placed: ...

    async def kept(
        self, key: str | None, placed: c.Placed, *, task_id: str | None = None, thread_id: str | None = None
    ) -> None: ...

    async def reason_for_thread(self, thread_id: str) -> str | None: ...

    async def reason_for_task(self, task_id: str) -> str | None: ...

    async def local_capacity(self) -> c.Capacity:
        """This environment's capacity report (a link's answer carries it: `api/remote.py:link_self`)."""
        ...


@dataclass(frozen=True)
class PlacedLaunch:
    """An `auto` launch once placed: the request as it will be sent (`environment_id` None: here;
    else the box, with its project), the choice and the key it is kept under."""

    req: c.ThreadLaunch
    placed: c.Placed
    key: str | None
    placement: Placer


class Operations:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        runs: RunManager,
        *,
        worktrees_dir: Path,
        forwarder: Forwarder | None = None,
        clock: Clock = SYSTEM_CLOCK,
        events: Events | None = None,
        placement: Placer | None = None,
        before_send: Callable[[str], Awaitable[None]] | None = None,
        link_may_use: Callable[[str], bool] = lambda provider: True,
        provider_installed: Callable[[str], bool] = lambda provider: True,
        awaiting_approval: Callable[[str], Awaitable[c.TaskApproval | None]] | None = None,
    ) -> None:
        # A thread's question waiting for a person, if any (peerd/approvals/store.py, given by the
        # daemon): a wait that ends with the run still live says so.
        self.awaiting_approval = awaiting_approval
        self.forwarder = forwarder
        # `ThreadStopped` goes out when a thread is stopped (its delegated tasks stop with it).
        self._events = events or Events()
        # Asked before a send queues a run; it refuses by raising: a thread with a move takes none
        # (peerd/handoff/service.py:MoveGuard.guard_send).
        self.before_send = before_send
        self.placement = placement  # `auto` in launches and delegations (peerd/placement/)
        self.db = db
        self.feed = feed
        self.runs = runs
        self.worktrees_dir = worktrees_dir
        self.clock = clock  # the daemon's one clock: `clock()` stamps, moves wait on it
        # Which providers a link's runs may use (`[links] providers` in config.toml).
        self.link_may_use = link_may_use
        # Whether a provider's binary is found: a launch of one that is not creates nothing.
        self.provider_installed = provider_installed

    async def remote_target(self, caller: Caller, environment_id: str | None) -> str | None:
        """The linked environment this call goes to, or None when it runs here."""
        if environment_id is None:
            return None
        if self.forwarder is None:
            raise InvalidRequest("This daemon cannot reach linked environments.")
        return await self.forwarder.target(environment_id, via_link=caller.link is not None)

    async def thread_ref(self, caller: Caller, given: str) -> str:
        """The thread a person means by `given`: its id, or a unique start of one (`thr_` and at
        least 4 hex digits: `thr_3264`). Only for the owner: a link's caller names ids in full, so
        an ambiguity's list never shows it a thread outside its fence."""
        if caller.link is not None or caller.thread_id is not None or not shortid.is_short(given, "thr"):
            return given
        found = await ids.starting(self.db, "threads", given, limit=AMBIGUOUS_SHOWN + 1)
        return shortid.chosen(given, found, "thread")  # none: the lookup that follows says not found

    async def thread_where(self, caller: Caller, given: str) -> c.ThreadWhere:
        """Where the thread a person names lives: here, or the linked machine this one launched,
        placed, delegated or moved it to (store/thread_homes.py), or else the one linked machine
        that has it when asked (a whole id only; recorded for next time). A unique start of an id
        is looked for here and in the record together; an ambiguous one is refused listing both.
        Only the owner asks: a link's caller, or a run, is never told about other machines."""
        if caller.link is not None or caller.thread_id is not None:
            raise CapabilityDenied("Only this machine's owner can ask where a thread lives.")
        short = shortid.is_short(given, "thr")
        if not short and THREAD_ID.fullmatch(given) is None:
            raise ThreadNotFound(
                f"{given!r} is not a thread id (thr_ and 20 hex digits, or at least 4 of them)."
            )
        here = await ids.starting(self.db, "threads", given, limit=AMBIGUOUS_SHOWN + 1)
        there = await thread_homes.elsewhere(self.db, given, limit=AMBIGUOUS_SHOWN + 1)
        labels = {row.env_id: row.label for row in await links.all_links(self.db)}
        if given in here:
            return c.ThreadWhere(thread_id=given, environment_id=None, via="here")
        exact = [home for home in there if home.thread_id == given]
        if exact or (short and len(here) + len(there) == 1):
            if here:
                return c.ThreadWhere(thread_id=here[0], environment_id=None, via="here")
            home = (exact or there)[0]
            return c.ThreadWhere(
                thread_id=home.thread_id,
                environment_id=home.environment_id,
                label=labels.get(home.environment_id),
                via=home.via,
            )
        if here or there:  # a start of more than one
            shown = [
                *here,
                *(f"{h.thread_id} (on {labels.get(h.environment_id, h.environment_id)})" for h in there),
            ]
            more = ", ..." if len(shown) > AMBIGUOUS_SHOWN else ""
            raise AmbiguousId(
                f"{given} is the start of more than one thread: {', '.join(shown[:AMBIGUOUS_SHOWN])}{more}. "
                "Give more of the id."
            )
        if short:
            raise ThreadNotFound(
                f"No thread here starts with {given}, nor any this machine started elsewhere; "
                "give the whole id to ask the linked machines."
            )
        return await self._ask_links(given, labels)

    async def _ask_links(self, thread_id: str, labels: dict[str, str]) -> c.ThreadWhere:
        """Ask every live link at once whether it has this thread (each within `ASK_LINKS_S`)."""
        live = [
            row
            for row in await links.all_links(self.db)
            if row.info(now=self.clock()).status not in ("revoked", "expired")
        ]
        if self.forwarder is None or not live:
            raise ThreadNotFound(f"No thread {thread_id} here, and this machine has no links to ask.")

        async def has(env_id: str) -> bool | None:  # None: could not tell
            try:
                await asyncio.wait_for(
                    self._forward(Caller.local(), env_id, "GET", f"/v1/threads/{path_segment(thread_id)}"),
                    ASK_LINKS_S,
                )
            except ThreadNotFound:
                return False
            except (PeerdError, TimeoutError):
                return None
            return True

        answers = await asyncio.gather(*(has(row.env_id) for row in live))
        found = [row for row, yes in zip(live, answers, strict=True) if yes]
        if len(found) == 1:
            home = found[0]
            await thread_homes.record(self.db, thread_id, home.env_id, "found", self.clock())
            return c.ThreadWhere(
                thread_id=thread_id, environment_id=home.env_id, label=home.label, via="found"
            )
        asked = ", ".join(row.label for row, yes in zip(live, answers, strict=True) if yes is False) or "none"
        silent = [row.label for row, yes in zip(live, answers, strict=True) if yes is None]
        if found:  # an id is unique: two machines with it is a copy; do not guess
            raise AmbiguousId(
                f"Both {' and '.join(row.label for row in found)} have a thread {thread_id}; "
                "name the machine with --env."
            )
        unreachable = f"; could not ask {', '.join(silent)} (unreachable)" if silent else ""
        raise ThreadNotFound(
            f"No thread {thread_id} here, nor on the linked machines (asked: {asked}){unreachable}."
        )

    async def _forward(
        self,
        caller: Caller,
        env_id: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        if self.forwarder is None:  # remote_target already refused; this keeps the type checker honest
            raise InvalidRequest("This daemon cannot reach linked environments.")
        cap = await self._cap_of(caller)
        modes = None if cap is None else (cap.runtime, cap.interaction)
        return await self.forwarder.call(env_id, method, path, body=body, params=params, caller_modes=modes)

    async def forward_raw(
        self, env_id: str, method: str, path: str, *, body: dict[str, Any] | None = None
    ) -> Any:
        """A call to a linked environment (an id or a link's label) as this daemon's owner (the
        orchestration's commit transport)."""
        caller = Caller.local()
        target = await self.remote_target(caller, env_id)
        if target is None:
            raise InvalidRequest("Name the linked environment to call.")
        return await self._forward(caller, target, method, path, body=body)

    async def caller_for_thread(self, thread: c.Thread, *, run_id: str | None, namespace: str) -> Caller:
        """Who a thread's run acts as: that thread, at its own modes, and - when a link started the
        thread - that link, at the link's current level (a revoked or expired link acts no more)."""
        link = None
        if thread.link_origin is not None:
            client = await clients.active_client(self.db, thread.link_origin, now=self.clock())
            if client is None:
                raise LinkRevoked(
                    f"The link that started thread {thread.id} was revoked or has expired here, so its "
                    "runs can no longer act."
                )
            cap = cap_for(client.access, ModeCap(thread.runtime_mode, thread.interaction_mode))
            link = LinkContext(
                client_id=client.id,
                label=client.label,
                access=client.access,
                cap=cap,
                own_threads_only=client.kind == "agent",
            )
        return Caller(namespace=namespace, thread_id=thread.id, run_id=run_id, link=link)

    async def check_can_change(self, caller: Caller, thread: c.Thread, what: str) -> None:
        """The link fence and the caller's mode cap, for operations outside this class."""
        _fence(caller, thread, what, await self._cap_of(caller))

    async def _cap_of(self, caller: Caller) -> ModeCap | None:
        """The widest modes this caller may use: a link's cap, or an agent run's own thread modes."""
        if caller.link is not None:
            return caller.link.cap
        if caller.thread_id is not None:
            own = await threads.get_thread(self.db, caller.thread_id)
            return ModeCap(own.runtime_mode, own.interaction_mode)
        return None

    # --- projects ---------------------------------------------------------------------------

    async def project_add(self, caller: Caller, req: c.ProjectAdd) -> c.Project:
        del caller
        path = Path(req.path).expanduser()
        if not path.is_absolute():
            raise InvalidRequest(f"Project path {req.path!r} must be absolute (the CLI resolves it for you).")
        if not path.is_dir():
            raise InvalidRequest(f"{path} is not a directory.")
        top = await git.toplevel(path)
        key = await git.repository_key(top)
        return await projects.add(
            self.db, name=req.name or top.name, path=str(top), repository_key=key, now=self.clock()
        )

    async def _fresh_key(self, project: c.Project) -> c.Project:
        """A project's repository key, recomputed when missing, never served stale-blank."""
        if project.repository_key is not None:
            return project
        try:
            key = await git.repository_key(Path(project.path))
        except Exception as exc:  # a moved or broken checkout must not break listing
            log.warning("project.key_unavailable", project_id=project.id, error=str(exc))
            return project
        if key is None:
            return project
        await projects.set_repository_key(self.db, project.id, key)
        return project.model_copy(update={"repository_key": key})

    async def project_list(self, caller: Caller, req: c.ProjectList) -> c.Page[c.Project]:
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            data = await self._forward(caller, env, "GET", "/v1/projects", params=Forwarder.query(req))
            return c.Page[c.Project].model_validate(data)
        page = await projects.page(self.db, cursor=req.cursor, limit=req.limit)
        fresh = await asyncio.gather(*(self._fresh_key(p) for p in page.items))
        return c.Page[c.Project](items=list(fresh), next_cursor=page.next_cursor)

    async def project_show(self, caller: Caller, project_id: str) -> c.Project:
        del caller
        return await self._fresh_key(await projects.get(self.db, project_id))

    async def project_remove(self, caller: Caller, project_id: str) -> c.Project:
        del caller
        project = await projects.get(self.db, project_id)
        gone = await projects.thread_ids_of_project(self.db, project.id)
        removed = await projects.remove(self.db, project.id)
        for thread_id in gone:  # their threads went with it: long-polls and followers learn now
            self.feed.changed(thread_id)
        return removed

    # --- threads ----------------------------------------------------------------------------

    async def thread_launch(self, caller: Caller, req: c.ThreadLaunch) -> c.ThreadLaunchResult:
        if req.environment_id == "auto" and self.placement is not None:
            return await self._launch_placed(caller, req, self.placement)
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            cap = await self._cap_of(caller)
            if cap is not None:  # explicit modes are checked here first; omitted ones are the box's call
                resolve_modes(cap, req.runtime_mode, req.interaction_mode)
            if req.in_place:
                raise CapabilityDenied("A launch in a linked environment gets its own worktree there.")
            body = Forwarder.launch_body(
                req.model_copy(update={"delegated_from": None}), namespace=caller.namespace
            )
            launched = c.ThreadLaunchResult.model_validate(
                await self._forward(caller, env, "POST", "/v1/threads", body=body)
            )
            # Where it lives, so `peerd thread show ID` here follows it there (thread_homes.py).
            await thread_homes.record(self.db, launched.thread_id, env, "launched", self.clock())
            return launched
        project = await projects.get(self.db, req.project_id)
        body = req.model_dump(mode="json", exclude={"client_request_id", "environment_id"})
        body["project_id"] = project.id  # a name and an id for one project are the same request
        runtime_mode = req.runtime_mode or DEFAULT_RUNTIME_MODE
        interaction_mode = req.interaction_mode or DEFAULT_INTERACTION_MODE
        if caller.link is not None:
            require_write(caller.link.access, "launch threads")
            if not self.link_may_use(req.provider):
                raise CapabilityDenied(
                    f"This machine's owner does not let linked machines use provider {req.provider!r} "
                    "(links.providers in its config.toml); ask them, or name another provider."
                )
            if req.in_place:
                raise CapabilityDenied(
                    "Work started through a link gets its own worktree; it cannot work in the checkout itself."
                )
        if req.provider not in self.runs.providers() or not self.provider_installed(req.provider):
            # Only a refusal lists what is installed (one PATH search per provider, not per launch).
            installed = [name for name in self.runs.providers() if self.provider_installed(name)]
            if req.provider not in self.runs.providers():
                raise InvalidRequest(
                    f"Unknown provider {req.provider!r}; installed here: {', '.join(installed)}."
                )
            raise ProviderUnavailable(
                f"Provider {req.provider!r} is not installed here (its binary is not on the daemon's PATH); "
                f"installed here: {', '.join(installed)}. `peerd provider list` shows what is found."
            )
        cap = await self._cap_of(caller)
        if cap is not None:
            # Omitted modes take the caller's cap (a link's level narrowed by the caller's limit, or
            # an agent's own modes); explicit ones must fit under it. Modes only ever narrow.
            runtime_mode, interaction_mode = resolve_modes(cap, req.runtime_mode, req.interaction_mode)
        spec = threads.NewThread(
            project_id=project.id,
            title=req.title or _title_from(req.prompt),
            provider=req.provider,
            model=req.model,
            runtime_mode=runtime_mode,
            interaction_mode=interaction_mode,
            in_place=req.in_place,
            worktree_path=project.path if req.in_place else str(self.worktrees_dir / project.id / "{thread}"),
            branch=None if req.in_place else (req.branch or "peerd/{thread}"),
            base_commit=None if req.in_place else req.base_commit,
            link_origin=None if caller.link is None else caller.link.client_id,
            link_label=None if caller.link is None else caller.link.label,
            # Lineage is recorded only for launches that came over a link (what the laptop claims,
            # shown as such); an agent's own claim is never recorded.
            delegated_from=req.delegated_from.wire() if caller.via_network and req.delegated_from else None,
            started_by=started_by(caller),
        )
        key = threads.Idempotency(
            caller.namespace, req.client_request_id, request_hash("thread_launch", body)
        )
        repo = Path(project.path)

        async def branch_exists(branch: str) -> bool:
            return await git.branch_exists(repo, branch)

        result, replayed = await threads.launch(
            self.db,
            key=key,
            spec=spec,
            prompt=req.prompt,
            now=self.clock(),
            branch_exists=branch_exists,
            admit=self._ceiling_for(caller),
        )
        thread_id, run_id = result["threadId"], result["runId"]
        if not replayed:
            if req.budget is not None:
                await usage_store.set_run_budget(self.db, run_id, req.budget.rule())
            await self.runs.kick(thread_id)
        thread = await threads.get_thread(self.db, thread_id)
        run = await threads.get_run(self.db, run_id)
        return c.ThreadLaunchResult(
            thread_id=thread.id,
            project_id=thread.project_id,
            run_id=run.id,
            status=run.status,
            provider=thread.provider,
            model=thread.model,
            runtime_mode=thread.runtime_mode,
            interaction_mode=thread.interaction_mode,
            worktree_path=thread.worktree_path,
            replayed=replayed,
        )

    async def _launch_placed(
        self, caller: Caller, req: c.ThreadLaunch, placement: Placer
    ) -> c.ThreadLaunchResult:
        """environmentId "auto": placed here or on a linked box (peerd/placement/); the choice is
        kept under the request's key first, so a retry lands where the first try went."""
        return await self.launch_placed(caller, await self.place(caller, req, placement))

    async def place(self, caller: Caller, req: c.ThreadLaunch, placement: Placer) -> PlacedLaunch:
        """Where an `auto` launch goes (kept under its key: a retry is placed the same), not yet sent."""
        project = await projects.get(self.db, req.project_id)
        key = None if req.client_request_id is None else f"launch:{caller.namespace}:{req.client_request_id}"
        placed = await placement.for_project(
            project, req.provider, req.runtime_mode, via_link=caller.link is not None, key=key
        )
        update = {"environment_id": placed.environment_id, "project_id": placed.project_id}
        return PlacedLaunch(req.model_copy(update=update), placed, key, placement)

    async def launch_placed(self, caller: Caller, placed: PlacedLaunch) -> c.ThreadLaunchResult:
        """The launch `place` placed: here, or forwarded to the box it chose."""
        launched = await self.thread_launch(caller, placed.req)
        await placed.placement.kept(placed.key, placed.placed, thread_id=launched.thread_id)
        return launched.model_copy(update={"placement": placed.placed})

    def _ceiling_for(self, caller: Caller) -> threads.Admit | None:
        """A link's new run must fit under the owner's per-link ceilings (peerd/core/usage.py),
        checked in the run's own transaction, after a retry of it was answered."""
        ceiling = self.runs.links
        link = caller.link
        if link is None or (ceiling.max_runs is None and ceiling.max_usd_per_day is None):
            return None

        async def admit(tx: Tx) -> None:
            runs, usd = await usage_store.link_spend_in(tx, link.client_id, self.clock() - DAY_S)
            why = ceiling_refusal(
                max_runs=ceiling.max_runs, max_usd=ceiling.max_usd_per_day, runs=runs, usd=usd
            )
            if why is not None:
                raise CapabilityDenied(why)

        return admit

    async def thread_list(self, caller: Caller, req: c.ThreadList) -> c.Page[c.Thread]:
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            data = await self._forward(caller, env, "GET", "/v1/threads", params=Forwarder.query(req))
            return c.Page[c.Thread].model_validate(data)
        project_id = None if req.project_id is None else (await projects.get(self.db, req.project_id)).id
        return await threads.page(
            self.db,
            project_id=project_id,
            include_archived=req.include_archived,
            cursor=req.cursor,
            limit=req.limit,
            link_origin=caller.link.client_id
            if caller.link is not None and caller.link.own_threads_only
            else None,
            newest_first=req.order == "newest",
        )

    async def task_list_elsewhere(self, caller: Caller, req: c.TaskList) -> c.Page[c.TaskInfo] | None:
        """`GET /v1/tasks` for a linked environment (`environmentId`): that box's tasks as it shows
        them to this machine's link; None when the list is this machine's own. A signed-in agent
        (`own_threads_only`) lists only the tasks of a thread it started: it names the thread, and
        any other is answered as not found (the fence of `_read_fence`)."""
        link = caller.link
        if link is not None and link.own_threads_only:
            if req.thread_id is None:
                raise InvalidRequest(
                    "A signed-in agent lists the tasks of one of its threads: give threadId."
                )
            _read_fence(caller, await threads.get_thread(self.db, req.thread_id))
        if (env := await self.remote_target(caller, req.environment_id)) is None:
            return None
        data = await self._forward(caller, env, "GET", "/v1/tasks", params=Forwarder.query(req))
        return c.Page[c.TaskInfo].model_validate(data)

    async def thread_show(
        self, caller: Caller, thread_id: str, environment_id: str | None = None
    ) -> c.Thread:
        if (env := await self.remote_target(caller, environment_id)) is not None:
            there = c.Thread.model_validate(
                await self._forward(caller, env, "GET", f"/v1/threads/{path_segment(thread_id)}")
            )
            placed = None if self.placement is None else await self.placement.reason_for_thread(thread_id)
            return there if placed is None else there.model_copy(update={"placement": placed})
        thread_id = await self.thread_ref(caller, thread_id)
        thread = _read_fence(caller, await threads.get_thread(self.db, thread_id))
        spent: dict[str, Any] = {
            "usage": await usage_store.thread_total(self.db, thread_id),
            "run_usage": await usage_store.run_usages(self.db, thread_id),
        }
        if self.placement is not None:  # why `auto` put it here (the remote path: on the box's)
            spent["placement"] = await self.placement.reason_for_thread(thread_id)
        return thread.model_copy(update=spent)

    async def thread_diff(
        self, caller: Caller, thread_id: str, environment_id: str | None = None
    ) -> c.ThreadDiff:
        """What the thread changed, committed and not, file by file (`ThreadDiff`). A link sees
        only the diff of a thread it started (anything else is answered as not found: file
        contents are more than a read); git runs with the recorded git dir (no repository hooks)."""
        if (env := await self.remote_target(caller, environment_id)) is not None:
            path = f"/v1/threads/{path_segment(thread_id)}/diff"
            return c.ThreadDiff.model_validate(await self._forward(caller, env, "GET", path))
        thread_id = await self.thread_ref(caller, thread_id)
        thread = await threads.get_thread(self.db, thread_id)
        if caller.link is not None and thread.link_origin != caller.link.client_id:
            raise ThreadNotFound(f"Thread {thread_id} was not found.")
        project = await projects.get(self.db, thread.project_id)
        repo, worktree = Path(project.path), Path(thread.worktree_path)
        if thread.in_place:
            where: git.Where = await git.checkout_location(repo)
            base = "HEAD"
        else:
            if not worktree.is_dir():
                gone = (
                    "moved"
                    if thread.status == "moved"
                    else "archived"
                    if thread.status == "archived"
                    else "gone"
                )
                raise Conflict(f"Thread {thread_id} has no worktree here ({gone}): there is no diff to show.")
            where = await git.locate_worktree(repo, worktree)
            base = thread.base_commit or await self._fork_point(repo, where)
        head = await git.head_commit(where)
        files, more = diffparse.split(await git.diff(where, base))
        return c.ThreadDiff(
            thread_id=thread_id,
            base=base,
            head=head,
            files=[c.DiffFile.model_validate(vars(f)) for f in files],
            added=sum(f.added for f in files),
            removed=sum(f.removed for f in files),
            truncated=more,
        )

    async def _fork_point(self, repo: Path, where: git.Where) -> str:
        """Where a worktree's branch left the checkout's (its base when none was recorded)."""
        checkout = await git.head_commit(await git.checkout_location(repo))
        mine = await git.head_commit(where)
        if checkout is None or mine is None:
            return "HEAD"
        return await git.merge_base(where, mine, checkout) or "HEAD"

    async def thread_read(self, caller: Caller, thread_id: str, req: c.ThreadRead) -> c.ThreadReadResult:
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            data = await self._forward(
                caller,
                env,
                "GET",
                f"/v1/threads/{path_segment(thread_id)}/items",
                params=Forwarder.query(req),
            )
            return c.ThreadReadResult.model_validate(data)
        thread_id = await self.thread_ref(caller, thread_id)
        thread = _read_fence(caller, await threads.get_thread(self.db, thread_id))
        if req.item_id is not None:
            row = await threads.get_item(self.db, thread_id, req.item_id)
            item = threads.item_from_row(row, text_offset=req.text_offset, max_chars=req.max_chars_per_item)
            return c.ThreadReadResult(thread=thread, items=[item], has_more=False, next_position=None)
        if req.run_id is not None:
            run = await threads.get_run(self.db, req.run_id)
            if run.thread_id != thread_id:
                raise RunNotFound(f"Run {req.run_id} is not in thread {thread_id}.")
        rows = await threads.read_items(
            self.db, thread_id, after_position=req.after_position, limit=req.limit, run_id=req.run_id
        )
        more = len(rows) > req.limit
        rows = rows[: req.limit]
        items = [threads.item_from_row(r, max_chars=req.max_chars_per_item) for r in rows]
        next_position = items[-1].position if more else None
        return c.ThreadReadResult(thread=thread, items=items, has_more=more, next_position=next_position)

    async def thread_send(self, caller: Caller, thread_id: str, req: c.ThreadSend) -> c.ThreadSendResult:
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            body = Forwarder.send_body(req, namespace=caller.namespace)
            data = await self._forward(
                caller, env, "POST", f"/v1/threads/{path_segment(thread_id)}/runs", body=body
            )
            return c.ThreadSendResult.model_validate(data)
        thread_id = await self.thread_ref(caller, thread_id)
        _fence(
            caller, await threads.get_thread(self.db, thread_id), "send messages", await self._cap_of(caller)
        )
        if self.before_send is not None:
            await self.before_send(thread_id)
        body = req.model_dump(mode="json", exclude={"client_request_id", "environment_id"})
        key = threads.Idempotency(caller.namespace, req.client_request_id, request_hash("thread_send", body))
        result, replayed = await threads.send(
            self.db,
            key=key,
            thread_id=thread_id,
            text=req.text,
            now=self.clock(),
            admit=self._ceiling_for(caller),
        )
        if not replayed:
            if req.budget is not None:
                await usage_store.set_run_budget(self.db, result["runId"], req.budget.rule())
            self.feed.changed(thread_id)  # the queued run is an event even when nothing starts
            await self.runs.kick(thread_id)
        run = await threads.get_run(self.db, result["runId"])
        thread = await threads.get_thread(self.db, thread_id)
        return c.ThreadSendResult(
            thread_id=thread_id,
            run_id=run.id,
            status=run.status,
            queue_held=thread.queue_held,
            replayed=replayed,
        )

    async def thread_wait(self, caller: Caller, thread_id: str, req: c.ThreadWait) -> c.ThreadWaitResult:
        """Return when the run is terminal or after `timeout` seconds (at most 50: a long-poll)."""
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            params = Forwarder.query(req, rename={"runId": "run"})
            data = await self._forward(
                caller, env, "GET", f"/v1/threads/{path_segment(thread_id)}/wait", params=params
            )
            waited = c.ThreadWaitResult.model_validate(data)
            if waited.awaiting_approval is not None:  # the box's own question: say which box
                asked = waited.awaiting_approval.model_copy(update={"environment_id": env})
                waited = waited.model_copy(update={"awaiting_approval": asked})
            return waited
        thread_id = await self.thread_ref(caller, thread_id)
        _read_fence(caller, await threads.get_thread(self.db, thread_id))
        deadline = self.feed.deadline(req.timeout)
        while True:
            changed = self.feed.watch(thread_id)
            run = await self._run_to_wait_on(thread_id, req.run_id)
            if run is not None and is_terminal(run.status):
                return c.ThreadWaitResult(
                    thread_id=thread_id, run_id=run.id, status=run.status, terminal=True, timed_out=False
                )
            remaining = self.feed.remaining(deadline)
            if remaining <= 0 or self.feed.closed:
                question: c.TaskApproval | None = None
                if run is not None and self.awaiting_approval is not None:
                    question = await self.awaiting_approval(thread_id)
                return c.ThreadWaitResult(
                    thread_id=thread_id,
                    run_id=None if run is None else run.id,
                    status=None if run is None else run.status,
                    terminal=False,
                    timed_out=True,
                    awaiting_approval=question,
                )
            await self.feed.wait(changed, remaining)

    async def _run_to_wait_on(self, thread_id: str, run_id: str | None) -> c.Run | None:
        if run_id is None:
            await threads.get_thread(self.db, thread_id)  # thread_not_found before anything else
            return await threads.latest_run(self.db, thread_id)
        run = await threads.get_run(self.db, run_id)
        if run.thread_id != thread_id:
            raise RunNotFound(f"Run {run_id} is not in thread {thread_id}.")
        return run

    async def thread_interrupt(
        self, caller: Caller, thread_id: str, req: c.ThreadInterrupt
    ) -> c.ThreadInterruptResult:
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            body = Forwarder.body(req)
            path = f"/v1/threads/{path_segment(thread_id)}/interrupt"
            data = await self._forward(caller, env, "POST", path, body=body)
            return c.ThreadInterruptResult.model_validate(data)
        thread_id = await self.thread_ref(caller, thread_id)
        thread = await threads.get_thread(self.db, thread_id)
        _fence(caller, thread, "interrupt threads", await self._cap_of(caller))
        if req.run_id is not None:
            if req.stop:
                raise InvalidRequest(
                    "A stop ends all of the thread's work; name a run (runId) only to interrupt or cancel that one."
                )
            if (await threads.get_run(self.db, req.run_id)).thread_id != thread_id:
                raise RunNotFound(f"Run {req.run_id} is not in thread {thread_id}.")
        run_id, outcome, held = await self.runs.interrupt(
            thread_id, stop=req.stop, reason=req.reason, run_id=req.run_id
        )
        if req.stop:
            await self._events.publish(ThreadStopped(thread_id, req.reason))
        return c.ThreadInterruptResult(thread_id=thread_id, run_id=run_id, status=outcome, queue_held=held)

    async def _check_branch_owner(self, client_id: str, thread: c.Thread, branch: str) -> None:
        """A link deletes only a branch the ownership ledger gives to it (`core/ownership.py`)."""
        ref = f"refs/heads/{branch}"
        right, whose = await ownership.right_to(
            self.db, thread.project_id, ref, caller=Owner.link(client_id), exists=True
        )
        if right != "own":
            raise NotYours(
                f"Branch {branch} belongs to {whose.describe() if whose else 'nobody'} here, not to this "
                "link: archive the thread without deleting its branch."
            )

    async def _forget_thread_state(self, thread: c.Thread, *, worktree: bool, branch: str | None) -> None:
        """The ledger forgets what the thread's owner removed: its worktree, its deleted branch."""
        owner = owner_of_thread(thread.link_origin, thread.started_by)
        async with self.db.write() as tx:
            if worktree:
                await ownership.forget(tx, thread.project_id, "worktree", thread.worktree_path, owner=owner)
            if branch is not None:
                await ownership.forget(tx, thread.project_id, "ref", f"refs/heads/{branch}", owner=owner)

    async def thread_archive(
        self, caller: Caller, thread_id: str, req: c.ThreadArchive | None = None
    ) -> c.ThreadArchiveResult:
        if req is not None and (env := await self.remote_target(caller, req.environment_id)) is not None:
            path = f"/v1/threads/{path_segment(thread_id)}/archive"
            data = await self._forward(caller, env, "POST", path, body=Forwarder.body(req))
            return c.ThreadArchiveResult.model_validate(data)
        thread_id = await self.thread_ref(caller, thread_id)
        force = req is not None and req.force
        thread = await threads.get_thread(self.db, thread_id)
        branch = thread.branch if req is not None and req.delete_branch and not thread.in_place else None
        _fence(caller, thread, "archive threads", await self._cap_of(caller))
        if branch is not None and caller.link is not None:
            await self._check_branch_owner(caller.link.client_id, thread, branch)
        if thread.latest_run is not None and is_live(thread.latest_run.status):
            raise Conflict(
                f"Thread {thread_id} has a live run; stop it first"
                f" (`peerd thread interrupt {thread_id} --stop`)."
            )
        removed, discarded = False, []
        if not thread.in_place and thread.status != "archived":
            project = await projects.get(self.db, thread.project_id)
            repo, worktree = Path(project.path), Path(thread.worktree_path)
            if worktree.is_dir():
                # The worktree goes; its uncommitted and untracked files with it, so only on request.
                where = await git.locate_worktree(repo, worktree)
                discarded = [line[3:] for line in await git.status_porcelain(where)]
                if discarded and not force:
                    raise WorktreeDirty(
                        f"Thread {thread_id}'s worktree has {len(discarded)} uncommitted or untracked "
                        f"file(s) that archiving would delete: {_listed(discarded)}. Commit or copy them, "
                        "or archive with --force to discard them."
                    )
            # The branch is kept unless asked for: it may hold commits the user still wants.
            await git.remove_worktree(repo, worktree, delete_branch=branch)
            removed = True
        elif branch is not None:  # archived before: only its branch is left to delete
            project = await projects.get(self.db, thread.project_id)
            await git.remove_worktree(Path(project.path), Path(thread.worktree_path), delete_branch=branch)
        if removed or branch is not None:
            await self._forget_thread_state(thread, worktree=removed, branch=branch)
        if thread.status != "archived":
            await threads.archive(self.db, thread_id, now=self.clock())
            self.feed.changed(thread_id)
            await self._events.publish(ThreadArchived(thread_id))  # its waits end
        return c.ThreadArchiveResult(
            thread_id=thread_id,
            status="archived",
            worktree_removed=removed,
            branch_deleted=branch is not None,
            discarded=discarded,
        )

    async def stop_link_work(self, client_id: str, label: str) -> list[str]:
        """A revoked link's work ends with it: every thread it started that has a live or queued
        run is stopped (interrupted, its queue held, its own delegations stopped too)."""
        reason = f"The link {label!r} that started this thread was revoked here."
        stopped = await threads.busy_threads_of_link(self.db, client_id)
        for thread_id in stopped:
            await self.runs.interrupt(thread_id, stop=True, reason=reason)
            await self._events.publish(ThreadStopped(thread_id, reason))
        log.warning("link.revoked_work_stopped", client_id=client_id, label=label, threads=stopped)
        return stopped

    async def thread_events(self, caller: Caller, thread_id: str, req: c.EventsRead) -> c.EventsResult:
        """Events after a cursor; with a timeout, a long-poll that returns as soon as one arrives."""
        if (env := await self.remote_target(caller, req.environment_id)) is not None:
            data = await self._forward(
                caller,
                env,
                "GET",
                f"/v1/threads/{path_segment(thread_id)}/events",
                params=Forwarder.query(req),
            )
            return c.EventsResult.model_validate(data)
        thread_id = await self.thread_ref(caller, thread_id)
        _read_fence(caller, await threads.get_thread(self.db, thread_id))
        deadline = self.feed.deadline(req.timeout)
        while True:
            changed = self.feed.watch(thread_id)
            events = await threads.events_after(self.db, thread_id, after=req.after, limit=req.limit)
            remaining = self.feed.remaining(deadline)
            if events or remaining <= 0 or self.feed.closed:
                cursor = events[-1].seq if events else req.after
                return c.EventsResult(events=events, next_cursor=cursor)
            await self.feed.wait(changed, remaining)


def _listed(paths: list[str], most: int = 10) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def started_by(caller: Caller) -> str:
    """Who a launch came from, as recorded on the thread (see `c.Thread.started_by`)."""
    if caller.started_by is not None:
        return caller.started_by
    if caller.run_id is not None:
        return f"run:{caller.run_id}"
    if caller.via_network and caller.link is not None:
        return f"link:{caller.link.client_id}"
    if caller.namespace.startswith(("orchestrate:", "task:")):
        return caller.namespace
    if caller.namespace == "local":
        return "owner"
    return caller.namespace


_FENCED = re.compile(r"```.*?(```|\Z)", re.DOTALL)


def _title_from(prompt: str) -> str:
    """The first line of prose: fenced blocks (scripts, code) make poor titles."""
    prose = _FENCED.sub("", prompt)
    first = next((line.strip() for line in prose.splitlines() if clean_label(line)), "Untitled")
    return clean_label(first)[:80] or "Untitled"
