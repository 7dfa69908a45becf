"""The change feed is the link's own: what a hostile laptop can and cannot learn or change through
`POST /v1/feed/subscription` and `POST /v1/feed/changes` (two real daemons, TLS on loopback).

A link follows only runs of threads it started, decided by the box from the authenticated link:
another link's run, the owner's, or an unknown id is reported `found: false` and nothing else. A
huge set, a malformed id or a bogus cursor is a typed `invalid_request` and stores nothing; the set
is capped at `MAX_FOLLOWED_RUNS` (20,000) runs per link. The feed is not served on the owner's
socket."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.errors import PeerdError
from peerd.peer.client import PAIRING_GRANT
from peerd.peer.identity import pinned_fingerprint
from peerd.tasks.subscription import MAX_FOLLOWED_RUNS, set_hash
from tests.helpers import Pair, make_repo, script, two_daemons, wait_terminal
from tests.support.raw import assert_invalid, code_parts, local_raw, network_raw

SUBSCRIPTION, CHANGES = "/v1/feed/subscription", "/v1/feed/changes"


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path) as p:
        await p.link("auto")
        yield p


async def box_project(pair: Pair, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "box-repo")
    project: dict[str, Any] = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
    return str(project["id"])


async def second_link_token(pair: Pair) -> str:
    """Another laptop's link to the same box (paired with the raw OAuth grant): its access token."""
    code_id, secret = code_parts(await pair.code("auto"))
    form = {"grant_type": PAIRING_GRANT, "code_id": code_id, "code_secret": secret, "client_label": "other"}
    status, body = await network_raw(pair, "POST", "/oauth/token", form, token=False)
    assert status == 200, body
    return str(body["access_token"])


async def as_token(pair: Pair, token: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    assert pair.box.identity is not None
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            pair.box_url + path,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            ssl=pinned_fingerprint(pair.box.identity.fingerprint),
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def followed_rows(pair: Pair) -> int:
    with sqlite3.connect(pair.box.paths.db) as con:
        return int(con.execute("SELECT count(*) FROM feed_runs").fetchone()[0])


async def follow(pair: Pair, runs: list[str]) -> dict[str, Any]:
    answer: dict[str, Any] = await pair.remote(
        "POST", SUBSCRIPTION, body={"add": runs, "setHash": set_hash(runs)}
    )
    return answer


async def test_other_links_and_the_owners_runs_are_gone_and_nothing_more(pair: Pair, tmp_path: Path) -> None:
    """Rule: a link sees only runs of threads it started: another link's settled run, the owner's
    settled run and an unknown id are all reported `found: false`, with no status, reason or result
    run; the link's own settled run is reported in full."""
    project = await box_project(pair, tmp_path)
    other = await second_link_token(pair)
    status, theirs = await as_token(
        pair, other, "/v1/threads", {"projectId": project, "prompt": script({"fail": "SECRET REASON B"})}
    )
    assert status == 201, theirs
    owners = await pair.bc.call(
        "POST", "/v1/threads", body={"projectId": project, "prompt": script({"fail": "SECRET REASON O"})}
    )
    mine = await pair.remote(
        "POST", "/v1/threads", body={"projectId": project, "prompt": script({"fail": "MY REASON"})}
    )
    for launched in (theirs, owners, mine):
        assert (await wait_terminal(pair.bc, launched["threadId"], launched["runId"]))["status"] == "failed"

    runs = [theirs["runId"], owners["runId"], "run_00000000000000000000", mine["runId"]]
    assert (await follow(pair, runs))["inSync"] is True
    answer = await pair.remote("POST", CHANGES, body={"timeout": 0})
    by_run = {r["runId"]: r for r in answer["runs"]}
    assert set(by_run) == set(runs)
    for run in runs[:3]:
        assert by_run[run] == {
            "runId": run,
            "found": False,
            "settled": False,
            "status": None,
            "resultRunId": None,
            "reason": None,
            "reply": None,
            "replyInline": False,
            "usage": None,  # what another's thread spent is not told either
        }
    assert by_run[mine["runId"]]["reason"] == "MY REASON"
    assert "SECRET" not in json.dumps(answer)


async def test_a_set_above_the_cap_is_refused_and_stores_nothing(pair: Pair) -> None:
    """Rule: the set size is capped (20,000 runs per link): one change above it is a typed
    `invalid_request` and nothing is stored; a request above the cap by itself is refused as
    malformed before anything is read."""
    huge = [f"run_{i:020x}" for i in range(MAX_FOLLOWED_RUNS + 1)]
    with pytest.raises(PeerdError) as refused:
        await follow(pair, huge)
    assert refused.value.code == "invalid_request"
    assert followed_rows(pair) == 0
    half = MAX_FOLLOWED_RUNS // 2 + 1
    assert (await follow(pair, huge[:half]))["size"] == half
    with pytest.raises(PeerdError) as over:
        await follow(pair, huge[half : 2 * half])
    assert over.value.code == "invalid_request"
    assert "at most 20000 runs" in over.value.message
    assert followed_rows(pair) == half, "the refused change stored nothing"


@pytest.mark.parametrize(
    "body",
    [
        {"cursor": "../../etc/passwd", "timeout": 0},
        {"cursor": "0123456789abcdef-1; DROP TABLE runs", "timeout": 0},
        {"cursor": "x" * 5000, "timeout": 0},
        {"timeout": 51},
        {"timeout": -1},
        {"runs": []},
    ],
)
async def test_a_bogus_poll_is_a_typed_invalid_request(pair: Pair, body: dict[str, Any]) -> None:
    assert_invalid(await network_raw(pair, "POST", CHANGES, json.dumps(body).encode()))


@pytest.mark.parametrize(
    "body",
    [
        {"add": ["run_1"], "setHash": "not-a-hash"},
        {"add": ["run/../../x"], "setHash": "0" * 32},
        {"add": ["r" * 65], "setHash": "0" * 32},
        {"add": [{"threadId": "thr_1"}], "setHash": "0" * 32},
        {"add": ["run_1"]},
        {"reset": [1], "setHash": "0" * 32},
    ],
)
async def test_a_bogus_subscription_is_a_typed_invalid_request(pair: Pair, body: dict[str, Any]) -> None:
    assert_invalid(await network_raw(pair, "POST", SUBSCRIPTION, json.dumps(body).encode()))
    assert followed_rows(pair) == 0


async def test_a_cursor_of_another_box_or_ahead_resyncs_with_the_links_own_data_only(pair: Pair) -> None:
    """Rule: a well-formed cursor the box did not hand out is a re-sync: the link's own reports
    (none here), never another's."""
    for cursor in ("ffffffffffffffff-1", "0000000000000000-999999999"):
        answer = await pair.remote("POST", CHANGES, body={"cursor": cursor, "timeout": 0})
        assert answer["resynced"] is True and answer["runs"] == []


async def test_the_feed_is_not_served_on_the_owners_socket(pair: Pair) -> None:
    status, body = await local_raw(pair, "POST", CHANGES, b'{"timeout": 0}')
    assert (status, body["code"]) == (404, "not_found")


async def test_one_links_subscription_is_not_anothers(pair: Pair) -> None:
    """Rule: the subscription is keyed by the authenticated link: another link's changes never
    touch this one's set (its hash stays ours)."""
    runs = ["run_aaaaaaaaaaaaaaaaaaaa"]
    await follow(pair, runs)
    other = await second_link_token(pair)
    status, answer = await as_token(
        pair, other, SUBSCRIPTION, {"reset": True, "add": [], "setHash": set_hash([])}
    )
    assert status == 200 and answer["size"] == 0
    mine = await pair.remote("POST", SUBSCRIPTION, body={"setHash": set_hash(runs)})
    assert mine == {"inSync": True, "size": 1, "setHash": set_hash(runs)}
