"""`environment list`/`show` tell the truth now: each box is asked, as the link, when listed.

Two real daemons on loopback (real TLS, real SQLite); the box sits behind a fault proxy so a test
can make it stop answering. Before this, the listing only fetched each box's public descriptor,
so a link the box had revoked stayed `reachable` until some other call happened to reach it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.peer.links import LATE_MESSAGE, LIVE_CHECK_S
from tests.faultproxy import FaultProxy
from tests.helpers import Pair, client_for, free_port, running_daemon
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # two daemons


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[Pair, FaultProxy]]:
    box_port = free_port()
    async with (
        FaultProxy(box_port) as proxy,
        running_daemon(tmp_path / "laptop", label="laptop") as laptop,
        running_daemon(
            tmp_path / "box", label="box", listen=f"127.0.0.1:{box_port}", advertise=(proxy.url,)
        ) as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        pair = Pair(laptop, box, lc, bc)
        await pair.link("auto")
        yield pair, proxy


async def listed(pair: Pair, **params: Any) -> dict[str, Any]:
    items = (await pair.lc.call("GET", "/v1/environments", params=params or None))["items"]
    assert len(items) == 1
    found: dict[str, Any] = items[0]
    return found


async def client_id(pair: Pair) -> str:
    clients = (await pair.bc.call("GET", "/v1/clients"))["items"]
    return str(clients[0]["id"])


async def test_a_revocation_on_the_box_shows_at_the_next_listing(proxied: tuple[Pair, FaultProxy]) -> None:
    pair, _ = proxied
    before = await listed(pair)
    assert (before["status"], before["live"]) == ("reachable", True)

    await pair.bc.call("POST", f"/v1/clients/{await client_id(pair)}/revoke")

    # The stored status is what the laptop last learnt: nothing has told it yet.
    assert (await listed(pair, probe=False))["status"] == "reachable"
    after = await listed(pair)
    assert after["status"] == "revoked"
    shown = await pair.lc.call("GET", f"/v1/environments/{pair.box_id}")
    assert shown["status"] == "revoked"


async def test_show_asks_the_box_too(proxied: tuple[Pair, FaultProxy]) -> None:
    pair, _ = proxied
    await pair.bc.call("POST", f"/v1/clients/{await client_id(pair)}/revoke")
    offline = await pair.lc.call("GET", f"/v1/environments/{pair.box_id}", params={"probe": False})
    assert (offline["status"], offline["live"]) == ("reachable", False)
    shown = await pair.lc.call("GET", f"/v1/environments/{pair.box_id}")
    assert shown["status"] == "revoked"


async def test_a_box_that_is_down_is_unreachable_when_listed(proxied: tuple[Pair, FaultProxy]) -> None:
    pair, proxy = proxied
    await proxy.refuse()
    down = await listed(pair)
    assert (down["status"], down["live"]) == ("unreachable", True)
    await proxy.forward()
    assert (await listed(pair))["status"] == "reachable"


async def test_a_box_that_does_not_answer_costs_the_listing_at_most_the_live_check_time(
    proxied: tuple[Pair, FaultProxy],
) -> None:
    pair, proxy = proxied
    await proxy.black_hole()
    started = time.monotonic()
    late = await listed(pair)
    assert time.monotonic() - started < LIVE_CHECK_S + 1.5
    assert late["live"] is False
    assert late["lastError"] == LATE_MESSAGE
    assert late["status"] == "reachable", "a late box keeps its last known status, said so"
    # The check is not cancelled: when the box answers again, it completes and records the truth.
    await pair.bc.call("POST", f"/v1/clients/{await client_id(pair)}/revoke")
    await proxy.forward()
    await eventually(
        lambda: listed(pair, probe=False),
        what="the late check's answer recorded (revoked)",
        until=lambda link: link["status"] == "revoked",
    )


async def test_the_box_answers_the_link_as_it_sees_it(proxied: tuple[Pair, FaultProxy]) -> None:
    pair, _ = proxied
    seen = await pair.remote("GET", "/v1/link")
    assert seen.pop("capacity")["maxRuns"] == 4  # what the box has room for (peerd/placement/)
    assert seen == {
        "environmentId": pair.box_id,
        "envId": pair.box_id,  # its older name, still sent (deprecated) until protocol 2
        "clientId": await client_id(pair),
        "label": "laptop",
        "access": "auto",
    }


async def cli(pair: Pair, *args: str) -> str:
    argv = [sys.executable, "-m", "peerd", "--home", str(pair.laptop.paths.home), *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, input="", capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done
    return done.stdout


async def test_the_cli_says_which_status_the_box_confirmed(proxied: tuple[Pair, FaultProxy]) -> None:
    pair, _ = proxied
    assert "reachable (last known)" not in await cli(pair, "environment", "list")
    assert "reachable (last known)" in await cli(pair, "environment", "list", "--offline")
    assert "reachable (last known)" in await cli(pair, "environment", "show", "box", "--offline")
    await pair.bc.call("POST", f"/v1/clients/{await client_id(pair)}/revoke")
    shown = await cli(pair, "environment", "show", "box")
    assert "revoked" in shown and "(last known)" not in shown
