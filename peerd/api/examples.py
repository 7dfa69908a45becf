"""Example answers for the API reference, in wire form (camelCase), shared by the route tables.

Each example is checked against its route's answer model (`tests/unit/test_openapi.py`), so the
reference never shows a field the API does not send.
"""

from __future__ import annotations

from typing import Any

ENV = "K7QW2M-PX4TNB-H3ZR9C-V8LD6E"
BOX = "B2XHJ4-M8QZRT-W6PLN3-C9VKD5"
FP = "sha256:" + "3b" * 32
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
PRJ, THR, RUN, ITM = (
    "prj_5f0c1e9a2b7d4c3e8a61",
    "thr_0a4d9e27c1f3b8655d2e",
    "run_9c2e7b41d0a3f6e85c17",
    "itm_4e1b",
)
TSK, CLI, PCD, ORC = (
    "tsk_7d3a0c9e5b1f2e4a8c66",
    "cli_2b8e5d1c9a7f3e0d4b12",
    "pcd_1f4c",
    "orc_6a2d8e0b3c9f1e5d7a44",
)

DESCRIPTOR = {
    "service": "peerd",
    "environmentId": ENV,
    "label": "laptop",
    "protocolVersion": 1,
    "version": "0.1.0",
    "capabilities": ["threads", "projects", "long-poll", "events", "links"],
}
STATUS = {
    "environmentId": ENV,
    "label": "laptop",
    "version": "0.1.0",
    "protocolVersion": 1,
    "fingerprint": FP,
    "listeners": [
        {"kind": "unix", "address": "/home/ana/.local/share/peerd/peerd.sock", "tls": False},
        {"kind": "tcp", "address": "0.0.0.0:7433", "tls": True},
    ],
    "counts": {"projects": 1, "threads": 3, "liveRuns": 1},
    "home": "/home/ana/.local/share/peerd",
}
PROJECT = {
    "id": PRJ,
    "name": "shop",
    "path": "/home/ana/src/shop",
    "repositoryKey": "github.com/ana/shop",
    "createdAt": T0,
}
RUN_DONE = {
    "id": RUN,
    "threadId": THR,
    "number": 1,
    "status": "completed",
    "reason": None,
    "exitCode": 0,
    "createdAt": T0 + 60,
    "startedAt": T0 + 61,
    "endedAt": T0 + 95,
}
THREAD = {
    "id": THR,
    "projectId": PRJ,
    "title": "Fix the flaky checkout test",
    "provider": "claude",
    "model": None,
    "runtimeMode": "auto-accept-edits",
    "interactionMode": "default",
    "status": "active",
    "queueHeld": False,
    "inPlace": False,
    "worktreePath": f"/home/ana/.local/share/peerd/worktrees/{PRJ}/{THR}",
    "branch": f"peerd/{THR}",
    "providerSession": None,
    "createdAt": T0 + 60,
    "updatedAt": T0 + 95,
    "latestRun": RUN_DONE,
    "startedBy": "owner",
}
LAUNCH = {
    "projectId": PRJ,
    "prompt": "Fix the flaky checkout test; run the suite twice.",
    "provider": "claude",
    "clientRequestId": "c1f0",
}
LAUNCHED = {
    "threadId": THR,
    "projectId": PRJ,
    "runId": RUN,
    "status": "queued",
    "provider": "claude",
    "model": None,
    "runtimeMode": "auto-accept-edits",
    "interactionMode": "default",
    "worktreePath": THREAD["worktreePath"],
    "replayed": False,
}
ITEM = {
    "id": ITM,
    "threadId": THR,
    "runId": RUN,
    "position": 3,
    "kind": "assistant_message",
    "text": "The test waited on a timer; it now waits on the order event.",
    "textLength": 61,
    "data": {},
    "createdAt": T0 + 90,
}
READ = {"thread": THREAD, "items": [ITEM], "hasMore": False, "nextPosition": None}
_PATCH = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-a - b\n+a + b\n"
DIFF = {
    "threadId": THR,
    "base": "5d41402abc4b2a76b9719d911017c592a1e3b0c4",
    "head": "9e107d9d372bb6826bd81d3542a419d6e4f1c2d8",
    "files": [{"path": "calc.py", "change": "modified", "added": 1, "removed": 1, "patch": _PATCH}],
    "added": 1,
    "removed": 1,
}
SENT = {"threadId": THR, "runId": RUN, "status": "queued", "queueHeld": False, "replayed": False}
WAITED = {"threadId": THR, "runId": RUN, "status": "completed", "terminal": True, "timedOut": False}
INTERRUPTED = {"threadId": THR, "runId": RUN, "status": "interrupt_requested", "queueHeld": True}
ARCHIVED = {"threadId": THR, "status": "archived", "worktreeRemoved": True, "discarded": []}
EVENTS = {
    "events": [
        {"seq": 8, "threadId": THR, "type": "run.completed", "data": {"runId": RUN}, "createdAt": T0 + 95}
    ],
    "nextCursor": 8,
}
TASK = {
    "taskId": TSK,
    "status": "completed",
    "title": "Review the payment change",
    "parentThreadId": THR,
    "childThreadId": "thr_5b1e8c3d7a0f2e9c4d61",
    "childRunId": "run_1e6d0a3f9c2b7e4d8a55",
    "result": "Two issues: the retry loop and a missing test for refunds.",
    "createdAt": T0 + 100,
    "endedAt": T0 + 400,
}
WT = "wt_3c9e1a7f5b2d8e0a4c61"
WAIT = {
    "waitId": WT,
    "status": "delivered",
    "threadId": THR,
    "pr": "42",
    "until": "checks",
    "outcome": "failed",
    "prUrl": "https://github.com/o/r/pull/42",
    "prState": "OPEN",
    "reviewDecision": "REVIEW_REQUIRED",
    "checks": [
        {
            "name": "build",
            "state": "FAILURE",
            "bucket": "fail",
            "link": "https://github.com/o/r/actions/runs/9/job/1",
        },
        {"name": "lint", "state": "SUCCESS", "bucket": "pass"},
    ],
    "polls": 6,
    "wokenRunId": RUN,
    "deadlineAt": T0 + 86_500,
    "createdAt": T0 + 100,
    "endedAt": T0 + 280,
}
WATCHING = {**WAIT, "status": "watching", "outcome": None, "checks": [], "wokenRunId": None, "endedAt": None,
            "polls": 0, "prUrl": None, "prState": None, "reviewDecision": None}  # fmt: skip
WATCHED = {
    "runs": [
        {
            "threadId": THR,
            "runId": RUN,
            "status": "completed",
            "settled": True,
            "found": True,
            "resultRunId": RUN,
        }
    ],
    "timedOut": False,
}
PAIRING = {
    "id": PCD,
    "access": "approval-required",
    "labelHint": "laptop",
    "createdAt": T0,
    "expiresAt": T0 + 600,
    "state": "open",
    "failedAttempts": 0,
}
PAIR_CODE = f"peerd1.{PCD}.Xq3v9TzK0bR2mW8s"
CLIENT = {
    "id": CLI,
    "label": "laptop",
    "environmentId": ENV,
    "access": "approval-required",
    "createdAt": T0,
    "lastSeenAt": T0 + 300,
    "lastAddress": "192.0.2.10",
    "expiresAt": None,
    "revokedAt": None,
    "revokedReason": None,
    "status": "active",
}
LINK = {
    "environmentId": BOX,
    "label": "box",
    "urls": ["https://box.lan:7433"],
    "access": "approval-required",
    "fingerprint": FP,
    "status": "reachable",
    "linkedAt": T0,
    "lastReachedAt": T0 + 300,
    "lastError": None,
    "expiresAt": None,
    "live": True,
}
PROVIDER = {
    "name": "claude",
    "kind": "claude",
    "binary": "claude",
    "path": "/usr/local/bin/claude",
    "found": True,
    "version": "2.0.14",
    "model": None,
}
ORCHESTRATION = {
    "id": ORC,
    "projectId": PRJ,
    "task": "Split the payment module",
    "status": "running",
    "packets": [{"id": "p1", "goal": "Extract the refund code", "state": "running", "threadId": THR}],
    "receipts": [],
}
CONFIG: dict[str, Any] = {"label": "laptop", "listen": "0.0.0.0:7433", "tls": True, "advertise": []}

# A thread's move (peerd/handoff/), as `thread_move` and `POST /v1/threads/{id}/move` answer it.
MOVE: dict[str, Any] = {
    "moveId": "mov_5b1e0c7d9a2f4e6b8c1d",
    "threadId": THR,
    "environmentId": BOX,
    "state": "waiting",
    "startedBy": f"run:{RUN}",
    "message": "Carry on with the refund tests.",
    "snapshot": None,
    "branchThere": None,
    "keptRef": None,
    "movedTo": None,
    "error": None,
    "createdAt": T0,
    "updatedAt": T0,
    "replayed": False,
}

# The agent tools (`POST /v1/tools/{name}`): what an agent sends and the `result` it gets.
TOOLS: dict[str, Any] = {
    "delegate_task": (
        {"task": "Review the payment change", "role": "review", "target": {"environmentId": "box"}},
        {**TASK, "status": "running", "result": None, "endedAt": None},
    ),
    "task_status": ({"taskId": TSK, "wait": True, "timeoutMs": 30000}, TASK),
    "task_cancel": ({"taskId": TSK, "reason": "not needed"}, {**TASK, "status": "cancelled"}),
    "wait_for_github": ({"pr": "42", "until": "checks"}, WATCHING),
    "list_waits": ({"status": "watching"}, {"items": [WATCHING]}),
    "cancel_wait": (
        {"waitId": WT, "reason": "merged by hand"},
        {**WATCHING, "status": "cancelled", "detail": "merged by hand", "endedAt": T0 + 200},
    ),
    "thread_launch": (LAUNCH, LAUNCHED),
    "thread_read": ({"threadId": THR, "afterPosition": 2}, READ),
    "thread_wait": ({"threadId": THR, "timeout": 30}, WAITED),
    "thread_send": ({"threadId": THR, "text": "Also run the linter."}, SENT),
    "thread_interrupt": ({"threadId": THR, "stop": True}, INTERRUPTED),
    "thread_move": (
        {"to": "box", "message": "Carry on with the refund tests."},
        {"move": MOVE, "candidates": None},
    ),
    "project_list": ({}, {"items": [PROJECT], "nextCursor": None}),
    "environment_list": ({}, {"items": [LINK]}),
}
