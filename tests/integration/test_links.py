"""Pairing and links between two real daemons on loopback, over real TLS."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from peerd.core import pairing_code
from peerd.errors import CapabilityDenied, InvalidRequest, PeerdError
from peerd.peer.client import REVOKED_MESSAGE
from tests.helpers import Pair, make_repo, script, two_daemons, wait_terminal

pytestmark = pytest.mark.slow  # two daemons


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        yield p


def box_code_state(pair: Pair, code_id: str) -> tuple[str, int]:
    with contextlib.closing(sqlite3.connect(pair.box.paths.db)) as db:
        row = db.execute(
            "SELECT state, failed_attempts FROM pairing_codes WHERE id = ?", (code_id,)
        ).fetchone()
    return row[0], row[1]


async def test_link_shows_on_both_sides(pair: Pair) -> None:
    linked = await pair.link("auto")
    assert linked["environmentId"] == pair.box_id
    assert linked["label"] == "box"
    assert linked["access"] == "auto"
    assert linked["status"] == "reachable"

    envs = (await pair.lc.call("GET", "/v1/environments"))["items"]
    assert [(e["environmentId"], e["label"], e["access"], e["status"]) for e in envs] == [
        (pair.box_id, "box", "auto", "reachable")
    ]
    clients = (await pair.bc.call("GET", "/v1/clients"))["items"]
    assert [(c["label"], c["access"], c["status"]) for c in clients] == [("laptop", "auto", "active")]
    # The link works: the laptop reads the box's projects with it.
    assert (await pair.remote("GET", "/v1/projects"))["items"] == []


async def test_a_wrong_fingerprint_is_refused_and_sends_nothing_secret(pair: Pair) -> None:
    code = pairing_code.decode(await pair.code())
    forged = dataclasses.replace(code, fingerprint=bytes(32)).encode()
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": forged, "access": "auto"})
    assert err.value.code == "pin_mismatch"
    assert "nothing was sent" in err.value.message
    # The box never saw the secret: the code is still open and saw no attempt.
    assert box_code_state(pair, code.code_id) == ("open", 0)
    assert (await pair.lc.call("GET", "/v1/environments"))["items"] == []


async def test_a_code_is_single_use(pair: Pair) -> None:
    code = await pair.code()
    await pair.link(code=code)
    with pytest.raises(PeerdError) as err:
        await pair.link(code=code)
    assert err.value.code == "pairing_rejected"
    assert "already used" in err.value.message


async def test_an_expired_code_is_refused(pair: Pair) -> None:
    code = await pair.code(ttlS=0.05)
    await asyncio.sleep(0.1)  # the only event here is time passing
    with pytest.raises(PeerdError) as err:
        await pair.link(code=code)
    assert err.value.code == "pairing_rejected"
    assert "expired" in err.value.message


async def test_five_wrong_attempts_burn_the_code(pair: Pair) -> None:
    code = pairing_code.decode(await pair.code())
    wrong = dataclasses.replace(code, secret=pairing_code.new_secret()).encode()
    for _ in range(5):
        with pytest.raises(PeerdError):
            await pair.link(code=wrong)
    assert box_code_state(pair, code.code_id) == ("burnt", 5)
    with pytest.raises(PeerdError) as err:
        await pair.link(code=code.encode())
    assert err.value.code == "pairing_rejected"
    assert "burnt" in err.value.message


async def test_access_above_the_codes_ceiling_is_refused(pair: Pair) -> None:
    code = await pair.code("auto-accept-edits")
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    assert err.value.code == "access_exceeds_code"
    assert "auto-accept-edits" in err.value.message
    # Refused before anything was sent, so the code is still good for what it allows.
    linked = await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto-accept-edits"})
    assert linked["access"] == "auto-accept-edits"


async def test_linking_to_itself_is_refused(pair: Pair) -> None:
    own = await pair.lc.call("POST", "/v1/pair", body={"access": "auto"})
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": own["code"], "access": "auto"})
    assert err.value.code == "self"


async def test_revoke_on_the_box_fails_the_next_call_with_the_exact_message(pair: Pair) -> None:
    await pair.link("auto")
    await pair.remote("GET", "/v1/projects")
    client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
    await pair.bc.call("POST", f"/v1/clients/{client_id}/revoke")

    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.message == REVOKED_MESSAGE
    env = (await pair.lc.call("GET", "/v1/environments"))["items"][0]
    assert env["status"] == "revoked"
    assert env["lastError"] == REVOKED_MESSAGE
    # Terminal: later calls fail the same way without contacting the box.
    with pytest.raises(CapabilityDenied):
        await pair.remote("GET", "/v1/projects")


async def test_refresh_rotates_and_reuse_revokes_the_link(pair: Pair) -> None:
    await pair.link("auto")
    peers = pair.laptop.peers
    assert peers is not None
    first, _ = await peers.access_token(pair.box_id)
    second, _ = await peers.access_token(pair.box_id, force_refresh=True)
    assert second.refresh_token != first.refresh_token
    await pair.remote("GET", "/v1/projects")  # the rotated pair works

    # Someone replays the rotated-out refresh token: the box revokes the whole link.
    status, body = await peers.post_form(
        second,
        second.urls[0],
        "/oauth/token",
        {"grant_type": "refresh_token", "refresh_token": first.refresh_token},
    )
    assert status == 400
    assert body["error"] == "invalid_grant"
    assert body["peerd_reason"] == "reused"
    with pytest.raises(CapabilityDenied) as err:
        await peers.access_token(pair.box_id, force_refresh=True)
    assert err.value.message == REVOKED_MESSAGE


async def test_two_concurrent_links_end_consistent(pair: Pair) -> None:
    codes = [await pair.code("auto"), await pair.code("auto-accept-edits")]
    results = await asyncio.gather(
        *(
            pair.lc.call("POST", "/v1/links", body={"code": c, "access": a})
            for c, a in zip(codes, ["auto", "auto-accept-edits"], strict=True)
        ),
    )
    assert len(results) == 2
    envs = (await pair.lc.call("GET", "/v1/environments"))["items"]
    assert len(envs) == 1
    # The stored access matches the token stored with it: the box sees that access.
    project_repo = make_repo(pair.box.paths.home.parent / "box-repo")
    await pair.bc.call("POST", "/v1/projects", body={"path": str(project_repo)})
    projects = (await pair.remote("GET", "/v1/projects"))["items"]
    launched = await pair.remote(
        "POST", "/v1/threads", body={"projectId": projects[0]["id"], "prompt": script({"reply": "hi"})}
    )
    assert launched["runtimeMode"] == envs[0]["access"]
    active = [c for c in (await pair.bc.call("GET", "/v1/clients"))["items"] if c["status"] == "active"]
    assert len(active) == 1, "the replaced link's session was revoked at the box"


@pytest.fixture
async def box_project(pair: Pair) -> dict[str, Any]:
    repo = make_repo(pair.box.paths.home.parent / "box-repo")
    project: dict[str, Any] = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    return project


async def test_a_read_only_link_reads_but_cannot_launch(pair: Pair, box_project: dict[str, Any]) -> None:
    await pair.link("read-only")
    assert [p["id"] for p in (await pair.remote("GET", "/v1/projects"))["items"]] == [box_project["id"]]
    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("POST", "/v1/threads", body={"projectId": box_project["id"], "prompt": "hi"})
    assert "read-only" in err.value.message
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []


async def test_runs_are_capped_at_the_link_and_a_caller_limit_only_narrows(
    pair: Pair, box_project: dict[str, Any]
) -> None:
    await pair.link("auto")
    body = {"projectId": box_project["id"], "prompt": script({"reply": "ok"})}
    plain = await pair.remote("POST", "/v1/threads", body=body)
    assert (plain["runtimeMode"], plain["interactionMode"]) == ("auto", "default")

    narrowed = await pair.remote("POST", "/v1/threads", body=body, mode_limit="approval-required/plan")
    assert (narrowed["runtimeMode"], narrowed["interactionMode"]) == ("approval-required", "plan")

    wider_limit = await pair.remote("POST", "/v1/threads", body=body, mode_limit="full-access/default")
    assert wider_limit["runtimeMode"] == "auto", "a wider caller limit never widens the link"

    with pytest.raises(PeerdError) as err:
        await pair.remote("POST", "/v1/threads", body={**body, "runtimeMode": "full-access"})
    assert err.value.code == "runtime_mode_escalation_denied"
    assert "full-access" in err.value.message and "auto" in err.value.message
    with pytest.raises(PeerdError) as err:
        await pair.remote(
            "POST", "/v1/threads", body={**body, "interactionMode": "default"}, mode_limit="auto/plan"
        )
    assert err.value.code == "interaction_mode_escalation_denied"

    done = await wait_terminal(pair.bc, plain["threadId"], plain["runId"])
    assert done["status"] == "completed"
    thread = await pair.bc.call("GET", f"/v1/threads/{plain['threadId']}")
    assert thread["linkLabel"] == "laptop"


async def test_a_link_may_change_only_threads_it_started(pair: Pair, box_project: dict[str, Any]) -> None:
    await pair.link("full-access")
    own = await pair.bc.call(
        "POST", "/v1/threads", body={"projectId": box_project["id"], "prompt": script({"reply": "mine"})}
    )
    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("POST", f"/v1/threads/{own['threadId']}/interrupt", body={"stop": True})
    assert "only threads it started" in err.value.message
    with pytest.raises(CapabilityDenied):
        await pair.remote("POST", f"/v1/threads/{own['threadId']}/runs", body={"text": "hello"})
    # Reads are not fenced.
    assert (await pair.remote("GET", f"/v1/threads/{own['threadId']}"))["id"] == own["threadId"]


async def test_unlink_revokes_there_and_forgets_here(pair: Pair) -> None:
    await pair.link("auto")
    result = await pair.lc.call("DELETE", f"/v1/environments/{pair.box_id}")
    assert result["revokedThere"] is True
    assert (await pair.lc.call("GET", "/v1/environments"))["items"] == []
    clients = (await pair.bc.call("GET", "/v1/clients"))["items"]
    assert [c["status"] for c in clients] == ["revoked"]
    with pytest.raises(InvalidRequest) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.message == (
        f"This environment is not linked to {pair.box_id}. The linked ones are listed by the environment_list "
        "tool (or `peerd environment list`)."
    )


async def test_an_unreachable_box_is_reported_and_transient(pair: Pair, tmp_path: Path) -> None:
    await pair.link("auto")
    await pair.box.shutdown()
    envs = (await pair.lc.call("GET", "/v1/environments"))["items"]
    assert envs[0]["status"] == "unreachable"
    assert envs[0]["lastError"].startswith("box did not answer at https://127.0.0.1:")
    with pytest.raises(PeerdError) as err:
        await pair.remote("GET", "/v1/projects")
    assert err.value.code == "unreachable"


async def test_the_box_db_holds_no_pairing_secret_or_refresh_token(pair: Pair) -> None:
    code = pairing_code.decode(await pair.code())
    await pair.link(code=code.encode())
    peers = pair.laptop.peers
    assert peers is not None
    link, _ = await peers.access_token(pair.box_id)
    with contextlib.closing(sqlite3.connect(pair.box.paths.db)) as db:
        dump = "\n".join(db.iterdump())
    assert code.secret not in dump
    assert link.refresh_token not in dump
    assert oct(pair.box.paths.db.stat().st_mode & 0o777) == "0o600"


async def test_access_above_the_ceiling_is_refused_without_contacting_the_box(pair: Pair) -> None:
    code = await pair.code("auto-accept-edits")
    await pair.box.shutdown()  # the laptop must decide alone: nothing may be sent
    with pytest.raises(PeerdError) as err:
        await pair.lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
    assert err.value.code == "access_exceeds_code"
    assert "peerd pair --access auto" in err.value.message
