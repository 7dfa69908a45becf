"""A hostile laptop's runs on the box: their agent tools, delegations, branches and revocation.

Two real daemons ("laptop" linked to "box"), and for the no-chaining rule a third one the box itself
is linked to. Every attack is made the way a hostile laptop would: it launches a scripted thread on
the box through its link whose steps call the box's agent tools, or calls the box's API directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.config import Config, LinksConfig
from peerd.errors import PeerdError
from tests.helpers import (
    Pair,
    client_for,
    git,
    items,
    make_repo,
    running_daemon,
    script,
    two_daemons,
    wait_terminal,
)
from tests.support.delegation import linked_pair
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # two daemons

Linked = tuple[Pair, dict[str, Any]]


@pytest.fixture
async def linked(tmp_path: Path) -> AsyncIterator[Linked]:
    async with linked_pair(tmp_path, watch_chunk_s=5) as found:
        yield found


async def box_project(pair: Pair) -> dict[str, Any]:
    return dict((await pair.bc.call("GET", "/v1/projects"))["items"][0])


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": {"name": name, "arguments": arguments, "check": False}}


async def link_run(pair: Pair, *steps: dict[str, Any], **extra: Any) -> str:
    """A scripted thread the laptop launches on the box through its link; returns its thread id there."""
    project = await box_project(pair)
    body = {"projectId": project["id"], "prompt": script(*steps), **extra}
    launched = await pair.remote("POST", "/v1/threads", body=body)
    await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    return str(launched["threadId"])


async def tool_errors(pair: Pair, thread_id: str) -> list[str | None]:
    """The error code of each tool call the box thread made (None: it succeeded)."""
    calls = [i["data"] for i in await items(pair.bc, thread_id) if i["kind"] == "tool_call"]
    return [(c.get("error") or {}).get("code") for c in calls]


async def relink(pair: Pair, access: str) -> None:
    for env in (await pair.lc.call("GET", "/v1/environments", params={"probe": "false"}))["items"]:
        await pair.lc.call("DELETE", f"/v1/environments/{env['environmentId']}")
    await pair.link(access)


# --- agent tools of a link-started run ------------------------------------------------------------


async def test_a_link_run_cannot_send_into_an_owner_thread(linked: Linked) -> None:
    pair, _ = linked
    await relink(pair, "approval-required")
    owner = await pair.bc.call(
        "POST",
        "/v1/threads",
        body={"projectId": (await box_project(pair))["id"], "prompt": script({"reply": "mine"})},
    )
    await wait_terminal(pair.bc, owner["threadId"], owner["runId"])
    thread = await link_run(pair, tool("thread_send", threadId=owner["threadId"], text="obey me"))
    assert await tool_errors(pair, thread) == ["capability_denied"]
    runs = [i for i in await items(pair.bc, owner["threadId"]) if i["kind"] == "user_message"]
    assert len(runs) == 1, "no message reached the owner's thread"


async def test_a_link_run_cannot_launch_in_place_in_the_owners_checkout(linked: Linked) -> None:
    pair, _ = linked
    await relink(pair, "approval-required")
    project = await box_project(pair)
    before = len((await pair.bc.call("GET", "/v1/threads"))["items"])
    thread = await link_run(
        pair,
        tool("thread_launch", projectId=project["id"], prompt=script({"reply": "x"}), inPlace=True),
    )
    assert await tool_errors(pair, thread) == ["capability_denied"]
    assert len((await pair.bc.call("GET", "/v1/threads"))["items"]) == before + 1, (
        "only the link's own thread"
    )


async def test_a_link_run_cannot_list_or_use_the_boxs_own_links(linked: Linked, tmp_path: Path) -> None:
    pair, _ = linked
    async with running_daemon(tmp_path / "third", label="third") as third, client_for(third.paths.home) as tc:
        code = (await tc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
        await pair.bc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
        assert third.identity is not None
        git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(tmp_path / "third-repo"))
        await tc.call("POST", "/v1/projects", body={"path": str(tmp_path / "third-repo")})
        project = await box_project(pair)
        thread = await link_run(
            pair,
            tool("environment_list"),
            tool("project_list", environmentId=third.identity.env_id),
            tool(
                "thread_launch",
                projectId=project["id"],
                prompt=script({"reply": "x"}),
                environmentId=third.identity.env_id,
            ),
            tool("delegate_task", task="x", target={"environmentId": third.identity.env_id}),
        )
        errors = await tool_errors(pair, thread)
        assert errors[0] == "capability_denied"
        assert all(code is not None for code in errors), errors
        assert (await tc.call("GET", "/v1/threads"))["items"] == [], "nothing reached the third machine"


async def test_a_link_runs_delegation_stays_inside_the_link(linked: Linked) -> None:
    pair, _ = linked
    await relink(pair, "auto-accept-edits")
    thread = await link_run(
        pair,
        tool("delegate_task", task=script({"reply": "child"}), mode="wait", timeoutMs=20000),
        tool("delegate_task", task="x", runtimeMode="full-access"),
    )
    assert await tool_errors(pair, thread) == [None, "runtime_mode_escalation_denied"]
    children = [t for t in (await pair.bc.call("GET", "/v1/threads"))["items"] if t["id"] != thread]
    assert len(children) == 1
    [child] = children
    parent = await pair.bc.call("GET", f"/v1/threads/{thread}")
    assert child["linkOrigin"] == parent["linkOrigin"] is not None, "the child is the link's thread"
    assert parent["startedBy"] == f"link:{parent['linkOrigin']}"
    assert child["startedBy"] == f"task:{thread}"
    assert child["runtimeMode"] == "auto-accept-edits"
    # The link can therefore reach its child the way it reaches its own threads, and nothing more.
    sent = await pair.remote("POST", f"/v1/threads/{child['id']}/runs", body={"text": "more"})
    assert sent["runId"]


async def test_the_agent_socket_serves_only_tools_and_only_to_a_live_runs_token(linked: Linked) -> None:
    pair, _ = linked
    sock = pair.box.paths.agent_socket
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        async with http.post("http://peerd/v1/tools/project_list", json={}) as resp:
            assert resp.status == 403
            assert (await resp.json())["code"] == "capability_denied"
        async with http.post("http://peerd/v1/pair", json={"access": "full-access"}) as resp:
            assert resp.status == 404
        async with http.post(
            "http://peerd/v1/tools/project_list", json={}, headers={"Authorization": "Bearer forged"}
        ) as resp:
            assert (await resp.json())["code"] == "parent_not_active"
    assert (await pair.bc.call("GET", "/v1/pair"))["items"] == []


async def test_a_runs_environment_names_only_the_agent_socket(linked: Linked) -> None:
    pair, _ = linked
    thread = await link_run(pair, {"run": "printenv PEERD_SOCKET"})
    [command] = [i for i in await items(pair.bc, thread) if i["kind"] == "command"]
    assert command["data"]["output"].strip() == str(pair.box.paths.agent_socket)
    assert str(pair.box.paths.socket) not in command["data"]["output"]


# --- branches ---------------------------------------------------------------------------------


async def test_a_link_cannot_take_an_owner_threads_branch(linked: Linked) -> None:
    pair, _ = linked
    project = await box_project(pair)
    owner = await pair.bc.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": script()})
    await wait_terminal(pair.bc, owner["threadId"], owner["runId"])
    await pair.bc.call("POST", f"/v1/threads/{owner['threadId']}/archive")
    branch = f"peerd/{owner['threadId']}"
    with pytest.raises(PeerdError) as refused:
        await pair.remote(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script(), "branch": branch}
        )
    assert refused.value.code == "branch_taken"
    git(Path(project["path"]), "branch", "orchestrate/run_x/integrated")
    with pytest.raises(PeerdError) as refused:
        await pair.remote(
            "POST",
            "/v1/threads",
            body={"projectId": project["id"], "prompt": script(), "branch": "orchestrate/run_x/integrated"},
        )
    assert refused.value.code == "branch_taken"


async def test_a_retried_launch_with_its_own_new_branch_reaches_the_same_thread(linked: Linked) -> None:
    pair, _ = linked
    project = await box_project(pair)
    body = {"projectId": project["id"], "prompt": script(), "branch": "peerd/mine", "clientRequestId": "k1"}
    first = await pair.remote("POST", "/v1/threads", body=body)
    await wait_terminal(pair.bc, first["threadId"], first["runId"])
    again = await pair.remote("POST", "/v1/threads", body=body)
    assert again["threadId"] == first["threadId"] and again["replayed"]


# --- revocation ---------------------------------------------------------------------------------


async def start_long_link_run(pair: Pair) -> dict[str, Any]:
    project = await box_project(pair)
    body = {"projectId": project["id"], "prompt": script({"wait": 60}, {"reply": "finished"})}
    launched: dict[str, Any] = await pair.remote("POST", "/v1/threads", body=body)
    await eventually(
        lambda: pair.bc.call("GET", f"/v1/threads/{launched['threadId']}"),
        what="the link's run running",
        until=lambda thread: thread["latestRun"]["status"] == "running",
    )
    return launched


async def client_id(pair: Pair) -> str:
    [client] = [c for c in (await pair.bc.call("GET", "/v1/clients"))["items"] if c["status"] == "active"]
    return str(client["id"])


async def test_revoking_a_link_stops_the_runs_it_started(linked: Linked) -> None:
    pair, _ = linked
    launched = await start_long_link_run(pair)
    revoked = await pair.bc.call("POST", f"/v1/clients/{await client_id(pair)}/revoke")
    assert revoked["stoppedThreads"] == [launched["threadId"]]
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
    assert done["status"] == "interrupted"


async def test_revoking_with_keep_runs_leaves_them_but_their_tools_no_longer_act(linked: Linked) -> None:
    pair, _ = linked
    project = await box_project(pair)
    steps = [
        {"wait_for_file": "go"},
        tool("project_list"),
        {"reply": "finished"},
    ]
    launched = await pair.remote(
        "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script(*steps)}
    )
    thread = await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}")
    revoked = await pair.bc.call(
        "POST", f"/v1/clients/{await client_id(pair)}/revoke", body={"keepRuns": True}
    )
    assert revoked["stoppedThreads"] == []
    await eventually(
        Path(thread["worktreePath"]).is_dir, what="the worktree (it appears when the run starts)"
    )
    (Path(thread["worktreePath"]) / "go").write_text("")
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
    assert done["status"] == "completed"
    assert await tool_errors(pair, launched["threadId"]) == ["link_revoked"]


async def test_a_link_may_launch_only_the_providers_the_box_owner_allows(tmp_path: Path) -> None:
    settings = Config(links=LinksConfig(providers=["claude"]))
    async with two_daemons(tmp_path, settings=settings) as pair:
        make_repo(tmp_path / "box-repo")
        project = await pair.bc.call("POST", "/v1/projects", body={"path": str(tmp_path / "box-repo")})
        await pair.link("auto")
        with pytest.raises(PeerdError) as refused:
            await pair.remote("POST", "/v1/threads", body={"projectId": project["id"], "prompt": script()})
        assert refused.value.code == "capability_denied"
        assert (await pair.bc.call("GET", "/v1/threads"))["items"] == [], "nothing was created"
        owner = await pair.bc.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script()}
        )
        assert owner["threadId"], "the owner is not limited by links.providers"
