"""What the implement, verify and review hops decide, pure: `decide_implement`, `decide_verify`
and `decide_review` take the packet as recorded (a view of it, its memo typed) and what just
happened (an event), and return what to do (effects, in order). They read no store, run no check,
wait for nothing and read no clock: the hops in `implement.py` and `review.py` gather each fact,
ask here, and perform the effects.

A decision that needs a fact the hop has not gathered yet (whether a stop of its daemon cut the
coder's run, the run's items, the commit of its work) asks for it with a `Need...` effect; the hop
gathers it and asks again with the event completed. So each fact is read only when a decision
needs it, as the hops always did (a run past its budget is parked without reading its items).

    implement:  Begin -> Launch | Send | Wait(deadline);  Launched / Sent -> Record
                TurnEnded(status, over_budget, cut?, outcome?, collected?)
                    -> over budget: RecordImpl(budget), StopOverBudget
                    -> timed out: Interrupt, then a failure (below)
                    -> cut by a restart: Send (resume, not a retry)
                    -> not completed, or no new commit: a failure (below)
                    -> Record(verifying, the commit)
                a failure: RecordImpl(its class), then Park (re-dispatched once already, or no
                other coder) or Redispatch(the next coder, a new branch, attempt + 1)
    verify:     Checked(verification) -> Record(reviewing) | Record(implementing, hop fix) | Park
    review:     ReviewBegin -> WaitReviewer (this round's thread) | ArchiveReviewer?, LaunchReviewer
                ReviewerLaunched / ReviewerAsked -> Record
                ReviewerEnded(ask, status, over_budget, outcome?)
                    -> StopOverBudget | Park (its run failed; no valid verdict, asked twice)
                    -> AskReviewerAgain (once)
                    -> WriteReview, then Record(approved) | Record + Park (held: out of scope)
                       | Record(implementing, hop changes) (once) | Park (rejected)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from peerd.core.usage import Measure
from peerd.orchestrate import scope
from peerd.orchestrate.context import OUTPUT_TAIL, RETRY_LIMIT, TIMED_OUT, RunOutcome
from peerd.orchestrate.escapes import Collected
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import (
    Classification,
    CoderChoice,
    PacketSpec,
    ReviewVerdict,
    VerificationResult,
)
from peerd.orchestrate.prompts import scripted_review, tail
from peerd.orchestrate.verdicts import parse_review_reply

COMMON_EVIDENCE: dict[str, str] = {
    "empty_diff": "the coder's run completed and its worktree holds no change from the base commit",
    "coder_error": "the coder's run did not complete (its status, and what it reported, are below)",
    "timeout": "peerd stopped the coder's turn at --packet-timeout",
}
RESUME_TEXT = (
    "peerd restarted while you were working; what you did so far is in your workspace. Continue "
    "the task below from where you were, then report.\n\n"
)


# --- what a decision sees ------------------------------------------------------------------------


@dataclass(frozen=True)
class Packet:
    """A packet, as the implement and verify hops' decisions need it."""

    orchestration_id: str
    packet_id: str
    attempt: int
    thread_id: str | None
    run_id: str | None  # the coder's current run
    memo: PacketMemo
    base: str  # the commit it starts from (the memo's, else the run's)
    spec: PacketSpec
    coder: CoderChoice
    coders: Sequence[CoderChoice] = ()  # the run's, in order: a re-dispatch takes the first other one
    packet_timeout_s: float | None = None
    commit_sha: str | None = None  # the commit its check ran on


@dataclass(frozen=True)
class Reviewed:
    """A packet, as the review hop's decisions need it."""

    packet_id: str
    run_id: str | None  # the implementer's current run (a request for changes follows it)
    branch: str | None
    memo: PacketMemo
    spec: PacketSpec
    reviewer: CoderChoice
    held: Sequence[str] = ()  # what its commit changes outside its files that nothing allows

    @property
    def by(self) -> str:
        choice = self.reviewer
        return f"{choice.spec}, {'on ' + choice.environment if choice.environment else 'here'}"

    @property
    def round(self) -> int:
        return self.memo.changes + 1


# --- effects -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """Write the packet: these columns and the memo (`OrchestrationContext.set`)."""

    memo: PacketMemo
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Park:
    why: str


@dataclass(frozen=True)
class StopOverBudget:
    why: str


@dataclass(frozen=True)
class Launch:
    """The coder's first turn on this attempt (the hop builds the prompt)."""

    key: str


@dataclass(frozen=True)
class Send:
    """A follow-up in the coder's session: a pending fix or changes, or a resume after a restart."""

    kind: Literal["pending", "resume"]
    n: int
    key: str
    text: str


@dataclass(frozen=True)
class Wait:
    deadline: float | None


@dataclass(frozen=True)
class NeedCut:
    """Ask whether a stop of its daemon cut the run (its `daemon_stopped` item)."""


@dataclass(frozen=True)
class NeedOutcome:
    """Read the run's items."""


@dataclass(frozen=True)
class NeedCollect:
    """Commit the coder's work (containment first, here) and tell its tip."""

    hop_runs: Sequence[str]


@dataclass(frozen=True)
class Interrupt:
    reason: str


@dataclass(frozen=True)
class RecordImpl:
    """An implementation receipt from this memo (its usage from the memo's `hop_runs`)."""

    memo: PacketMemo
    commit: str | None
    verification: VerificationResult


@dataclass(frozen=True)
class Redispatch:
    """To the next coder (placed first, when it is `auto`), from the same base on a new branch;
    the first coder's local worktree goes (`archive`)."""

    coder: CoderChoice
    attempt: int
    branch: str
    archive: str | None
    memo: PacketMemo


@dataclass(frozen=True)
class WaitReviewer:
    thread_id: str
    run_id: str | None  # (recorded with the thread: None would be a bug the hop stops at)


@dataclass(frozen=True)
class ArchiveReviewer:
    """The last round's reviewer is done: its checkout can go."""

    thread_id: str
    environment: str | None


@dataclass(frozen=True)
class LaunchReviewer:
    key: str
    round: int


@dataclass(frozen=True)
class AskReviewerAgain:
    key: str
    text: str


@dataclass(frozen=True)
class WriteReview:
    """The review receipt (its usage from `runs`)."""

    verdict: ReviewVerdict
    round: int
    held: str | None
    started_at: float | None
    runs: Sequence[str]


Effect = (
    Record | Park | StopOverBudget | Launch | Send | Wait | NeedCut | NeedOutcome | NeedCollect | Interrupt
    | RecordImpl | Redispatch | WaitReviewer | ArchiveReviewer | LaunchReviewer | AskReviewerAgain | WriteReview
)  # fmt: skip


# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    """The implement hop starts (or resumes after a restart)."""


@dataclass(frozen=True)
class Launched:
    thread_id: str
    run_id: str
    prompt: str
    deadline: float | None  # --packet-timeout: when this turn must end
    now: float


@dataclass(frozen=True)
class Sent:
    send: Send
    run_id: str
    deadline: float | None
    now: float


@dataclass(frozen=True)
class TurnEnded:
    """The coder's run ended (or its deadline came), with the facts gathered so far."""

    status: str  # the run's status, or TIMED_OUT
    over_budget: str | None  # why, when the run's usage passed a budget
    over_budget_by: Measure | None = None  # which limit it passed: what the evidence says was measured
    cut: bool | None = None  # None: not asked
    outcome: RunOutcome | None = None  # None: not read
    collected: Collected | None = None  # None: not collected


@dataclass(frozen=True)
class Checked:
    """The packet's check ran (and was re-run when the rules say so): its verification, the memo
    as the check left it (its re-run counted), and the output the coder is shown."""

    verification: VerificationResult
    memo: PacketMemo
    output: str


@dataclass(frozen=True)
class ReviewBegin:
    pass


@dataclass(frozen=True)
class ReviewerLaunched:
    thread_id: str
    run_id: str
    now: float


@dataclass(frozen=True)
class ReviewerAsked:
    run_id: str


@dataclass(frozen=True)
class ReviewerEnded:
    ask: int  # 1, or 2 after the one re-ask for a valid verdict
    status: str
    over_budget: str | None
    outcome: RunOutcome | None = None  # None: not read


ImplementEvent = Begin | Launched | Sent | TurnEnded
ReviewEvent = ReviewBegin | ReviewerLaunched | ReviewerAsked | ReviewerEnded


def _memo(memo: PacketMemo, **changes: Any) -> PacketMemo:
    updated = memo.copy_for_update()
    for name, value in changes.items():
        setattr(updated, name, value)
    return updated


# --- implement -----------------------------------------------------------------------------------


def decide_implement(packet: Packet, event: ImplementEvent) -> list[Effect]:
    memo = packet.memo
    if isinstance(event, Begin):
        if packet.thread_id is None:
            return [Launch(f"{packet.packet_id}:impl:{packet.attempt}")]
        if memo.pending_send is not None and packet.run_id == memo.pending_after:
            n = memo.sends + 1
            return [Send("pending", n, f"{packet.packet_id}:send:{n}", memo.pending_send)]
        return [Wait(memo.deadline)]
    if isinstance(event, Launched):
        updated = _memo(
            memo, prompt=event.prompt, deadline=event.deadline, hop_started=event.now, hop_runs=[event.run_id]
        )
        return [Record(updated, {"thread_id": event.thread_id, "run_id": event.run_id})]
    if isinstance(event, Sent):
        if event.send.kind == "resume":  # not a retry; the turn's start stays as it was
            updated = _memo(
                memo, resumes=event.send.n, hop_runs=[*memo.hop_runs, event.run_id], deadline=event.deadline
            )
        else:
            updated = _memo(
                memo,
                sends=event.send.n,
                pending_send=None,
                pending_after=None,
                deadline=event.deadline,
                hop_started=event.now,
                hop_runs=[event.run_id],
            )
        return [Record(updated, {"run_id": event.run_id})]
    return _turn_ended(packet, event)


def _turn_ended(packet: Packet, ended: TurnEnded) -> list[Effect]:
    memo = packet.memo
    if ended.over_budget is not None:
        stopped = _failure(packet, "budget", ended.over_budget, budget_evidence(ended.over_budget_by))
        return [RecordImpl(memo, None, stopped), StopOverBudget(ended.over_budget)]
    if ended.status == TIMED_OUT:
        limit = packet.packet_timeout_s or 0
        detail = f"The coder ran past its {limit:g} s limit."
        return [
            Interrupt("Past the packet's time limit."),
            *redispatch_or_park(packet, memo, "timeout", detail),
        ]
    if ended.status == "interrupted" and ended.cut is None:
        return [NeedCut()]
    if ended.status == "interrupted" and ended.cut:
        # A daemon restart (here or on the box) cut the coder off: it goes on in the same session,
        # without counting as a retry.
        n = memo.resumes + 1
        return [Send("resume", n, f"{packet.packet_id}:resume:{n}", RESUME_TEXT + (memo.prompt or ""))]
    if ended.outcome is None:
        return [NeedOutcome()]
    outcome = ended.outcome
    memo = _memo(memo, report=outcome.reply, coder_errors=list(outcome.problems))
    denial = denial_evidence(outcome)
    if ended.status != "completed":
        detail = f"The coder's run ended {ended.status}." + quoted(outcome)
        return redispatch_or_park(packet, memo, denial[0] if denial else "coder_error", detail, denial)
    if ended.collected is None:
        return [NeedCollect(list(memo.hop_runs or [packet.run_id or ""]))]
    found = ended.collected
    memo = memo.copy_for_update()
    found.record(memo)
    if found.tip is None or found.tip == packet.base:
        detail = "The coder changed nothing." + quoted(outcome)
        return redispatch_or_park(packet, memo, denial[0] if denial else "empty_diff", detail, denial)
    return [Record(memo, {"state": "verifying", "commit_sha": found.tip})]


def budget_evidence(by: Measure | None) -> str:
    """What peerd measured against the budget a hop passed: the usage its runs reported, or, for a
    time limit, their elapsed time (measured whether or not the coder reports usage)."""
    if by == "seconds":
        return (
            "the elapsed time of its runs, measured by peerd from each run's start to its end "
            "(whether or not the coder reports usage), passed the budget's seconds"
        )
    return "the usage its runs reported, summed by peerd, passed the budget"


def _failure(packet: Packet, kind: Classification, tail_text: str, evidence: str) -> VerificationResult:
    return VerificationResult(
        command=packet.spec.verify,
        exit_code=None,
        passed=False,
        timed_out=kind == "timeout",
        output_tail=tail_text,
        classification=kind,
        evidence=evidence,
    )


def redispatch_or_park(
    packet: Packet,
    memo: PacketMemo,
    why: Classification,
    detail: str,
    denial: tuple[Classification, str] | None = None,
) -> list[Effect]:
    """Empty diff, coder error, timeout, or a sandbox denial: another coder once, never more."""
    failed = _failure(
        packet, why, detail[-OUTPUT_TAIL:], denial[1] if denial else COMMON_EVIDENCE.get(why, "")
    )
    recorded: list[Effect] = [RecordImpl(memo, None, failed)]
    if memo.redispatch >= RETRY_LIMIT:
        return [*recorded, Park(f"{detail} (already re-dispatched once)")]
    current = packet.coder
    others = [
        x
        for x in packet.coders
        if (x.backend, x.model, x.environment) != (current.backend, current.model, current.environment)
    ]
    if not others:
        return [*recorded, Park(f"{detail} (no other coder to re-dispatch to)")]
    nxt = others[0].model_copy(update={"reason": f"re-dispatched after {why} from {current.spec}"})
    attempt = packet.attempt + 1
    return [
        *recorded,
        Redispatch(
            coder=nxt,
            attempt=attempt,
            branch=f"orchestrate/{packet.orchestration_id}/{packet.packet_id}-{attempt}",
            # The first coder's worktree goes (its branch stays, for a look); the next coder
            # starts clean from the same base on a branch of its own.
            archive=packet.thread_id if current.environment is None else None,
            memo=_memo(memo, hop_runs=[], redispatch=memo.redispatch + 1, previous_failure=detail),
        ),
    ]


def denial_evidence(outcome: RunOutcome) -> tuple[Classification, str] | None:
    """Environmental by evidence: the coder's own structured events say its sandbox (or policy)
    declined a step; never decided on the words of its reply or output."""
    if not outcome.denials:
        return None
    listed = "; ".join(outcome.denials[:5])
    return "environmental", f"the coder's own events report that its sandbox declined: {listed}"


def quoted(outcome: RunOutcome) -> str:
    """The coder's reported problems and its last reply, quoted for the report."""
    parts = []
    if outcome.problems:
        parts.append("Its run reported:\n" + "\n".join(f"- {line}" for line in outcome.problems))
    if outcome.reply.strip():
        parts.append("Its last reply:\n" + tail(outcome.reply.strip(), 2000))
    return ("\n" + "\n".join(parts)) if parts else ""


# --- verify --------------------------------------------------------------------------------------


def decide_verify(packet: Packet, event: Checked, *, now: float) -> list[Effect]:
    """After the check: its receipt, then reviewing (passed), back to the coder once (content), or
    parked (content again, a timeout)."""
    verification = event.verification
    receipt = RecordImpl(event.memo, packet.commit_sha, verification)
    memo = _memo(event.memo, hop_runs=[])  # the next receipt is for the runs after this one
    if verification.passed:
        return [receipt, Record(_memo(memo, review_started=now), {"state": "reviewing", "hop": "review"})]
    kind = verification.classification
    if kind == "content" and memo.content < RETRY_LIMIT:
        text = (
            f"The verification command failed on your work:\n\n$ {packet.spec.verify}\n{event.output[-8000:]}\n\n"
            "Fix it in the same workspace, run the command again, and report."
        )
        fixed = _memo(memo, content=memo.content + 1, pending_send=text, pending_after=packet.run_id)
        return [receipt, Record(fixed, {"state": "implementing", "hop": "fix"})]
    output = event.output[-OUTPUT_TAIL:]
    why = f"Verification failed ({kind}; {verification.evidence}):\n$ {packet.spec.verify}\n{output}"
    return [receipt, Park(why)]


# --- review --------------------------------------------------------------------------------------


def decide_review(packet: Reviewed, event: ReviewEvent) -> list[Effect]:
    memo, round_n = packet.memo, packet.round
    if isinstance(event, ReviewBegin):
        if memo.review_round == round_n and memo.review_thread is not None:
            return [WaitReviewer(memo.review_thread, memo.review_run)]  # resumed: this round's reviewer
        archive: list[Effect] = []
        if memo.review_thread is not None:  # the last round's reviewer is done: its checkout can go
            archive = [ArchiveReviewer(memo.review_thread, memo.review_env)]
        return [*archive, LaunchReviewer(f"{packet.packet_id}:review:{round_n}", round_n)]
    if isinstance(event, ReviewerLaunched):
        started = memo.review_started if memo.review_started is not None else event.now
        updated = _memo(
            memo,
            review_thread=event.thread_id,
            review_run=event.run_id,
            review_round=round_n,
            review_env=packet.reviewer.environment,
            review_runs=[event.run_id],
            review_started=started,
        )
        return [Record(updated)]
    if isinstance(event, ReviewerAsked):
        return [Record(_memo(memo, review_run=event.run_id, review_runs=[*memo.review_runs, event.run_id]))]
    return _review_ended(packet, event)


def _review_ended(packet: Reviewed, ended: ReviewerEnded) -> list[Effect]:
    memo, round_n, by = packet.memo, packet.round, packet.by
    if ended.over_budget is not None:
        return [StopOverBudget(ended.over_budget)]
    if ended.outcome is None:
        return [NeedOutcome()]
    outcome = ended.outcome
    if ended.status != "completed":
        # The reviewer's run itself failed: say so, with what it reported; asking it again for a
        # verdict would not help.
        reported = "\n".join(f"- {line}" for line in outcome.problems) or f"- {outcome.reply or 'no reply'}"
        why = f"The reviewer's run ({by}) ended {ended.status}, so there is no verdict. It reported:\n{reported}"
        return [Park(why)]
    verdict, errors = parse_review_reply(outcome.reply)
    if verdict is None and ended.ask == 1:
        again = (
            "Your answer was not a valid verdict:\n"
            + "\n".join(errors)
            + "\nAnswer with the JSON verdict only."
        )
        if packet.reviewer.backend == "script":
            script = json.dumps({"steps": [{"reply": scripted_review(packet.spec, round_n)}]})
            again = f"```peerd-script\n{script}\n```\n\n{again}"
        return [AskReviewerAgain(f"{packet.packet_id}:review:{round_n}:again", again)]
    if verdict is None:
        return [
            Park(
                f"The reviewer ({by}) gave no valid verdict, asked twice: " + "; ".join(errors)
                + f"\nIts last reply:\n{tail(outcome.reply or '(empty)', 4000)}"
            )
        ]  # fmt: skip
    held = "out_of_scope" if verdict.verdict == "approve" and packet.held else None
    runs = list(memo.review_runs or [memo.review_run or ""])
    receipt = WriteReview(verdict, round_n, held, memo.review_started, runs)
    memo = _memo(memo, review_started=None)
    lines = [f"- {e.file}{':' + str(e.line) if e.line else ''}: {e.reason}" for e in verdict.evidence]
    if held is not None:
        # Approved, but it changes files outside its own that nothing allows: held back whole.
        return [receipt, Record(memo), Park(scope.held_message(packet.packet_id, packet.held, packet.branch))]
    if verdict.verdict == "approve":
        return [receipt, Record(memo, {"state": "approved", "hop": None})]
    if verdict.verdict == "request_changes" and memo.changes < RETRY_LIMIT:
        text = "The reviewer requested changes:\n" + "\n".join(lines) + "\nMake them, verify, and report."
        changes = _memo(memo, changes=round_n, pending_send=text, pending_after=packet.run_id)
        return [receipt, Record(changes, {"state": "implementing", "hop": "changes"})]
    why = "rejected it" if verdict.verdict == "reject" else "requested changes again (the one round is used)"
    return [receipt, Park(f"The reviewer ({by}) {why}: {verdict.summary}\n" + "\n".join(lines))]
