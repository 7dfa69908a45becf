"""`peerd pair`, `peerd link`, `peerd environment ...` and `peerd client ...` as real subprocesses.

Two daemons ("laptop" and "box") run in this test's event loop with real TLS listeners on
loopback; every CLI call goes through `asyncio.to_thread` so the loop keeps serving them. Calls
whose order does not matter run concurrently: each one costs an interpreter start.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from peerd.api.localclient import LocalClient
from peerd.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from peerd.core import pairing_code
from peerd.daemon import Daemon
from peerd.errors import CapabilityDenied
from peerd.peer.client import REVOKED_MESSAGE
from tests.helpers import client_for, running_daemon

pytestmark = pytest.mark.slow  # two daemons

CLI_TIMEOUT_S = 60.0


async def peerd(daemon: Daemon, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(daemon.paths.home), *args]

    def run() -> subprocess.CompletedProcess[str]:
        # `input` is always given, so stdin is a pipe that closes: nothing waits on a terminal.
        return subprocess.run(
            argv, input=stdin or "", capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )

    return await asyncio.to_thread(run)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_OK, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


def rows(table: str) -> list[list[str]]:
    """A printed table's data rows, split on runs of two or more spaces (cells may hold one)."""
    lines = table.splitlines()
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]


def field(text: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}\s+(.*)$", text, re.MULTILINE)
    assert match, f"no {name!r} in:\n{text}"
    return match.group(1)


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Daemon, Daemon, LocalClient, LocalClient]]:
    async with (
        running_daemon(tmp_path / "laptop", label="laptop") as laptop,
        running_daemon(tmp_path / "box", label="box") as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        yield laptop, box, lc, bc


async def test_pair_link_list_revoke_unlink_through_the_cli(
    two: tuple[Daemon, Daemon, LocalClient, LocalClient],
) -> None:
    laptop, box, lc, bc = two
    assert box.identity is not None and laptop.peers is not None
    box_id, box_url = box.identity.env_id, box.advertised_urls()[0]

    # --- the box mints codes; usage and code errors --------------------------------------------
    text, as_json, bad_ttl, bad_code = await asyncio.gather(
        peerd(box, "pair", "--access", "auto"),
        peerd(box, "pair", "--json", "--label-hint", "tablet"),
        peerd(box, "pair", "--ttl", "10x"),
        peerd(laptop, "link", "peerd-pair:this-is-not-a-code"),
    )
    printed = ok(text).splitlines()
    assert len(printed) == 1 and printed[0].startswith("peerd-pair:"), text.stdout
    code = pairing_code.decode(printed[0])
    assert (code.env_id, code.access, code.urls) == (box_id, "auto", (box_url,))
    assert "Single use" in text.stderr and "access up to auto" in text.stderr
    assert box_url in text.stderr and "peerd link -" in text.stderr
    assert "peerd-pair:" not in text.stderr

    minted = json.loads(ok(as_json))
    other = pairing_code.decode(minted["code"])
    assert minted["info"]["id"] == other.code_id
    assert (minted["info"]["labelHint"], minted["info"]["state"]) == ("tablet", "open")
    assert minted["urls"] == [box_url]

    assert bad_ttl.returncode == EXIT_USAGE, bad_ttl.stderr
    assert "Usage:" in bad_ttl.stderr and "'10x' is not a duration" in bad_ttl.stderr

    assert bad_code.returncode == EXIT_ERROR, bad_code.stderr
    assert bad_code.stderr.startswith("error: invalid_request: The pairing code is damaged"), bad_code.stderr
    assert bad_code.stdout == ""

    # --- list the codes (never a secret) and cancel one ----------------------------------------
    listed, cancelled = await asyncio.gather(
        peerd(box, "pair", "list"), peerd(box, "pair", "cancel", other.code_id)
    )
    mine = [r for r in rows(ok(listed)) if r[0] == code.code_id]
    assert mine and mine[0][1:3] == ["auto", "open"], listed.stdout
    for secret in (code.secret, other.secret):
        assert secret not in listed.stdout + listed.stderr
    assert ok(cancelled).strip() == f"cancelled pairing code {other.code_id}"
    states = {x["id"]: x["state"] for x in (await bc.call("GET", "/v1/pair", params={"all": True}))["items"]}
    assert states == {code.code_id: "open", other.code_id: "cancelled"}

    # --- the laptop links with the code on stdin ------------------------------------------------
    linked = ok(await peerd(laptop, "link", "-", "--access", "auto", stdin=printed[0] + "\n"))
    assert linked.strip() == f"linked box ({box_id}) with auto access at {box_url}"
    await laptop.peers.call(box_id, "GET", "/v1/projects")  # the box now has seen the laptop

    # --- both sides list the link ---------------------------------------------------------------
    env_text, env_json, shown, clients_text, clients_json = await asyncio.gather(
        peerd(laptop, "environment", "list"),
        peerd(laptop, "environment", "list", "--json"),
        peerd(laptop, "environment", "show", "box"),
        peerd(box, "client", "list"),
        peerd(box, "client", "list", "--json"),
    )
    assert ok(env_text).splitlines()[0].split()[:5] == ["ID", "LABEL", "ADDRESSES", "ACCESS", "STATUS"]
    assert [r[:5] for r in rows(env_text.stdout)] == [[box_id, "box", box_url, "auto", "reachable"]]
    envs = json.loads(ok(env_json))
    assert [(e["environmentId"], e["label"], e["access"], e["status"], e["urls"]) for e in envs] == [
        (box_id, "box", "auto", "reachable", [box_url])
    ]
    assert field(ok(shown), "environment") == box_id
    assert field(shown.stdout, "status") == "reachable"
    assert field(shown.stdout, "addresses") == box_url
    assert field(shown.stdout, "fingerprint") == box.identity.fingerprint_text

    clients = json.loads(ok(clients_json))
    assert [(x["label"], x["access"], x["status"], x["lastAddress"]) for x in clients] == [
        ("laptop", "auto", "active", "127.0.0.1")
    ]
    client_id = clients[0]["id"]
    (row,) = rows(ok(clients_text))
    assert row[:4] == [client_id, "laptop", "auto", "active"] and row[-1] == "127.0.0.1", clients_text.stdout
    # One expiry truth: the box's LAPSES is the moment the laptop shows as "expires if unused".
    assert ok(clients_text).splitlines()[0].split()[-2] == "LAPSES"
    lapses = datetime.fromisoformat(clients[0]["lapsesAt"]).timestamp()
    assert abs(lapses - datetime.fromisoformat(envs[0]["expiresAt"]).timestamp()) < 60, (clients, envs)
    assert " in " in clients_text.stdout.splitlines()[1], clients_text.stdout

    # --- the box revokes; the laptop's next call fails and the list says so -----------------------
    assert ok(await peerd(box, "client", "revoke", client_id)).strip() == f"revoked {client_id} (laptop)"
    with pytest.raises(CapabilityDenied) as err:
        await laptop.peers.call(box_id, "GET", "/v1/projects")
    assert err.value.message == REVOKED_MESSAGE
    (revoked,) = rows(ok(await peerd(laptop, "environment", "list")))
    assert revoked[:5] == [box_id, "box", box_url, "auto", "revoked"]
    assert revoked[-1] == REVOKED_MESSAGE

    # --- unlink forgets it here (the box had already revoked it) ----------------------------------
    unlinked = ok(await peerd(laptop, "environment", "unlink", box_id))
    assert unlinked.startswith("Forgot the link to box; box had already revoked it."), unlinked
    assert (await lc.call("GET", "/v1/environments"))["items"] == []
