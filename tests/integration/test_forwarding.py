"""Operations that name a linked environment run there, through the link, with scoped keys."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.core.idempotency import scoped_request_id
from peerd.core.text import path_segment
from peerd.errors import CapabilityDenied, InvalidRequest, PeerdError
from tests.helpers import Pair, script, wait_terminal
from tests.support.forwarding import linked

__all__ = ["linked"]  # the fixture (tests/support/forwarding.py)


async def test_a_launch_naming_the_box_runs_there(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, _, there = linked
    body = {
        "environmentId": pair.box_id,
        "projectId": there["id"],
        "prompt": script({"reply": "from the box"}),
    }
    launched = await pair.lc.call("POST", "/v1/threads", body=body)
    assert launched["projectId"] == there["id"]
    assert launched["runtimeMode"] == "auto", "omitted modes take the link's cap there"
    # Read, wait and list through the link.
    done = await pair.lc.call(
        "GET",
        f"/v1/threads/{launched['threadId']}/wait",
        params={"environmentId": pair.box_id, "timeout": 30},
    )
    assert done["status"] == "completed"
    read = await pair.lc.call(
        "GET", f"/v1/threads/{launched['threadId']}/items", params={"environmentId": pair.box_id}
    )
    assert read["items"][-1]["text"] == "from the box"
    shown = await pair.lc.call(
        "GET", f"/v1/threads/{launched['threadId']}", params={"environmentId": pair.box_id}
    )
    assert shown["linkLabel"] == "laptop"
    projects = await pair.lc.call("GET", "/v1/projects", params={"environmentId": pair.box_id})
    assert [p["id"] for p in projects["items"]] == [there["id"]]
    # Nothing ran here.
    assert (await pair.lc.call("GET", "/v1/threads"))["items"] == []


async def test_a_retried_launch_reaches_the_same_thread_there(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, _, there = linked
    body = {
        "environmentId": pair.box_id,
        "projectId": there["id"],
        "prompt": script({"reply": "once"}),
        "clientRequestId": "task-1",
    }
    first = await pair.lc.call("POST", "/v1/threads", body=body)
    again = await pair.lc.call("POST", "/v1/threads", body=body)
    assert again["threadId"] == first["threadId"]
    assert again["replayed"] is True
    assert len((await pair.bc.call("GET", "/v1/threads"))["items"]) == 1
    # The box stored the key scoped to this caller's namespace, never the raw one.
    expected = scoped_request_id("local", "task-1")
    assert expected.startswith("fwd:")


async def test_the_same_key_from_another_caller_is_another_thread_there(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, here, there = linked
    launch = {"environmentId": pair.box_id, "projectId": there["id"], "prompt": script({"reply": "x"})}
    mine = await pair.lc.call("POST", "/v1/threads", body={**launch, "clientRequestId": "same"})
    # An agent's run on the laptop launches with the same key through its tool.
    tool_step = {
        "tool": {"name": "thread_launch", "arguments": {**launch, "clientRequestId": "same"}, "check": True}
    }
    agent = await pair.lc.call(
        "POST", "/v1/threads", body={"projectId": here["id"], "prompt": script(tool_step)}
    )
    assert (await wait_terminal(pair.lc, agent["threadId"], agent["runId"]))["status"] == "completed"
    items = (await pair.lc.call("GET", f"/v1/threads/{agent['threadId']}/items"))["items"]
    tool_result = next(i for i in items if i["kind"] == "tool_call")["data"]["result"]
    assert tool_result["threadId"] != mine["threadId"]
    assert len((await pair.bc.call("GET", "/v1/threads"))["items"]) == 2


async def test_send_and_interrupt_through_the_link(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, _, there = linked
    hold = pair.box.paths.home / "release"
    body = {
        "environmentId": pair.box_id,
        "projectId": there["id"],
        "prompt": script({"wait_for_file": str(hold)}),
    }
    launched = await pair.lc.call("POST", "/v1/threads", body=body)
    sent = await pair.lc.call(
        "POST",
        f"/v1/threads/{launched['threadId']}/runs",
        body={"environmentId": pair.box_id, "text": "next"},
    )
    assert sent["status"] == "queued"
    stopped = await pair.lc.call(
        "POST",
        f"/v1/threads/{launched['threadId']}/interrupt",
        body={"environmentId": pair.box_id, "stop": True},
    )
    assert stopped["status"] == "interrupt_requested" and stopped["queueHeld"] is True
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    assert done["status"] == "interrupted"


async def test_an_unknown_environment_is_refused_and_nothing_is_sent(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, _, there = linked
    with pytest.raises(InvalidRequest) as err:
        await pair.lc.call(
            "POST", "/v1/threads", body={"environmentId": "nowhere", "projectId": there["id"], "prompt": "x"}
        )
    assert "not linked to nowhere" in err.value.message
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []


async def test_this_environments_own_id_means_here(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, here, _ = linked
    assert pair.laptop.identity is not None
    own = pair.laptop.identity.env_id
    launched = await pair.lc.call(
        "POST",
        "/v1/threads",
        body={"environmentId": own, "projectId": here["id"], "prompt": script({"reply": "x"})},
    )
    assert (await pair.lc.call("GET", f"/v1/threads/{launched['threadId']}"))["projectId"] == here["id"]


async def test_a_caller_cannot_escalate_modes_through_a_link(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, here, there = linked
    # An approval-required agent here asks for full-access there: refused here, nothing sent.
    launch = {
        "environmentId": pair.box_id,
        "projectId": there["id"],
        "prompt": "x",
        "runtimeMode": "full-access",
    }
    tool_step = {"tool": {"name": "thread_launch", "arguments": launch}}
    agent = await pair.lc.call(
        "POST",
        "/v1/threads",
        body={"projectId": here["id"], "prompt": script(tool_step), "runtimeMode": "approval-required"},
    )
    await wait_terminal(pair.lc, agent["threadId"], agent["runId"])
    items = (await pair.lc.call("GET", f"/v1/threads/{agent['threadId']}/items"))["items"]
    error = next(i for i in items if i["kind"] == "tool_call")["data"]["error"]
    assert error["code"] == "runtime_mode_escalation_denied"
    assert (await pair.bc.call("GET", "/v1/threads"))["items"] == []


async def test_lineage_is_kept_only_from_a_link(linked: tuple[Pair, dict[str, Any], dict[str, Any]]) -> None:
    pair, here, there = linked
    lineage = {"environmentId": "SOME-ONE", "threadId": "thr_x", "title": "parent"}
    local = await pair.bc.call(
        "POST",
        "/v1/threads",
        body={"projectId": there["id"], "prompt": script({"reply": "x"}), "delegatedFrom": lineage},
    )
    assert (await pair.bc.call("GET", f"/v1/threads/{local['threadId']}"))["delegatedFrom"] is None
    remote = await pair.remote(
        "POST",
        "/v1/threads",
        body={"projectId": there["id"], "prompt": script({"reply": "x"}), "delegatedFrom": lineage},
    )
    assert (await pair.bc.call("GET", f"/v1/threads/{remote['threadId']}"))["delegatedFrom"] == lineage
    del here


async def test_work_that_came_through_a_link_cannot_use_this_environments_links(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, _, _ = linked
    assert pair.laptop.identity is not None
    with pytest.raises(CapabilityDenied) as err:
        await pair.remote("GET", "/v1/projects", params={"environmentId": "elsewhere"})
    assert "cannot use this environment's links" in err.value.message


async def test_an_agent_cannot_launch_wider_threads_here_either(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]],
) -> None:
    pair, here, _ = linked
    wider = {
        "tool": {
            "name": "thread_launch",
            "arguments": {"projectId": here["id"], "prompt": "x", "runtimeMode": "auto"},
        }
    }
    plain = {"tool": {"name": "thread_launch", "arguments": {"projectId": here["id"], "prompt": "y"}}}
    agent = await pair.lc.call(
        "POST",
        "/v1/threads",
        body={"projectId": here["id"], "prompt": script(wider, plain), "runtimeMode": "auto-accept-edits"},
    )
    await wait_terminal(pair.lc, agent["threadId"], agent["runId"])
    calls = [
        i["data"]
        for i in (await pair.lc.call("GET", f"/v1/threads/{agent['threadId']}/items"))["items"]
        if i["kind"] == "tool_call"
    ]
    assert calls[0]["error"]["code"] == "runtime_mode_escalation_denied"
    assert calls[1]["result"]["runtimeMode"] == "auto-accept-edits", "an omitted mode takes the caller's own"


@pytest.mark.parametrize(
    "thread_id", ["../projects", "a/b", "a?b", "a#b", "a%2Fb", "..", "thr_x/../../projects"]
)
async def test_an_id_forwarded_to_the_box_stays_one_path_segment(
    linked: tuple[Pair, dict[str, Any], dict[str, Any]], thread_id: str
) -> None:
    """The laptop escapes ids it puts in the box's URL paths: `../projects` must not reach the
    box's project list, `a?b` must not become thread `a` with a query, and so on."""
    pair, _, _ = linked
    for path, params in [
        ("", {}),
        ("/items", {}),
        ("/wait", {"timeout": 0}),
        ("/events", {}),
    ]:
        with pytest.raises(PeerdError) as err:
            await pair.lc.call(
                "GET",
                f"/v1/threads/{path_segment(thread_id)}{path}",
                params={"environmentId": pair.box_id, **params},
            )
        assert err.value.code == "thread_not_found", (path, err.value.code, err.value.message)
        assert thread_id in err.value.message, err.value.message
