"""The peer client and the follower's transport against a box of revision 1, played by a small
pinned TLS server that answers as the previous release does: no `Peerd-Protocol` header, the
change feed's routes `not_found`, the batched `POST /v1/watch` served. (The real previous release
is driven in test_skew.py; this one isolates the rules.)

- A feed call it answers `not_found` is a typed `version_skew`, recorded on the link, and is not
  reported as an answer (`PeerAnswered` ends a follower's backoff: reporting it is the busy loop).
- The follower's transport (`peerd.tasks.watchfeed.FeedTransport`) follows runs there through the
  watch instead.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from peerd.errors import VersionSkew
from peerd.events import Events, PeerAnswered
from peerd.peer.client import PeerClient
from peerd.peer.forwarding import Forwarder
from peerd.peer.identity import Identity, load_or_create_identity
from peerd.store import links
from peerd.store.db import Database
from peerd.tasks.feedwire import CHANGES_PATH, SUBSCRIPTION_PATH
from peerd.tasks.subscription import set_hash
from peerd.tasks.watchfeed import FeedTransport
from tests.helpers import pinned_server


@dataclass
class OldBox:
    identity: Identity
    seen: list[str] = field(default_factory=list)
    watched: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path)
        if request.path == "/.well-known/peerd":
            return web.json_response(
                {
                    "service": "peerd",
                    "envId": self.identity.env_id,
                    "label": "box",
                    "protocolVersion": 1,
                    "version": "0.1.0",
                    "capabilities": ["threads", "links"],
                }
            )
        if request.path == "/v1/watch":
            body = await request.json()
            self.watched.append(body)
            runs = [
                {**ref, "status": "completed", "settled": True, "found": True, "resultRunId": ref["runId"]}
                for ref in body["runs"]
            ]
            return web.json_response({"runs": runs, "timedOut": False})
        return web.json_response({"code": "not_found", "message": "No such endpoint"}, status=404)


@dataclass
class Laptop:
    db: Database
    peers: PeerClient
    box: OldBox
    answers: list[str]


@pytest.fixture
async def laptop(tmp_path: Path) -> AsyncIterator[Laptop]:
    box = OldBox(load_or_create_identity(tmp_path / "box"))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", box.handle)
    db = await Database.open(tmp_path / "peerd.db")
    answers: list[str] = []
    events = Events()
    events.subscribe(PeerAnswered, lambda event: answers.append(event.env_id))
    peers = PeerClient(db, own_env_id="LAPTOP", events=events)
    await peers.start()
    try:
        async with pinned_server(app, box.identity) as url:
            await links.upsert(
                db,
                links.LinkRow(
                    env_id=box.identity.env_id,
                    label="box",
                    urls=(url,),
                    fingerprint=box.identity.fingerprint,
                    access="auto",
                    client_id="cli_x",
                    refresh_token="r",
                    refresh_expires_at=None,
                    access_token="a",
                    access_expires_at=time.time() + 3600,
                    linked_at=time.time(),
                ),
            )
            yield Laptop(db, peers, box, answers)
    finally:
        await peers.close()
        await db.close()


async def test_a_feed_call_an_older_box_lacks_is_version_skew_and_ends_no_backoff(laptop: Laptop) -> None:
    env = laptop.box.identity.env_id
    for path in (SUBSCRIPTION_PATH, CHANGES_PATH):
        with pytest.raises(VersionSkew) as raised:
            await laptop.peers.call(env, "POST", path, body={"timeout": 1})
        assert "update peerd on box" in raised.value.message
    assert laptop.answers.count(env) <= 1, "a version_skew answer was reported as an answer"
    # (the one allowed: the descriptor probe that found the box's address, before any call)
    row = await links.get(laptop.db, env)
    assert (
        row is not None and row.status == "version_skew" and "update peerd on box" in (row.last_error or "")
    )
    peer = laptop.peers.protocol_of(env)
    assert peer is not None and (peer.revision, peer.version) == (1, None)


async def test_the_follower_follows_an_older_box_through_its_watch(laptop: Laptop) -> None:
    env = laptop.box.identity.env_id
    transport = FeedTransport(laptop.db, Forwarder(laptop.peers, own_env_id="LAPTOP"))
    want = ["run_a"]
    answer = await transport.call(env, SUBSCRIPTION_PATH, {"add": want, "setHash": set_hash(want)})
    assert answer == {"inSync": True, "size": 1, "setHash": set_hash(want)}
    assert transport.watching(env)  # it said it is revision 1: the feed is not asked again
    asked = list(laptop.box.seen)
    answer = await transport.call(env, SUBSCRIPTION_PATH, {"reset": True, "setHash": set_hash([])})
    assert answer["inSync"] and answer["size"] == 0 and laptop.box.seen == asked
    # A poll with no open task to ask about waits its timeout out and reports nothing.
    polled = await transport.call(env, CHANGES_PATH, {"timeout": 0})
    assert polled["runs"] == [] and polled["timedOut"] and laptop.box.watched == []
