"""Rule: a link's outcome (status, last error, last reached) is written only when it changes: a
forwarded call that finds the link as it was writes nothing (it used to cost a transaction per
call), and "last reached" is refreshed at most once a minute. Two real daemons on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.peer import client as peer_client
from tests.helpers import Pair, two_daemons

pytestmark = pytest.mark.slow  # two daemons


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        await p.link("auto")
        yield p


async def test_a_call_that_changes_nothing_writes_no_outcome(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[tuple[str, str | None]] = []
    real = peer_client.links.record_outcome

    async def counted(
        db: Any, env_id: str, *, event: Any, error: str | None, reached_at: float | None
    ) -> bool:
        writes.append((event, error))
        return await real(db, env_id, event=event, error=error, reached_at=reached_at)

    monkeypatch.setattr(peer_client.links, "record_outcome", counted)
    await pair.remote("GET", "/v1/projects")  # reached just now (linking): nothing to record
    for _ in range(5):
        await pair.remote("GET", "/v1/projects")
    assert writes == [], "the link is as it was: nothing written"
    assert pair.laptop.peers is not None
    monkeypatch.setattr(pair.laptop.peers, "_clock", lambda: peer_client.time.time() + 3600)
    await pair.remote("GET", "/v1/projects")
    assert writes == [("answered", None)], "a stale 'last reached' is refreshed, once"
