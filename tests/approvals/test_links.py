"""Approvals across a link, real daemons on loopback: a box's run that a laptop started asks; the
laptop sees it ("on box") and decides over the link; the box's owner may decide too, the first
decision wins; a link sees only its own work's approvals; a read-only link can watch, not decide;
a link whose policy is deny is answered at once; a revoked link decides nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.approvals import desk as desk_module
from peerd.approvals import store as approvals_store
from peerd.approvals.rules import Approval
from peerd.config import ApprovalsConfig, Config
from peerd.errors import PeerdError
from tests.helpers import make_repo, script, two_daemons, wait_terminal
from tests.support.approvals import launch_on_box, pending_approvals, set_up
from tests.support.delegation import delegate, runs_script
from tests.support.eventually import eventually

pytestmark = pytest.mark.slow  # two daemons

Json = dict[str, Any]


async def test_the_laptop_sees_the_boxs_approval_and_decides_it_over_the_link(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(
            pair, project, script({"run": "echo hi > from-laptop.txt"}, {"reply": "ok"})
        )
        (seen,) = await pending_approvals(pair.lc)
        assert seen["onBox"] is True and seen["environmentId"] == pair.box_id
        assert seen["environmentLabel"] == "box" and seen["detail"]["command"] == "echo hi > from-laptop.txt"
        (there,) = await pending_approvals(pair.bc)  # the box's owner sees it too, and which link asks
        assert there["id"] == seen["id"] and there["linkLabel"] == "laptop" and there["onBox"] is False
        body = {"decision": "approve", "decisionId": "dec-1"}
        decided = await pair.lc.call("POST", f"/v1/approvals/{seen['id']}/decision", body=body)
        assert decided["status"] == "approved" and decided["onBox"] is True
        assert decided["decidedBy"].startswith("link:")
        # The same decision again (a retry) is answered as the first, even after it left the mirror.
        again = await pair.remote("POST", f"/v1/approvals/{seen['id']}/decision", body=body)
        assert again["status"] == "approved"
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
        box_thread = await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}")
        assert box_thread["latestRun"]["status"] == "completed"
        # The box's owner comes second: the first decision stands.
        with pytest.raises(PeerdError) as late:
            await pair.bc.call("POST", f"/v1/approvals/{seen['id']}/decision", body={"decision": "deny"})
        assert late.value.code == "approval_decided"


async def test_the_boxs_owner_decides_first_and_the_laptops_decision_is_refused(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        await launch_on_box(pair, project, script({"run": "touch nope.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        await pair.bc.call(
            "POST",
            f"/v1/approvals/{seen['id']}/decision",
            body={"decision": "deny", "reason": "owner says no"},
        )
        with pytest.raises(PeerdError) as late:
            await pair.lc.call("POST", f"/v1/approvals/{seen['id']}/decision", body={"decision": "approve"})
        assert late.value.code == "approval_decided"
        assert not (tmp_path / "box-repo" / "nope.txt").exists()


async def test_the_laptops_long_poll_is_woken_by_a_decision_on_the_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approval watch` on the laptop long-polls its daemon, which long-polls each box from the
    hash it last gave: a decision made on the box ends the wait at once. The recheck that would
    also find it is pushed past the wait here, so only the box's wake can end it early."""
    monkeypatch.setattr(desk_module, "OWNER_RECHECK_S", 600.0)
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        await launch_on_box(pair, project, script({"run": "touch nope.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        first = await pair.lc.call("GET", "/v1/approvals")
        asked_at = time.monotonic()
        waiting = asyncio.create_task(
            pair.lc.call("GET", "/v1/approvals", params={"changedFrom": first["pendingHash"], "timeout": 45})
        )
        await asyncio.sleep(0.5)  # the laptop's long-poll, and its own on the box, are in
        assert not waiting.done()
        await pair.bc.call("POST", f"/v1/approvals/{seen['id']}/decision", body={"decision": "deny"})
        page = await asyncio.wait_for(waiting, 50)
        assert page["items"] == [] and page["pendingHash"] != first["pendingHash"]
        assert time.monotonic() - asked_at < 30, "woken by the box's decision, not by the wait's end"


async def test_a_link_sees_only_its_own_works_approvals_and_read_only_cannot_decide(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        await set_up(tmp_path, pair, access="read-only")
        assert pair.laptop.identity is not None
        client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
        now = time.time()
        box_db = pair.box.db
        assert box_db is not None

        def record(approval_id: str, origin: str | None) -> Approval:
            return Approval(
                id=approval_id, run_id="run_x", thread_id="thr_x", ask_key="k", kind="command", tool="Bash",
                summary="run `ls`", detail={"command": "ls"}, digest="d", created_at=now,
                deadline_at=now + 600, link_origin=origin,
            )  # fmt: skip

        await approvals_store.insert(box_db, record("ap_mine", client_id))
        await approvals_store.insert(box_db, record("ap_owners", None))
        await approvals_store.insert(box_db, record("ap_other", "cli_someone_else"))
        seen = await pair.remote("GET", "/v1/approvals")
        assert [a["id"] for a in seen["items"]] == ["ap_mine"]
        with pytest.raises(PeerdError) as hidden:
            await pair.remote("GET", "/v1/approvals/ap_owners")
        assert hidden.value.code == "approval_not_found"
        # The laptop's own client refuses to send a change over a read-only link ...
        with pytest.raises(PeerdError) as not_sent:
            await pair.remote("POST", "/v1/approvals/ap_mine/decision", body={"decision": "approve"})
        assert not_sent.value.code == "capability_denied"
        # ... and a hostile laptop that sends it anyway, with the link's own token, is refused by the box.
        assert pair.laptop.peers is not None
        _, token = await pair.laptop.peers.access_token(pair.box_id)
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as raw:
            for approval_id, code in (
                ("ap_mine", "approval_not_allowed"),
                ("ap_other", "approval_not_found"),
            ):
                url = f"{pair.box_url}/v1/approvals/{approval_id}/decision"
                async with raw.post(url, json={"decision": "approve"}, headers=headers, ssl=False) as answer:
                    assert (await answer.json())["code"] == code
        stored = await approvals_store.get(box_db, "ap_mine")
        assert stored is not None and stored.pending


async def test_a_link_whose_policy_is_deny_gets_an_answer_at_once(tmp_path: Path) -> None:
    settings = Config(approvals=ApprovalsConfig(links={"laptop": "deny"}))
    async with two_daemons(tmp_path, settings=settings) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(pair, project, script({"run": "touch x.txt"}, {"reply": "after"}))
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
        items = await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}/items")
        assert any("policy is deny" in i["text"] for i in items["items"])
        assert (await pair.bc.call("GET", "/v1/approvals"))["items"] == []
        assert not (tmp_path / "box-repo" / "x.txt").exists()


async def test_a_revoked_link_decides_nothing(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        await launch_on_box(pair, project, script({"run": "touch y.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        client_id = (await pair.bc.call("GET", "/v1/clients"))["items"][0]["id"]
        await pair.bc.call("POST", f"/v1/clients/{client_id}/revoke", body={})
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", f"/v1/approvals/{seen['id']}/decision", body={"decision": "approve"})
        assert refused.value.code in ("capability_denied", "link_revoked")  # the token is no longer accepted
        stored = await pair.bc.call("GET", f"/v1/approvals/{seen['id']}")
        assert stored["status"] in ("pending", "cancelled")
        assert not (tmp_path / "box-repo" / "y.txt").exists()


async def test_a_delegated_childs_approval_comes_with_the_followers_watch(tmp_path: Path) -> None:
    """A laptop agent delegates to the box; the box child asks. The parent agent is not asked: the
    laptop's follower brings the question with its watch (no `approval list` needed), the task
    shows it as awaiting approval, and the person's decision on the laptop lets the child go on."""
    async with two_daemons(tmp_path, laptop_watch_chunk_s=5.0) as pair:
        await set_up(tmp_path, pair)
        make_repo(tmp_path / "laptop-repo")
        here = await pair.lc.call("POST", "/v1/projects", body={"path": str(tmp_path / "laptop-repo")})
        box_project = (await pair.lc.call("GET", "/v1/projects", params={"environmentId": pair.box_id}))[
            "items"
        ][0]
        child = script({"run": "echo child > child.txt"}, {"reply": "CHILD DONE"})
        target = {"environmentId": pair.box_id, "projectId": box_project["id"]}
        parent = runs_script(
            [delegate(task=child, target=target, clientRequestId="t1"), {"reply": "delegated ${taskId}"}],
            [{"reply": "woken"}],
        )
        launched = await pair.lc.call("POST", "/v1/threads", body={"projectId": here["id"], "prompt": parent})
        assert pair.laptop.db is not None
        db = pair.laptop.db
        mirrored = await eventually(
            lambda: approvals_store.mirrored(db, pair.box_id),
            what="the box's approval, brought by the follower's watch",
            within=20,
        )
        _, body, _ = mirrored[0]
        assert body["detail"]["command"] == "echo child > child.txt"
        (task,) = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": launched["threadId"]}))["items"]
        shown = await pair.lc.call("GET", f"/v1/tasks/{task['taskId']}")
        assert shown["awaitingApproval"]["approvalId"] == body["id"]
        assert shown["awaitingApproval"]["environmentId"] == pair.box_id
        await pair.lc.call("POST", f"/v1/approvals/{body['id']}/decision", body={"decision": "approve"})
        shown = await eventually(
            lambda: pair.lc.call("GET", f"/v1/tasks/{task['taskId']}"),
            what="the task ended",
            until=lambda t: t["status"] in ("completed", "failed", "cancelled"),
            within=30,
        )
        assert shown["status"] == "completed" and shown["awaitingApproval"] is None, shown
        box_child = await pair.bc.call("GET", f"/v1/threads/{shown['remoteChild']['threadId']}")
        assert (Path(box_child["worktreePath"]) / "child.txt").read_text() == "child\n"


async def test_a_decision_on_a_question_the_box_withdrew_is_refused_and_forgotten(tmp_path: Path) -> None:
    """Issue 26, case 7, the laptop's side: the box withdrew the question (its run ended) while the
    laptop still held its copy; the laptop's decision is refused with `approval_withdrawn` and the
    copy is forgotten."""
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(pair, project, script({"run": "echo hi > late.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        assert pair.laptop.db is not None
        assert [a["id"] for _, a, _ in await approvals_store.mirrored(pair.laptop.db)] == [seen["id"]]
        await pair.bc.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
        await eventually(
            lambda: pair.bc.call("GET", f"/v1/approvals/{seen['id']}"),
            what="the box withdrew the question",
            until=lambda approval: approval["status"] == "cancelled",
            within=10,
        )
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call("POST", f"/v1/approvals/{seen['id']}/decision", body={"decision": "approve"})
        assert refused.value.code == "approval_withdrawn"
        assert await approvals_store.mirrored(pair.laptop.db) == []
