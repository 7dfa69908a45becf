"""Placement (I/O shell): the candidates, their capacity read again when stale, the choice kept.

This environment's own capacity is read here (`capacity.report`, kept for a second); a linked
box's comes with every `GET /v1/link` answer (`environment list/show`, and here) and every change
feed answer (the follower), cached with its age (`store`). Before choosing, reports older than
`max_age` are read again, all at once, each within `refresh_timeout`; a box that does not answer
in time is passed by with its reason (its check finishes in the background and records what it
learns: a check is never cancelled, it may be rotating the link's refresh token); launches placed
at once share one check per box. The rules are
`peerd.placement.rules`.

The reservation ledger (`rules.Ledger`) lives here, in memory: every choice reserves a run on the
chosen environment in the same synchronous step that reads the ledger (no await between choosing
and reserving), so launches placed at once, which all read the same reports, each see the runs
the ones before them reserved. A report read later absorbs them (`rules.held_for`); a restart
forgets them, and the reports then count the runs themselves.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pydantic
import structlog

from peerd import contracts as c
from peerd.config import PlacementConfig
from peerd.errors import PeerdError
from peerd.peer.client import PeerClient
from peerd.placement import rules, store
from peerd.placement.capacity import Readers, report
from peerd.placement.rules import MAX_AGE_S, Candidate, Ledger, Need, is_stale
from peerd.runtime import git
from peerd.store import links
from peerd.store.db import Database

log = structlog.get_logger(__name__)

AUTO = "auto"
REFRESH_TIMEOUT_S = 3.0
OWN_TTL_S = 1.0
# A box's report as the change feed brings it (every answer) is written at most this often per
# box: a write per answer would queue behind, or ahead of, the wake the same answer carries.
FEED_KEEP_EVERY_S = 10.0
OLDER = "reports no capacity (an older peerd)"
VIA_LINK = "work that came in through a link cannot use this environment's links"


class Placement:
    def __init__(
        self,
        db: Database,
        config: PlacementConfig,
        *,
        env_id: str,
        label: str,
        providers: Callable[[], dict[str, bool]],
        readers: Readers,
        peers: PeerClient | None,
        clock: Callable[[], float] = time.time,
        max_age: float = MAX_AGE_S,
        refresh_timeout: float = REFRESH_TIMEOUT_S,
    ) -> None:
        self.db = db
        self.config = config
        self.env_id = env_id
        self.label = label
        self.providers = providers
        self.readers = readers
        self.peers = peers
        self.clock = clock
        self.max_age = max_age
        self.refresh_timeout = refresh_timeout
        self._own: tuple[float, c.Capacity] | None = None
        self._fed: dict[str, float] = {}  # box -> when its feed-borne report was last written
        self.ledger = Ledger()  # the runs just placed, until a report counts them
        self._background: set[asyncio.Future[None]] = set()
        self._checking: dict[str, asyncio.Future[None]] = {}  # box -> its check under way

    # --- what this environment reports -------------------------------------------------------

    async def local_capacity(self) -> c.Capacity:
        now = self.clock()
        if self._own is not None and now - self._own[0] < OWN_TTL_S:
            return self._own[1]
        own = await report(self.db, self.config, self.providers, self.readers)
        self._own = (now, own)
        return own

    # --- what the boxes report -----------------------------------------------------------------

    async def keep(self, env_id: str, capacity: c.Capacity | None) -> None:
        """A box's report, as a link answer or the change feed brought it (None: an older box)."""
        if capacity is None:
            await store.failed(self.db, env_id, OLDER, now=self.clock())
        else:
            await store.save(self.db, env_id, capacity, now=self.clock())

    async def keep_from_feed(self, env_id: str, capacity: c.Capacity) -> None:
        """A report a change-feed answer brought: kept at most every `FEED_KEEP_EVERY_S` per box
        (the age shown stays well inside the bound past which `auto` reads it again)."""
        now = self.clock()
        if now - self._fed.get(env_id, float("-inf")) < FEED_KEEP_EVERY_S:
            return
        self._fed[env_id] = now
        await self.keep(env_id, capacity)

    async def link_answered(self, env_id: str, data: object) -> None:
        """A `GET /v1/link` answer from a box: keep its capacity."""
        try:
            answer = c.LinkSelf.model_validate(data)
        except pydantic.ValidationError:
            await store.failed(
                self.db, env_id, "sent a capacity report this version cannot read", now=self.clock()
            )
            return
        await self.keep(env_id, answer.capacity)

    async def _check(self, env_id: str) -> None:
        assert self.peers is not None  # noqa: S101  # only called with peers
        try:
            data = await self.peers.call(env_id, "GET", "/v1/link")
        except PeerdError as exc:
            await store.failed(self.db, env_id, f"not reachable: {exc.message}", now=self.clock())
            return
        await self.link_answered(env_id, data)

    def _check_once(self, env_id: str) -> asyncio.Future[None]:
        """The check of this box under way, else a new one: launches placed at once with the same
        stale report share one check per box, not one each."""
        running = self._checking.get(env_id)
        if running is None:
            running = self._checking[env_id] = asyncio.ensure_future(self._check(env_id))
            running.add_done_callback(lambda _: self._checking.pop(env_id, None))
        return running

    async def refresh(self, env_ids: list[str]) -> None:
        """Read these boxes' capacity again, in parallel, each within `refresh_timeout`."""
        if not env_ids or self.peers is None:
            return
        checks = {self._check_once(env_id): env_id for env_id in env_ids}
        _, late = await asyncio.wait(checks, timeout=self.refresh_timeout)
        for task in late:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            why = f"not reachable: no answer within {self.refresh_timeout:g} s"
            await store.failed(self.db, checks[task], why, now=self.clock())

    # --- the candidates and the choice --------------------------------------------------------

    async def candidates(self, *, via_link: bool) -> list[Candidate]:
        now = self.clock()
        own = await self.local_capacity()
        read_at = now if self._own is None else self._own[0]  # when it was read (kept for a second)
        here = Candidate(None, self.label, own, seen_at=read_at)
        cached = await store.cached(self.db)
        out = [here]
        for row in await links.all_links(self.db):
            status = row.info(now=now).status
            blocked = None
            if via_link:
                blocked = VIA_LINK
            elif status == "revoked":
                blocked = "the link was revoked there"
            elif status == "expired":
                blocked = "the link has expired; link again"
            seen = cached.get(row.env_id)
            out.append(
                Candidate(
                    row.env_id,
                    row.label,
                    None if seen is None else seen.capacity,
                    seen_at=None if seen is None else seen.seen_at,
                    error=None if seen is None else seen.error,
                    access=row.access,
                    blocked=blocked,
                )
            )
        return out

    async def fresh_candidates(self, *, via_link: bool) -> list[Candidate]:
        now = self.clock()
        found = await self.candidates(via_link=via_link)
        stale = [cand.env_id for cand in found if cand.env_id and is_stale(cand, now, self.max_age)]
        if not stale:
            return found
        await self.refresh(stale)
        return await self.candidates(via_link=via_link)

    async def place(self, need: Need, *, via_link: bool, key: str | None) -> c.Placed:
        """The choice for this request: the one kept for its key, else a new one, kept first."""
        if key is not None and (earlier := await store.recall(self.db, key)) is not None:
            return earlier
        found = await self.fresh_candidates(via_link=via_link)
        # Choose and reserve in one step, with no await between: see the module's docstring.
        placed, self.ledger = rules.place(found, need, self.ledger, self.clock(), self.max_age)
        seq = self.ledger.seq
        log.info("placement.chosen", environment=placed.label, reason=placed.reason)
        if key is None:
            return placed
        kept = await store.record(self.db, key, placed, now=self.clock())
        if (kept.environment_id, kept.project_id, kept.reason) != (
            placed.environment_id,
            placed.project_id,
            placed.reason,
        ):  # a first try racing this one, with the same key, was kept first: it holds its own reservation
            self.ledger = rules.release(self.ledger, seq)
        return kept

    async def for_project(
        self,
        project: c.Project,
        provider: str,
        runtime_mode: c.RuntimeMode | None,
        *,
        via_link: bool,
        key: str | None,
    ) -> c.Placed:
        """Where work in this project (here) with this provider goes: here, or the one project
        with its repository on a linked box."""
        repository = project.repository_key
        if repository is None:
            try:
                repository = await git.repository_key(Path(project.path))
            except PeerdError:
                repository = None
        need = Need(provider, repository, project.id, runtime_mode)
        return await self.place(need, via_link=via_link, key=key)

    async def kept(
        self, key: str | None, placed: c.Placed, *, task_id: str | None = None, thread_id: str | None = None
    ) -> None:
        """The work the choice became (a choice made without a request key is kept now)."""
        if key is None:
            key = f"once:{uuid.uuid4().hex}"
            await store.record(self.db, key, placed, now=self.clock())
        await store.attach(self.db, key, task_id=task_id, thread_id=thread_id)

    async def reason_for_thread(self, thread_id: str) -> str | None:
        return await store.for_thread(self.db, thread_id)

    async def reason_for_task(self, task_id: str) -> str | None:
        return await store.for_task(self.db, task_id)

    # --- peerd fleet ---------------------------------------------------------------------------

    async def fleet(self, req: c.FleetRead) -> c.Fleet:
        now = self.clock()
        found = (
            await self.candidates(via_link=False)
            if req.offline
            else await self.fresh_candidates(via_link=False)
        )
        rows = {row.env_id: row for row in await links.all_links(self.db)}
        envs: list[c.FleetEnvironment] = []
        for cand in found:
            if cand.env_id is None:
                envs.append(
                    c.FleetEnvironment(
                        environment_id=self.env_id,
                        label=cand.label,
                        here=True,
                        status="here",
                        capacity=cand.capacity,
                        age_s=0.0,
                    )
                )
                continue
            row = rows.get(cand.env_id)
            status = row.info(now=now).status if row is not None else "unreachable"
            envs.append(
                c.FleetEnvironment(
                    environment_id=cand.env_id,
                    label=cand.label,
                    here=False,
                    status=status,
                    access=cand.access,
                    capacity=cand.capacity,
                    age_s=None if cand.seen_at is None else max(now - cand.seen_at, 0.0),
                    error=cand.error,
                )
            )
        return c.Fleet(environments=envs)


__all__ = ["AUTO", "Need", "Placement"]
