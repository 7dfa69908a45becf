"""A hostile agent cannot decide approvals: not its own, not another run's. Approvals are decided
only on the owner socket (which refuses processes peerd started) or over the link that started
the work; the agent socket and the MCP endpoints have no such route or tool."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from tests.helpers import script, wait_terminal
from tests.support.approvals import pending_approvals

Json = dict[str, Any]

ATTACK = r"""
import json, os, socket, sys
approval = sys.argv[1]
out = {}
for path in (f"/v1/approvals/{approval}/decision", "/v1/tools/approval_decide", "/v1/tools/approve"):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["PEERD_SOCKET"])
    body = json.dumps({"decision": "approve", "approvalId": approval}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: peerd\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {os.environ.get('PEERD_RUN_TOKEN', '')}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s.sendall(head + body)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    out[path] = data.split(b" ", 2)[1].decode()
print(json.dumps(out))
"""


async def test_an_agent_cannot_approve_a_pending_question(
    client: LocalClient, project: Json, tmp_path: Path
) -> None:
    asking = await client.call(
        "POST",
        "/v1/threads",
        body={
            "projectId": project["id"],
            "prompt": script({"run": "touch guarded.txt"}, {"reply": "done"}),
            "runtimeMode": "approval-required",
        },
    )
    (question,) = await pending_approvals(client, seconds=15)
    attack = tmp_path / "attack.py"
    attack.write_text(ATTACK)
    hostile = await client.call(
        "POST",
        "/v1/threads",
        body={
            "projectId": project["id"],
            "prompt": script({"run": f"{sys.executable} {attack} {question['id']}"}),
            "runtimeMode": "full-access",
        },
    )
    await wait_terminal(client, hostile["threadId"], hostile["runId"], total=20)
    items = (await client.call("GET", f"/v1/threads/{hostile['threadId']}/items"))["items"]
    (command,) = [i for i in items if i["kind"] == "command"]
    statuses = json.loads(command["data"]["output"].strip().splitlines()[-1])
    assert statuses["/v1/approvals/" + question["id"] + "/decision"] == "404"
    assert all(code in ("404", "400") for code in statuses.values()), statuses
    still = await client.call("GET", f"/v1/approvals/{question['id']}")
    assert still["status"] == "pending"
    await client.call("POST", f"/v1/approvals/{question['id']}/decision", body={"decision": "deny"})
    await wait_terminal(client, asking["threadId"], asking["runId"], total=20)
