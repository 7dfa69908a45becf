"""A decision sent again after the first: the same `decisionId` with the same answer is the first
decision's idempotent replay (200); the same `decisionId` with the opposite answer, or another
`decisionId`, is refused `approval_decided` (409) and the first decision stands. On the owner
socket and from a link (real daemons on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api.localclient import LocalClient
from peerd.approvals.rules import Approval, Decision, decide
from peerd.errors import PeerdError
from tests.helpers import script, two_daemons, wait_terminal
from tests.support.approvals import launch, launch_on_box, pending_approvals, set_up

Json = dict[str, Any]


def test_the_rule_replays_only_the_same_answer() -> None:
    asked = Approval(
        id="ap_1", run_id="run_1", thread_id="thr_1", ask_key="k", kind="command", tool="Bash",
        summary="run `ls`", detail={}, digest="d", created_at=0.0, deadline_at=600.0,
    )  # fmt: skip
    first = decide(asked, Decision("approve", "owner", "once", decision_id="d1"), now=1.0)
    assert decide(first, Decision("approve", "owner", "once", decision_id="d1"), now=2.0) is first
    for again in (
        Decision("deny", "owner", decision_id="d1"),  # the same id, the opposite answer
        Decision("approve", "owner", "run", decision_id="d1"),  # the same id, a wider grant
        Decision("approve", "owner", "once", decision_id="d2"),  # another decision
    ):
        with pytest.raises(Exception) as refused:
            decide(first, again, now=2.0)
        assert type(refused.value).__name__ == "AlreadyDecided"


async def test_the_owner_resending_the_opposite_answer_is_refused(
    client: LocalClient, project: Json, repo: Path
) -> None:
    launched = await launch(client, project, script({"run": "echo yes > ok.txt"}, {"reply": "done"}))
    (asked,) = await pending_approvals(client)
    path = f"/v1/approvals/{asked['id']}/decision"
    first = await client.call("POST", path, body={"decision": "approve", "decisionId": "dec-1"})
    assert first["status"] == "approved"
    replay = await client.call("POST", path, body={"decision": "approve", "decisionId": "dec-1"})
    assert replay["status"] == "approved" and replay["decidedAt"] == first["decidedAt"]
    for body in ({"decision": "deny", "decisionId": "dec-1"}, {"decision": "deny", "decisionId": "dec-2"}):
        with pytest.raises(PeerdError) as refused:
            await client.call("POST", path, body=body)
        assert refused.value.code == "approval_decided"
    await wait_terminal(client, launched["threadId"], launched["runId"], total=15)
    assert (await client.call("GET", f"/v1/approvals/{asked['id']}"))["status"] == "approved"
    assert (repo / "ok.txt").read_text() == "yes\n"


@pytest.mark.slow
async def test_a_link_resending_the_opposite_answer_is_refused_409(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(pair, project, script({"run": "echo hi > x.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        path = f"/v1/approvals/{seen['id']}/decision"
        first = await pair.remote("POST", path, body={"decision": "approve", "decisionId": "dec-1"})
        assert first["status"] == "approved"
        again = await pair.remote("POST", path, body={"decision": "approve", "decisionId": "dec-1"})
        assert again["status"] == "approved"
        # A hostile laptop sends the opposite answer under the same id, with the link's own token.
        assert pair.laptop.peers is not None
        _, token = await pair.laptop.peers.access_token(pair.box_id)
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as raw:
            for body in (
                {"decision": "deny", "decisionId": "dec-1"},
                {"decision": "deny", "decisionId": "x"},
            ):
                async with raw.post(f"{pair.box_url}{path}", json=body, headers=headers, ssl=False) as answer:
                    assert answer.status == 409
                    assert (await answer.json())["code"] == "approval_decided"
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
        stored = await pair.bc.call("GET", f"/v1/approvals/{seen['id']}")
        assert stored["status"] == "approved" and stored["decidedBy"].startswith("link:")
