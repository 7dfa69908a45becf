"""Approvals on the wire: the view a person decides on, the decision, the list.

    GET  /v1/approvals?all=&limit=&changedFrom=&timeout=   {items: [Approval], pendingHash}
    GET  /v1/approvals/{id}                                Approval
    POST /v1/approvals/{id}/decision {decision, scope?, reason?, decisionId?}  -> Approval

On the owner socket the list holds this machine's approvals and, marked `onBox`, the pending
approvals of linked boxes for the work this machine started there. Over a link (a box's network
listener) it holds only the approvals of work that link started; deciding there needs the link's
access above read-only. `changedFrom` + `timeout` make the list a long-poll: it answers when the
pending set's hash differs from `changedFrom` (at once if it already does), or at the timeout.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from peerd.approvals.rules import Approval as Record
from peerd.contracts import LONG_POLL_MAX_S, Input, Wire

PENDING_HASH = r"^[0-9a-f]{16}$"
# At most this many of a box's pending approvals are taken from it (a box sending more is refused:
# its answer is not taken at all), and at most this long a text of each.
MAX_MIRRORED = 500
MAX_TEXT = 20_000


class ApprovalView(Wire):
    id: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    status: Literal["pending", "approved", "denied", "expired", "cancelled"]
    kind: Literal["command", "file_change", "mcp_tool", "tool"]
    tool: str = Field(max_length=200)
    summary: str = Field(max_length=MAX_TEXT)
    detail: dict[str, Any] = Field(default_factory=dict)
    thread_id: str = Field(max_length=64)
    run_id: str = Field(max_length=64)
    environment_id: str | None = None  # null: this machine; else the linked box it waits on
    environment_label: str | None = None
    on_box: bool = False
    link_label: str | None = None  # on the box: the linked machine whose work asks
    parent_task_id: str | None = None
    parent_thread_id: str | None = None
    created_at: float
    deadline_at: float
    decided_at: float | None = None
    decided_by: str | None = None
    scope: Literal["once", "run", "command"] | None = None
    reason: str | None = None

    @classmethod
    def of(cls, record: Record) -> ApprovalView:
        return cls(
            id=record.id,
            status=record.status,
            kind=record.kind,
            tool=record.tool,
            summary=record.summary,
            detail=dict(record.detail),
            thread_id=record.thread_id,
            run_id=record.run_id,
            link_label=record.link_label,
            parent_task_id=record.parent_task_id,
            parent_thread_id=record.parent_thread_id,
            created_at=record.created_at,
            deadline_at=record.deadline_at,
            decided_at=record.decided_at,
            decided_by=record.decided_by,
            scope=record.scope,
            reason=record.reason,
        )


class ApprovalPage(Wire):
    items: list[ApprovalView]
    pending_hash: str
    stale: list[str] = Field(default_factory=list)  # linked boxes not reached now: last known shown


class ApprovalListQuery(Input):
    all: bool = Field(default=False, description="true: decided ones too (newest first), not only pending")
    limit: int = Field(default=100, ge=1, le=500)
    changed_from: str | None = Field(default=None, pattern=PENDING_HASH)
    timeout: float = Field(default=0.0, ge=0, le=LONG_POLL_MAX_S)


class ApprovalDecisionBody(Input):
    decision: Literal["approve", "deny"]
    scope: Literal["once", "run", "command"] = "once"
    reason: str | None = Field(default=None, max_length=2000)
    decision_id: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
