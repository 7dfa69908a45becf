"""`--until checks|review|merged`, the pure part: what an orchestration does when the wait on its
pull request ends, and the fix packet it sends. No store, clock or gh here: `prwait.py` polls
through the waits' own reads (`waits/gh.py`) and machine (`waits/machine.py`: `step`, `judge`,
the backoffs), records each poll in the orchestration's receipts and does what `decide` says.

    the wait ended (machine.Deliver)
        passed | approved | merged                 -> Finish(completed)
        failed | changes_requested, attempts left,  -> Fix(reason): one fix packet, to the
            the run within its budget                  implementer, with the failing checks and
                                                       their log's tail, or the review's words
        failed | changes_requested, no attempt left -> Finish(failed, why)
        past the run's budget                       -> Finish(failed, the budget's reason)
        closed | timed_out | error                  -> Finish(failed, why)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from peerd.orchestrate.models import PacketSpec, PrCheck, PrFixReceipt, PrWaitReceipt, Until
from peerd.waits import machine

FIX_LIMIT = 2  # fix attempts per orchestration, checks and reviews together
WAIT_HOURS = 24.0  # each round of the wait ends `timed_out` past this
FIX_PREFIX = "pr-fix-"
LOG_IN_PROMPT = 4000


@dataclass(frozen=True)
class Finish:
    status: Literal["completed", "failed"]
    why: str  # added to the run's reason


@dataclass(frozen=True)
class Fix:
    reason: Literal["checks_failed", "changes_requested"]
    attempt: int


_WELL = {
    "passed": "its checks passed",
    "approved": "its review approved it",
    "merged": "it was merged",
}


def decide(outcome: str, detail: str, *, attempts: int, over_budget: str | None) -> Finish | Fix:
    """What the run does when its wait ended with `outcome` after `attempts` fix attempts."""
    if outcome in _WELL:
        return Finish("completed", f"pull request: {_WELL[outcome]}")
    if outcome in ("failed", "changes_requested"):
        said = "its checks failed" if outcome == "failed" else "a review asked for changes"
        if over_budget is not None:
            return Finish("failed", f"pull request: {said}, and the run is past its budget ({over_budget})")
        if attempts >= FIX_LIMIT:
            return Finish("failed", f"pull request: {said} again after {attempts} fix attempt(s), the limit")
        reason: Literal["checks_failed", "changes_requested"] = (
            "checks_failed" if outcome == "failed" else "changes_requested"
        )
        return Fix(reason, attempts + 1)
    if outcome == "closed":
        return Finish("failed", "pull request: it was closed without being merged")
    if outcome == "timed_out":
        return Finish("failed", f"pull request: the wait ended after {WAIT_HOURS:g} h without an answer")
    return Finish("failed", f"pull request: the wait could not go on: {detail}")


def pr_ref(url: str, branch: str, repository_key: str | None) -> tuple[str, str | None]:
    """What gh is asked for (the number; the branch if the URL has none) and in which repository:
    the project's own (`machine.scope_pr`), or, when the pull request is elsewhere or the origin
    is not GitHub's, as gh resolves it in the checkout."""
    try:
        return machine.scope_pr(url, repository_key)
    except ValueError:
        last = url.rstrip("/").rsplit("/", 1)[-1]
        return (last if last.isdigit() else branch), None


def watch_of(wait: PrWaitReceipt) -> machine.Watch:
    return machine.Watch(
        until=wait.until,
        deadline=wait.deadline_at,
        status=wait.status,
        failures=wait.failures,
        rate_limited=wait.rate_limited,
        baseline=wait.baseline,
        head=wait.head,
    )


def checks_of(snapshot: machine.Snapshot) -> list[PrCheck]:
    return [
        PrCheck(name=c.name, state=c.state, bucket=c.bucket, link=c.link or None) for c in snapshot.checks
    ]


def polled(
    wait: PrWaitReceipt,
    watch: machine.Watch,
    snapshot: machine.Snapshot | None,
    *,
    error: str | None,
    delay_s: float | None,
    now: float,
) -> PrWaitReceipt:
    """The wait's receipt after one poll (pure)."""
    update: dict[str, object] = {
        "polls": wait.polls + 1,
        "failures": watch.failures,
        "rate_limited": watch.rate_limited,
        "baseline": watch.baseline,
        "last_error": error,
        "delay_s": delay_s,
        "next_at": None if delay_s is None else now + delay_s,
        "at": now,
    }
    if snapshot is not None:
        update |= {
            "url": snapshot.pr.url or wait.url,
            "pr_state": snapshot.pr.state or None,
            "review_decision": snapshot.pr.review_decision or None,
            "checks": checks_of(snapshot),
        }
    return wait.model_copy(update=update)


def worth_recording(before: PrWaitReceipt, after: PrWaitReceipt) -> bool:
    """A poll is written when it changed what the wait knows (what GitHub said, a failure, a
    backoff), not when it saw the same as the last one: hours of CI stay a handful of receipts."""
    keys = (
        "failures",
        "rate_limited",
        "baseline",
        "last_error",
        "url",
        "pr_state",
        "review_decision",
        "checks",
    )
    return any(getattr(before, k) != getattr(after, k) for k in keys)


def failing(checks: list[PrCheck]) -> list[PrCheck]:
    return [c for c in checks if c.bucket in ("fail", "cancel")]


def fix_goal(
    reason: Literal["checks_failed", "changes_requested"],
    *,
    url: str | None,
    failing_checks: list[PrCheck],
    log_tail: str,
    remarks: list[str],
) -> str:
    """The fix packet's goal: what the pull request said, quoted (pure)."""
    where = url or "this work's pull request"
    if reason == "checks_failed":
        lines = [f"The CI checks of {where} failed on this code. Fix the code so that they pass.", ""]
        lines.append("Failing checks:")
        lines += [f"- {c.name}: {c.state}" + (f" ({c.link})" if c.link else "") for c in failing_checks]
        if log_tail:
            lines += ["", "The failing job's log ends:", "```", log_tail[-LOG_IN_PROMPT:], "```"]
    else:
        lines = [f"A review of {where} asked for changes. Make the changes it asks for.", ""]
        lines.append("What the review and the comments say:")
        lines += [f"- {r}" for r in remarks] or ["- (the review gave no text)"]
    lines += ["", "Change only what this needs; the change goes to the same pull request."]
    return "\n".join(lines)


def fix_spec(attempt: int, goal: str, files: list[str], verify: str) -> PacketSpec:
    """The fix packet: the files of the packets it fixes (any other change may go too: a failing
    check can be anywhere, and the reviewer sees it), checked as the run is."""
    return PacketSpec(
        id=f"{FIX_PREFIX}{attempt}",
        goal=goal,
        files=files or ["."],
        verify=verify,
        allow_out_of_scope=True,
    )


__all__ = [
    "FIX_LIMIT",
    "Finish",
    "Fix",
    "Until",
    "decide",
    "fix_goal",
    "fix_spec",
    "polled",
    "pr_ref",
    "watch_of",
    "worth_recording",
]


class PacketState(Protocol):
    """What `fix_not_made` reads of a packet (`store.PacketRow`)."""

    @property
    def packet_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def failure(self) -> str | None: ...


def fix_not_made(fix: PrFixReceipt | None, packets: Sequence[PacketState]) -> str | None:
    """Why the last fix packet did not reach the pull request (it was not integrated: parked,
    failed, or cancelled), None when it did or there is none."""
    if fix is None:
        return None
    packet = next((p for p in packets if p.packet_id == fix.packet_id), None)
    if packet is None or packet.state == "integrated":
        return None
    failure = f": {packet.failure}" if packet.failure else ""
    return (
        f"pull request: fix attempt {fix.attempt} ({fix.packet_id}) was not integrated "
        f"({packet.state}{failure}); the pull request stays as it was"
    )
