"""Malformed or impossible requests against a real daemon: typed errors, and nothing changes."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api.localclient import LocalClient
from peerd.contracts import MAX_PROMPT_CHARS, PAGE_LIMIT
from peerd.daemon import Daemon
from peerd.errors import (
    CapabilityDenied,
    Conflict,
    InvalidRequest,
    PeerdError,
    ProjectExists,
    ProjectNotFound,
    RunNotFound,
    ThreadNotFound,
    from_wire,
)
from tests.helpers import git, make_repo, script, wait_terminal

MIB = 1024 * 1024


@pytest.fixture
async def raw(daemon: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    """Plain HTTP over the daemon's Unix socket, for exact status codes and bodies."""
    connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
    async with aiohttp.ClientSession(connector=connector, base_url="http://peerd") as session:
        yield session


@pytest.fixture
async def thread(client: LocalClient, project: dict[str, Any]) -> dict[str, Any]:
    """A thread whose first run has completed, so nothing moves on its own during a test."""
    launched: dict[str, Any] = await client.call(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script({"reply": "done"})}
    )
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    assert done["status"] == "completed"
    return launched


async def snapshot(client: LocalClient) -> dict[str, Any]:
    """Everything a bad request could have touched, as the API reports it."""
    threads = await client.call("GET", "/v1/threads", params={"includeArchived": True})
    projects = await client.call("GET", "/v1/projects")
    status = await client.call("GET", "/v1/status")
    items = {t["id"]: await client.call("GET", f"/v1/threads/{t['id']}/items") for t in threads["items"]}
    return {"threads": threads, "projects": projects, "counts": status["counts"], "items": items}


async def expect_error(resp: aiohttp.ClientResponse, status: int, code: str, *needles: str) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body: dict[str, Any] = await resp.json()
    assert set(body) == {"code", "message"}
    assert body["code"] == code
    for needle in needles:
        assert needle in body["message"], body["message"]
    return body


# --- malformed launches ----------------------------------------------------------------------------


async def test_a_body_that_is_not_json_is_invalid_request(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    headers = {"Content-Type": "application/json"}
    async with raw.post("/v1/threads", data=b'{"projectId": "x", "prompt": ', headers=headers) as resp:
        await expect_error(resp, 400, "invalid_request", "not valid JSON")
    async with raw.post("/v1/threads", data=b"\xff\xfe\x00garbage", headers=headers) as resp:
        await expect_error(resp, 400, "invalid_request", "not valid JSON")
    assert await snapshot(client) == before


async def test_a_json_array_body_is_invalid_request(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    body = [{"projectId": project["id"], "prompt": "hello"}]
    async with raw.post("/v1/threads", json=body) as resp:
        await expect_error(resp, 400, "invalid_request", "JSON object")
    async with raw.post("/v1/threads", json="a string") as resp:
        await expect_error(resp, 400, "invalid_request", "JSON object")
    assert await snapshot(client) == before


async def test_an_unknown_field_is_refused_by_name(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    body = {"projectId": project["id"], "prompt": "hello", "runtimeMod": "auto"}
    async with raw.post("/v1/threads", json=body) as resp:
        await expect_error(resp, 400, "invalid_request", "runtimeMod")
    assert await snapshot(client) == before


async def test_an_empty_prompt_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.post("/v1/threads", json={"projectId": project["id"], "prompt": ""}) as resp:
        await expect_error(resp, 400, "invalid_request", "prompt")
    assert await snapshot(client) == before


async def test_a_prompt_over_the_limit_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    prompt = "x" * (MAX_PROMPT_CHARS + 1)
    async with raw.post("/v1/threads", json={"projectId": project["id"], "prompt": prompt}) as resp:
        await expect_error(resp, 400, "invalid_request", "prompt", str(MAX_PROMPT_CHARS))
    assert await snapshot(client) == before


async def test_a_prompt_at_the_limit_is_accepted(client: LocalClient, project: dict[str, Any]) -> None:
    """The boundary of the previous test: the limit itself is allowed."""
    prompt = "x" * MAX_PROMPT_CHARS
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    read = await client.call("GET", f"/v1/threads/{launched['threadId']}/items", params={"limit": 1})
    assert read["items"][0]["textLength"] == MAX_PROMPT_CHARS


async def test_a_body_over_2_mib_is_payload_too_large(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    body = {"projectId": project["id"], "prompt": "x" * (2 * MIB)}
    data = io.BytesIO(json.dumps(body).encode())  # a stream: aiohttp warns on large raw bodies
    headers = {"Content-Type": "application/json"}
    async with raw.post("/v1/threads", data=data, headers=headers) as resp:
        await expect_error(resp, 413, "payload_too_large", str(2 * MIB))
    assert await snapshot(client) == before


async def test_an_unknown_project_is_project_not_found(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.post("/v1/threads", json={"projectId": "prj_nope", "prompt": "hello"}) as resp:
        await expect_error(resp, 404, "project_not_found", "prj_nope")
    async with raw.get("/v1/projects/prj_nope") as resp:
        await expect_error(resp, 404, "project_not_found", "prj_nope")
    async with raw.delete("/v1/projects/prj_nope") as resp:
        await expect_error(resp, 404, "project_not_found")
    async with raw.get("/v1/threads", params={"projectId": "prj_nope"}) as resp:
        await expect_error(resp, 404, "project_not_found")
    assert await snapshot(client) == before


@pytest.mark.slow
async def test_an_unknown_thread_is_thread_not_found(
    raw: aiohttp.ClientSession, client: LocalClient, thread: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.get("/v1/threads/thr_nope") as resp:
        await expect_error(resp, 404, "thread_not_found", "thr_nope")
    async with raw.post("/v1/threads/thr_nope/runs", json={"text": "more"}) as resp:
        await expect_error(resp, 404, "thread_not_found", "thr_nope")
    async with raw.get("/v1/threads/thr_nope/wait", params={"timeout": "0"}) as resp:
        await expect_error(resp, 404, "thread_not_found")
    async with raw.get("/v1/threads/thr_nope/items") as resp:
        await expect_error(resp, 404, "thread_not_found")
    async with raw.post("/v1/threads/thr_nope/archive") as resp:
        await expect_error(resp, 404, "thread_not_found")
    assert await snapshot(client) == before


@pytest.mark.slow
async def test_an_unknown_run_on_wait_is_run_not_found(
    raw: aiohttp.ClientSession, client: LocalClient, thread: dict[str, Any]
) -> None:
    before = await snapshot(client)
    path = f"/v1/threads/{thread['threadId']}/wait"
    async with raw.get(path, params={"run": "run_nope", "timeout": "0"}) as resp:
        await expect_error(resp, 404, "run_not_found", "run_nope")
    assert await snapshot(client) == before


async def test_an_unknown_provider_is_refused_listing_the_known_ones(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    body = {"projectId": project["id"], "prompt": "hello", "provider": "no-such-coder"}
    async with raw.post("/v1/threads", json=body) as resp:
        await expect_error(resp, 400, "invalid_request", "no-such-coder", "script")
    assert await snapshot(client) == before


@pytest.mark.slow
async def test_a_wait_over_the_long_poll_limit_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, thread: dict[str, Any]
) -> None:
    before = await snapshot(client)
    path = f"/v1/threads/{thread['threadId']}/wait"
    async with raw.get(path, params={"timeout": "51"}) as resp:
        await expect_error(resp, 400, "invalid_request", "timeout")
    async with raw.get(path, params={"timeout": "-1"}) as resp:
        await expect_error(resp, 400, "invalid_request", "timeout")
    async with raw.get(path, params={"timeout": "soon"}) as resp:
        await expect_error(resp, 400, "invalid_request", "timeout")
    assert await snapshot(client) == before


@pytest.mark.slow
async def test_a_bad_cursor_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, thread: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.get("/v1/threads", params={"cursor": "not-a-cursor"}) as resp:
        await expect_error(resp, 400, "invalid_request", "not-a-cursor")
    async with raw.get("/v1/projects", params={"cursor": "not-a-cursor"}) as resp:
        await expect_error(resp, 400, "invalid_request", "not-a-cursor")
    async with raw.get("/v1/projects", params={"limit": str(PAGE_LIMIT + 1)}) as resp:
        await expect_error(resp, 400, "invalid_request", "limit")
    assert await snapshot(client) == before


async def test_an_unknown_route_is_a_json_not_found(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.get("/v1/nope") as resp:
        await expect_error(resp, 404, "not_found", "/v1/nope")
    async with raw.post("/v2/threads", json={}) as resp:
        await expect_error(resp, 404, "not_found", "POST /v2/threads")
    assert await snapshot(client) == before


async def test_a_request_with_an_origin_header_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, tmp_path: Path, project: dict[str, Any]
) -> None:
    other = make_repo(tmp_path / "other")
    before = await snapshot(client)
    origin = {"Origin": "https://evil.example"}
    async with raw.post("/v1/projects", json={"path": str(other)}, headers=origin) as resp:
        await expect_error(resp, 403, "capability_denied", "Origin")
    body = {"projectId": project["id"], "prompt": "hello"}
    async with raw.post("/v1/threads", json=body, headers=origin) as resp:
        await expect_error(resp, 403, "capability_denied")
    async with raw.get("/v1/status", headers={"Origin": "null"}) as resp:
        await expect_error(resp, 403, "capability_denied")
    assert await snapshot(client) == before


# --- projects --------------------------------------------------------------------------------------


async def test_adding_a_directory_that_is_not_a_git_checkout_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    before = await snapshot(client)
    async with raw.post("/v1/projects", json={"path": str(plain)}) as resp:
        await expect_error(resp, 400, "invalid_request", "git")
    async with raw.post("/v1/projects", json={"path": str(tmp_path / "missing")}) as resp:
        await expect_error(resp, 400, "invalid_request", "not a directory")
    assert await snapshot(client) == before


async def test_adding_a_relative_path_is_refused(
    raw: aiohttp.ClientSession, client: LocalClient, repo: Path
) -> None:
    relative = os.path.relpath(repo, Path.cwd())
    before = await snapshot(client)
    async with raw.post("/v1/projects", json={"path": relative}) as resp:
        await expect_error(resp, 400, "invalid_request", "absolute")
    async with raw.post("/v1/projects", json={"path": "repo"}) as resp:
        await expect_error(resp, 400, "invalid_request", "absolute")
    assert await snapshot(client) == before


async def test_adding_a_project_twice_is_project_exists(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any], repo: Path
) -> None:
    before = await snapshot(client)
    async with raw.post("/v1/projects", json={"path": str(repo)}) as resp:
        await expect_error(resp, 409, "project_exists", project["id"])
    # A subdirectory of the checkout is the same project (its top level is registered).
    (repo / "sub").mkdir()
    async with raw.post("/v1/projects", json={"path": str(repo / "sub"), "name": "other"}) as resp:
        await expect_error(resp, 409, "project_exists")
    assert await snapshot(client) == before


@pytest.mark.slow
async def test_removing_a_project_with_an_active_thread_is_a_conflict(
    raw: aiohttp.ClientSession, client: LocalClient, project: dict[str, Any], thread: dict[str, Any]
) -> None:
    before = await snapshot(client)
    async with raw.delete(f"/v1/projects/{project['id']}") as resp:
        await expect_error(resp, 409, "conflict", "archive")
    assert await snapshot(client) == before
    # Once its thread is archived, the same request succeeds.
    await client.call("POST", f"/v1/threads/{thread['threadId']}/archive")
    removed = await client.call("DELETE", f"/v1/projects/{project['id']}")
    assert removed["id"] == project["id"]
    assert (await client.call("GET", "/v1/projects"))["items"] == []


async def test_errors_come_back_typed_through_the_client(
    client: LocalClient, project: dict[str, Any], thread: dict[str, Any], repo: Path
) -> None:
    before = await snapshot(client)
    cases: list[tuple[type[PeerdError], str, str, dict[str, Any] | None, dict[str, Any] | None]] = [
        (InvalidRequest, "POST", "/v1/threads", {"projectId": project["id"], "prompt": ""}, None),
        (ProjectNotFound, "GET", "/v1/projects/prj_nope", None, None),
        (ThreadNotFound, "GET", "/v1/threads/thr_nope", None, None),
        (RunNotFound, "GET", f"/v1/threads/{thread['threadId']}/wait", None, {"run": "run_x", "timeout": 0}),
        (ProjectExists, "POST", "/v1/projects", {"path": str(repo)}, None),
        (Conflict, "DELETE", f"/v1/projects/{project['id']}", None, None),
    ]
    for error, method, path, body, params in cases:
        with pytest.raises(error) as err:
            await client.call(method, path, body=body, params=params)
        assert type(err.value) is error, (path, err.value)
        assert err.value.code == error.code
    assert await snapshot(client) == before


async def test_origin_refusal_comes_back_typed(daemon: Daemon) -> None:
    connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get("http://peerd/v1/status", headers={"Origin": "https://x.example"}) as resp,
    ):
        body = await resp.json()
    assert resp.status == 403
    assert isinstance(from_wire(body["code"], body["message"]), CapabilityDenied)


# --- the repository key is recomputed when missing ------------------------------------------------


async def test_a_missing_repository_key_is_recomputed_and_stored(
    client: LocalClient, daemon: Daemon, tmp_path: Path
) -> None:
    bare = make_repo(tmp_path / "no-origin", origin=None)
    added = await client.call("POST", "/v1/projects", body={"path": str(bare)})
    assert added["repositoryKey"] is None
    shown = await client.call("GET", f"/v1/projects/{added['id']}")
    assert shown["repositoryKey"] is None, "no origin yet: nothing to compute"

    git(bare, "remote", "add", "origin", "https://github.com/o/r.git")

    shown = await client.call("GET", f"/v1/projects/{added['id']}")
    assert shown["repositoryKey"] == "github.com/o/r"
    listed = await client.call("GET", "/v1/projects")
    assert [p["repositoryKey"] for p in listed["items"]] == ["github.com/o/r"]
    assert daemon.db is not None
    stored = await daemon.db.scalar("SELECT repository_key FROM projects WHERE id = ?", (added["id"],))
    assert stored == "github.com/o/r"

    # Stored, not recomputed each time: a key once known survives the remote going away.
    git(bare, "remote", "remove", "origin")
    shown = await client.call("GET", f"/v1/projects/{added['id']}")
    assert shown["repositoryKey"] == "github.com/o/r"


async def test_a_listing_survives_a_checkout_that_vanished(client: LocalClient, tmp_path: Path) -> None:
    gone = make_repo(tmp_path / "gone", origin=None)
    added = await client.call("POST", "/v1/projects", body={"path": str(gone)})
    shutil.rmtree(gone)
    listed = await client.call("GET", "/v1/projects")
    assert [(p["id"], p["repositoryKey"]) for p in listed["items"]] == [(added["id"], None)]


# --- listing pages -------------------------------------------------------------------------------


async def _git_init_many(dirs: list[Path]) -> None:
    async def one(path: Path) -> None:
        path.mkdir()
        proc = await asyncio.create_subprocess_exec(
            "git", "init", "-q", str(path), stdout=asyncio.subprocess.DEVNULL
        )
        assert await proc.wait() == 0

    await asyncio.gather(*(one(d) for d in dirs))
    for i, path in enumerate(dirs):
        # An origin written straight into the config: no git process per repository, and a
        # known key so listing has nothing to recompute.
        with (path / ".git" / "config").open("a") as config:
            config.write(f'[remote "origin"]\n\turl = https://github.com/o/r{i}.git\n')


@pytest.mark.slow
async def test_projects_list_in_pages_of_100(client: LocalClient, tmp_path: Path) -> None:
    total = PAGE_LIMIT + 1
    dirs = [tmp_path / "many" / f"p{i:03d}" for i in range(total)]
    (tmp_path / "many").mkdir()
    await _git_init_many(dirs)
    added = await asyncio.gather(*(client.call("POST", "/v1/projects", body={"path": str(d)}) for d in dirs))
    assert {p["repositoryKey"] for p in added} == {f"github.com/o/r{i}" for i in range(total)}
    status = await client.call("GET", "/v1/status")
    assert status["counts"]["projects"] == total

    first = await client.call("GET", "/v1/projects")
    assert len(first["items"]) == PAGE_LIMIT
    assert first["nextCursor"] is not None
    second = await client.call("GET", "/v1/projects", params={"cursor": first["nextCursor"]})
    assert len(second["items"]) == 1
    assert second["nextCursor"] is None
    ids = [p["id"] for p in first["items"] + second["items"]]
    assert len(set(ids)) == total
    assert set(ids) == {p["id"] for p in added}
    created = [p["createdAt"] for p in first["items"] + second["items"]]
    assert created == sorted(created), "pages follow insertion order"

    # Smaller pages walk the same list with the same cursor rules.
    walked: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await client.call("GET", "/v1/projects", params={"limit": 40, "cursor": cursor})
        walked += [p["id"] for p in page["items"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert pages == 3
    assert walked == ids


@pytest.mark.slow
async def test_threads_list_pages_follow_the_cursor(client: LocalClient, project: dict[str, Any]) -> None:
    launched = []
    for i in range(3):
        body = {"projectId": project["id"], "prompt": script({"reply": f"r{i}"})}
        launched.append(await client.call("POST", "/v1/threads", body=body))
    for t in launched:
        await wait_terminal(client, t["threadId"], t["runId"])
    first = await client.call("GET", "/v1/threads", params={"limit": 2})
    assert [t["id"] for t in first["items"]] == [t["threadId"] for t in launched[:2]]
    assert first["nextCursor"] is not None
    second = await client.call("GET", "/v1/threads", params={"limit": 2, "cursor": first["nextCursor"]})
    assert [t["id"] for t in second["items"]] == [launched[2]["threadId"]]
    assert second["nextCursor"] is None
    exact = await client.call("GET", "/v1/threads", params={"limit": 3})
    assert len(exact["items"]) == 3 and exact["nextCursor"] is None, "no empty page after a full one"
