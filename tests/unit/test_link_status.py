"""A link's status (core/links.py): revoked and expired are final. The rule alone; the store's
UPDATE applying it for every status and answer; two writers racing; and a real call whose answer
arrives after the link was revoked (a box on loopback, plain http)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import get_args

import pytest
from aiohttp import web

from peerd import contracts as c
from peerd.core.links import FINAL, LEADS_TO, LinkEvent, LinkStatus, next_status
from peerd.peer.client import PeerClient
from peerd.store import links
from peerd.store.db import Database

ENV = "BOX"
STATUSES: tuple[LinkStatus, ...] = get_args(LinkStatus)
EVENTS: tuple[LinkEvent, ...] = get_args(LinkEvent)


def row(
    status: LinkStatus = "reachable", *, urls: tuple[str, ...] = ("https://box.invalid:7433",)
) -> links.LinkRow:
    return links.LinkRow(
        env_id=ENV,
        label="box",
        urls=urls,
        fingerprint=b"\x01" * 32,
        access="auto",
        client_id="cli_x",
        refresh_token="r",
        refresh_expires_at=None,
        access_token="a",
        access_expires_at=time.time() + 3600,
        linked_at=1.0,
        last_error="as it was",
        status=status,
    )


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


def test_revoked_and_expired_are_final_and_every_other_status_follows_the_answer() -> None:
    assert set(FINAL) == {"revoked", "expired"}
    assert set(LEADS_TO) == set(EVENTS), "every event leads somewhere"
    for current in STATUSES:
        for event in EVENTS:
            expected = current if current in FINAL else LEADS_TO[event]
            assert next_status(current, event) == expected, (current, event)
    assert next_status("revoked", "answered") == "revoked", "a late answer does not resurrect a link"
    assert next_status("expired", "refused") == "expired", "the first ending stays"
    assert next_status("unreachable", "answered") == "reachable"
    assert next_status("version_skew", "answered") == "reachable", "the box was updated in place"


@pytest.mark.parametrize("current", STATUSES)
async def test_the_store_applies_the_rule_for_every_status_and_answer(
    db: Database, current: LinkStatus
) -> None:
    for event in EVENTS:
        await links.upsert(db, row(current))
        wrote = await links.record_outcome(db, ENV, event=event, error="new", reached_at=5.0)
        stored = await links.get(db, ENV)
        assert stored is not None
        assert stored.status == next_status(current, event), (current, event)
        assert wrote is (current not in FINAL)
        if current in FINAL:  # nothing of an ended link is written: not its error, not its time
            assert (stored.last_error, stored.last_reached_at) == ("as it was", None)


async def test_a_reachable_write_after_revoked_changes_nothing_whichever_writer_goes_first(
    db: Database,
) -> None:
    await links.upsert(db, row("reachable"))
    await links.record_outcome(db, ENV, event="refused", error="revoked there", reached_at=2.0)
    assert not await links.record_outcome(db, ENV, event="answered", error=None, reached_at=3.0)
    stored = await links.get(db, ENV)
    assert stored is not None and (stored.status, stored.last_error) == ("revoked", "revoked there")
    for order in (("refused", "answered"), ("answered", "refused"), ("refused_expired", "answered")):
        await links.upsert(db, row("reachable"))
        await asyncio.gather(
            *(links.record_outcome(db, ENV, event=e, error=e, reached_at=4.0) for e in (*order, "no_answer"))
        )
        stored = await links.get(db, ENV)
        ending = next(e for e in order if e != "answered")
        assert stored is not None and stored.status == LEADS_TO[ending], order


async def test_a_call_answered_after_the_link_was_revoked_leaves_it_revoked(db: Database) -> None:
    """The call reads the link (reachable), the box takes its time; meanwhile a refresh elsewhere
    learns the link was revoked. The call's late 200 must not make the link reachable again."""
    in_call, answer = asyncio.Event(), asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {c.PROTOCOL_HEADER: str(c.WIRE_PROTOCOL)}
        if request.path == "/.well-known/peerd":
            body = {"service": "peerd", "envId": ENV, "label": "box", "protocolVersion": c.PROTOCOL_VERSION,
                    "version": "x", "capabilities": []}  # fmt: skip
            return web.json_response(body, headers=headers)
        in_call.set()
        await answer.wait()
        return web.json_response({"items": []}, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    peers = PeerClient(db, own_env_id="LAPTOP")
    await peers.start()
    try:
        await links.upsert(db, row("reachable", urls=(f"http://127.0.0.1:{port}",)))
        call = asyncio.create_task(peers.call(ENV, "GET", "/v1/projects"))
        await asyncio.wait_for(in_call.wait(), 10)
        await links.record_outcome(db, ENV, event="refused", error="revoked there", reached_at=time.time())
        answer.set()
        assert await asyncio.wait_for(call, 10) == {"items": []}
        stored = await links.get(db, ENV)
        assert stored is not None and (stored.status, stored.last_error) == ("revoked", "revoked there")
    finally:
        await peers.close()
        await runner.cleanup()
