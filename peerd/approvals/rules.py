"""The rules of approvals, pure: no store, no clock of their own, no I/O.

- A pending approval is decided once: the first decision wins, a second one is told who decided
  (`approval_decided`), and the same decision sent again (same `decisionId`, same answer) is
  answered as the first (a retry over a link is idempotent); the same `decisionId` with another
  answer is a second decision, refused `approval_decided` like any other (`same_answer`).
- A deadline denies: past `deadline_at` a pending approval is `expired`, with a reason the model
  sees.
- Who may decide: this machine's owner, always; a linked machine only for a thread that link
  started here, only while the link's access is above read-only (a read-only link can watch, not
  act), and never a revoked link (refused before this rule, by the link's authentication).
- Standing grants: "always for this run" approves every later question of the same run; "always
  for this command" every later question of the same run with the same digest (the same tool with
  the same exact input).
- A decided question whose run ended before the answer reached it (a daemon restart) is owed to
  the thread: the next question there with the same digest gets it, once (`delivered_at`).
- A question outlives no run: a pending question whose run is no longer live (it ended, or a
  restart cut it) is withdrawn (`cancelled`, by `run_ended`: at the run's end, at start-up, and by
  the sweep of open work), and a decision on a withdrawn question is refused (`approval_withdrawn`).
  A withdrawn question is owed to nobody: a later run that asks the same asks anew.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from peerd.runtime.gate import ApprovalAnswer, AskKind

Status = Literal["pending", "approved", "denied", "expired", "cancelled"]
Scope = Literal["once", "run", "command"]
Verdict = Literal["approve", "deny"]
LinkPolicy = Literal["ask", "deny"]

DEFAULT_DEADLINE_S = 30 * 60.0
OWNER = "owner"


def digest(kind: str, tool: str, detail: Mapping[str, Any]) -> str:
    """The identity of an action: the same tool with the same exact input."""
    canonical = json.dumps([kind, tool, detail], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Approval:
    id: str
    run_id: str
    thread_id: str
    ask_key: str
    kind: AskKind
    tool: str
    summary: str
    detail: Mapping[str, Any]
    digest: str
    created_at: float
    deadline_at: float
    status: Status = "pending"
    link_origin: str | None = None  # the link that started the thread (its client id)
    link_label: str | None = None
    parent_task_id: str | None = None  # the task that delegated the thread here, if any
    parent_thread_id: str | None = None
    scope: Scope | None = None
    reason: str | None = None
    decided_by: str | None = None  # owner | link:<client id> | deadline | run_ended
    decision_id: str | None = None
    decided_at: float | None = None
    delivered_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    def answer(self) -> ApprovalAnswer:
        """What the CLI is told once this is decided."""
        if self.status == "approved":
            return ApprovalAnswer(True, "", self.id)
        return ApprovalAnswer(False, denial_message(self), self.id)


def denial_message(approval: Approval) -> str:
    """The sentence the model sees for a refused action."""
    if approval.status == "expired":
        return (
            f"Not allowed: nobody approved {approval.summary} before its deadline. Do not retry it; "
            "carry on without it or finish and say what is left."
        )
    if approval.status == "cancelled":
        return f"Not allowed: {approval.reason or 'the question was withdrawn'}."
    why = (approval.reason or "").strip()
    who = (
        "the person"
        if approval.decided_by in (OWNER, None) or (approval.decided_by or "").startswith("link:")
        else "peerd"
    )
    return f"Not allowed: {who} denied {approval.summary}" + (f": {why}" if why else ".")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    by: str  # owner | link:<client id>
    scope: Scope = "once"
    reason: str | None = None
    decision_id: str | None = None


class AlreadyDecided(Exception):
    """The first decision won; `approval` is what it decided."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(approval.id)
        self.approval = approval


class Withdrawn(AlreadyDecided):
    """The question was withdrawn (its run is gone) before anyone decided: no decision lands."""


def decide(approval: Approval, decision: Decision, *, now: float) -> Approval:
    """Apply a person's decision to a pending approval, or say why not.

    The same decision retried (same decision id, same verdict and scope) returns the record
    unchanged; anything else after the first decision, the same decision id with another answer
    included, is `AlreadyDecided`."""
    if approval.status == "cancelled":
        raise Withdrawn(approval)
    if not approval.pending:
        if (
            decision.decision_id is not None
            and approval.decision_id == decision.decision_id
            and approval.decided_by == decision.by
            and same_answer(approval, decision)
        ):
            return approval
        raise AlreadyDecided(approval)
    status: Status = "approved" if decision.verdict == "approve" else "denied"
    return replace(
        approval,
        status=status,
        scope=decision.scope if status == "approved" else None,
        reason=decision.reason,
        decided_by=decision.by,
        decision_id=decision.decision_id,
        decided_at=now,
    )


def same_answer(approval: Approval, decision: Decision) -> bool:
    """Whether `decision` says what the decided `approval` says: its verdict and, approved, its scope."""
    if decision.verdict == "approve":
        return approval.status == "approved" and approval.scope == decision.scope
    return approval.status == "denied"


def expire(approval: Approval, *, now: float) -> Approval | None:
    """The deadline's denial, if it has passed."""
    if not approval.pending or now < approval.deadline_at:
        return None
    return replace(approval, status="expired", decided_by="deadline", decided_at=now)


def cancel(approval: Approval, reason: str, *, now: float) -> Approval:
    return replace(approval, status="cancelled", reason=reason, decided_by="run_ended", decided_at=now)


def may_decide(approval: Approval, *, link_client: str | None, link_runtime: str | None) -> str | None:
    """None when the caller may decide; else the sentence saying why not. The owner
    (`link_client` None) always may."""
    if link_client is None:
        return None
    if approval.link_origin != link_client:
        return "That approval is not one of this link's: it belongs to work another machine started."
    if link_runtime == "read-only":
        return (
            "This link is read-only: it can see the approvals of the work it started but not decide them. "
            "Decide on that machine, or ask its owner to re-pair this link with more access."
        )
    return None


def standing_grant(asked_digest: str, grants: list[Approval]) -> Approval | None:
    """An earlier approval of the same run that also covers this question, if any."""
    for grant in grants:
        if grant.status != "approved":
            continue
        if grant.scope == "run" or (grant.scope == "command" and grant.digest == asked_digest):
            return grant
    return None


def owed_to(asked_digest: str, owed: list[Approval]) -> Approval | None:
    """A decision made after its run ended (a restart) that this question inherits, once."""
    for record in owed:
        if (
            record.digest == asked_digest
            and record.delivered_at is None
            and record.status in ("approved", "denied", "expired")
        ):
            return record
    return None


def ask_waits(policy: LinkPolicy, approval_link: str | None) -> bool:
    """Whether a question from a link's run waits for a person (`ask`) or is denied at once."""
    return approval_link is None or policy == "ask"


LINK_DENIES = (
    "Not allowed: this machine's owner does not take approval requests for work this link starts "
    "(the link's approvals policy is deny). Carry on without it, or finish and say what is left."
)
