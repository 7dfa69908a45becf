"""Where a person sees and decides approvals: this machine's, and the linked boxes' for the work
this machine started there.

Over a link (`link` given) the desk shows only what that link's work asks on this machine, and a
decision is the link's (refused when its access is read-only). On the owner socket it shows this
machine's approvals and each linked box's pending ones (asked of each box as the link, in
parallel, briefly; a box not reached shows what the follower's feed last brought, listed in
`stale`), and a decision on a box's approval is sent to that box over the link with a decision id,
so a retry is the same decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import Iterable
from typing import Any

from peerd.approvals import store as approvals_store
from peerd.approvals.rules import OWNER, Decision
from peerd.approvals.service import ANY_KEY, ApprovalService, link_key
from peerd.approvals.wire import (
    MAX_MIRRORED,
    ApprovalDecisionBody,
    ApprovalListQuery,
    ApprovalPage,
    ApprovalView,
)
from peerd.core import shortid
from peerd.core.access import LinkContext
from peerd.core.text import path_segment
from peerd.errors import ApprovalDecided, ApprovalNotFound, PeerdError
from peerd.peer.forwarding import Forwarder
from peerd.store import ids, links
from peerd.store.db import Database

BOX_TIMEOUT_S = 2.0
OWNER_RECHECK_S = 10.0  # an owner's long-poll asks the boxes again at least this often
PATH = "/v1/approvals"


def pending_hash(items: Iterable[ApprovalView]) -> str:
    keys = sorted(f"{v.environment_id or ''}/{v.id}" for v in items if v.status == "pending")
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


class ApprovalDesk:
    def __init__(self, service: ApprovalService, db: Database, forwarder: Forwarder | None) -> None:
        self.service = service
        self.db = db
        self.forwarder = forwarder
        # Each linked box's pending hash as it last answered this machine's link: an owner's
        # long-poll also long-polls each box from it, so a decision there wakes it at once.
        self._box_hashes: dict[str, str] = {}

    # --- list ----------------------------------------------------------------------------------------

    async def listing(self, query: ApprovalListQuery, *, link: LinkContext | None = None) -> ApprovalPage:
        key = ANY_KEY if link is None else link_key(link.client_id)
        deadline = self.service.feed.deadline(query.timeout)
        while True:
            changed = self.service.feed.watch(key)  # before reading: no change slips in between
            page = await self._page(query, link)
            remaining = self.service.feed.remaining(deadline)
            if query.changed_from is None or page.pending_hash != query.changed_from or remaining <= 0:
                return page
            if link is None:
                await self._until_a_change(changed, min(remaining, OWNER_RECHECK_S))
            else:
                await self.service.feed.wait(changed, remaining)
            if self.service.feed.closed:
                return page

    async def _until_a_change(self, changed: asyncio.Event, seconds: float) -> None:
        """Until this machine's approvals change, or a linked box answers that its pending set for
        this machine's work changed (its own long-poll, from the hash it last gave), or `seconds`."""
        if not self._box_hashes:  # no box to hear from: this machine's feed alone
            await self.service.feed.wait(changed, seconds)
            return
        waits = [asyncio.ensure_future(self.service.feed.wait(changed, seconds))]
        waits += [
            asyncio.ensure_future(self._box_changed(env_id, hash_, seconds))
            for env_id, hash_ in self._box_hashes.items()
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _box_changed(self, env_id: str, hash_: str, seconds: float) -> None:
        """Returns when the box's pending set (as this link sees it) is no longer `hash_`; a box
        that cannot be asked never ends the wait early (the recheck asks it again)."""
        if self.forwarder is None:
            await asyncio.sleep(seconds)
            return
        try:
            params = {"changedFrom": hash_, "timeout": seconds}
            data = await self.forwarder.call(env_id, "GET", PATH, params=params)
            if isinstance(data, dict) and data.get("pendingHash") != hash_:
                return
        except PeerdError:
            pass
        await asyncio.sleep(seconds)

    async def _page(self, query: ApprovalListQuery, link: LinkContext | None) -> ApprovalPage:
        origin = None if link is None else link.client_id
        if query.all:
            records = await approvals_store.recent(self.db, limit=query.limit, link_origin=origin)
        else:
            records = await approvals_store.pending(self.db, link_origin=origin)
        items = [ApprovalView.of(r) for r in records]
        if link is not None:
            # The box's own view of a link: who asks is that link; no linked box of ours is shown.
            items = [v.model_copy(update={"link_label": None}) for v in items]
            return ApprovalPage(items=items, pending_hash=pending_hash(items))
        remote, stale = await self._boxes(query)
        items += remote
        return ApprovalPage(items=items, pending_hash=pending_hash(items), stale=stale)

    async def _boxes(self, query: ApprovalListQuery) -> tuple[list[ApprovalView], list[str]]:
        """Each linked box's pending approvals for this machine's work, asked live as the link."""
        known = await links.all_links(self.db)
        self._box_hashes = {env: h for env, h in self._box_hashes.items() if env in {k.env_id for k in known}}
        if not known or self.forwarder is None:
            return [], []
        results = await asyncio.gather(*(self._box(link.env_id, link.label) for link in known))
        items: list[ApprovalView] = []
        stale: list[str] = []
        for (found, live), link in zip(results, known, strict=True):
            items += found
            if not live:
                stale.append(link.label)
        if query.all:
            return items, stale
        return [v for v in items if v.status == "pending"], stale

    async def _box(self, env_id: str, label: str) -> tuple[list[ApprovalView], bool]:
        forwarder = self.forwarder
        if forwarder is None:
            return [], False
        try:
            async with asyncio.timeout(BOX_TIMEOUT_S):
                data = await forwarder.call(env_id, "GET", PATH)
            found = data.get("items", [])
            if not isinstance(found, list) or len(found) > MAX_MIRRORED:
                raise ValueError("a box's answer with more approvals than are taken from it")
            views = [_on_box(ApprovalView.model_validate(v), env_id, label) for v in found]
            if isinstance(data.get("pendingHash"), str):
                self._box_hashes[env_id] = data["pendingHash"]
        except (PeerdError, TimeoutError, ValueError):
            views = [
                _on_box(ApprovalView.model_validate(b), env_id, label)
                for _, b, _ in await self._mirror(env_id)
            ]
            return views, False
        await approvals_store.mirror(
            self.db,
            env_id,
            [v.model_dump(mode="json", by_alias=True) for v in views],
            now=self.service.clock(),
        )
        return views, True

    async def _mirrored_one(self, approval_id: str) -> tuple[str, dict[str, Any]] | None:
        """A box's approval as this machine last saw it; one not seen yet (no list since it was
        asked, say: a wait's hint names it at once) is looked for on the boxes now."""
        found = await approvals_store.mirrored_one(self.db, approval_id)
        if found is None:
            await self._boxes(ApprovalListQuery())  # asks each box live, and keeps what it saw
            found = await approvals_store.mirrored_one(self.db, approval_id)
        return found

    async def _mirror(self, env_id: str) -> list[tuple[str, dict[str, Any], float]]:
        return await approvals_store.mirrored(self.db, env_id)

    # --- one ------------------------------------------------------------------------------------------

    async def _whole(self, given: str, link: LinkContext | None) -> str:
        """The owner's unique start of an approval id (here or mirrored from a box), made whole."""
        if link is not None or not shortid.is_short(given, "ap"):
            return given
        limit = shortid.AMBIGUOUS_SHOWN + 1
        found = await ids.starting(self.db, "approvals", given, limit=limit)
        found += await ids.starting(self.db, "remote_approvals", given, limit=limit)
        return shortid.chosen(given, sorted(set(found)), "approval")

    async def show(self, approval_id: str, *, link: LinkContext | None = None) -> ApprovalView:
        approval_id = await self._whole(approval_id, link)
        record = await approvals_store.get(self.db, approval_id)
        if record is not None and (link is None or record.link_origin == link.client_id):
            return ApprovalView.of(record)
        if link is None and (found := await self._mirrored_one(approval_id)) is not None:
            env_id, body = found
            label = await self._label(env_id)
            with contextlib.suppress(PeerdError, TimeoutError):
                if self.forwarder is not None:
                    async with asyncio.timeout(BOX_TIMEOUT_S):
                        body = await self.forwarder.call(env_id, "GET", f"{PATH}/{path_segment(approval_id)}")
            return _on_box(ApprovalView.model_validate(body), env_id, label)
        raise _not_found(approval_id)

    # --- decide ---------------------------------------------------------------------------------------

    async def decide(
        self, approval_id: str, body: ApprovalDecisionBody, *, link: LinkContext | None = None
    ) -> ApprovalView:
        approval_id = await self._whole(approval_id, link)
        by = OWNER if link is None else f"link:{link.client_id}"
        decision = Decision(body.decision, by, body.scope, body.reason, body.decision_id)
        record = await approvals_store.get(self.db, approval_id)
        if record is not None or link is not None:
            decided = await self.service.decide(
                approval_id,
                decision,
                link_client=None if link is None else link.client_id,
                link_runtime=None if link is None else link.access,
            )
            return ApprovalView.of(decided)
        found = await self._mirrored_one(approval_id)
        if found is None or self.forwarder is None:
            raise _not_found(approval_id)
        env_id, _ = found
        wire = body.model_dump(mode="json", by_alias=True, exclude_none=True)
        wire["decisionId"] = body.decision_id or uuid.uuid4().hex  # the box answers a retry as the first
        try:
            data = await self.forwarder.call(
                env_id, "POST", f"{PATH}/{path_segment(approval_id)}/decision", body=wire
            )
        except (ApprovalDecided, ApprovalNotFound):
            # The box says the question is no longer open there (decided, withdrawn, gone): this
            # machine's copy of it is forgotten, and the person is told why.
            await approvals_store.forget_mirrored(self.db, env_id, approval_id)
            self.service.feed.changed(ANY_KEY)
            raise
        view = _on_box(ApprovalView.model_validate(data), env_id, await self._label(env_id))
        await approvals_store.forget_mirrored(self.db, env_id, approval_id)
        self.service.feed.changed(ANY_KEY)
        return view

    async def _label(self, env_id: str) -> str:
        link = await links.get(self.db, env_id)
        return env_id if link is None else link.label


def _on_box(view: ApprovalView, env_id: str, label: str) -> ApprovalView:
    return view.model_copy(update={"environment_id": env_id, "environment_label": label, "on_box": True})


def _not_found(approval_id: str) -> ApprovalNotFound:
    return ApprovalNotFound(
        f"No approval {approval_id!r} here or on a linked box. `peerd approval list --all` shows the ones you can see."
    )
