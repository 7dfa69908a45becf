"""The implement, verify and review hops' decisions (peerd/orchestrate/steps.py), without a store,
a socket, git or a clock: each event of a packet's hops and what it decides, every branch the hops
take (tests/orchestrate runs the same hops end to end)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from peerd.orchestrate import steps
from peerd.orchestrate.context import RETRY_LIMIT, TIMED_OUT, RunOutcome
from peerd.orchestrate.escapes import NOT_APPLIED, Collected
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import CheckoutChange, CoderChoice, PacketSpec, VerificationResult

BASE = "b" * 40
TIP = "c" * 40
SPEC = PacketSpec(id="p", goal="Fix add().", files=["calc.py"], verify="pytest -q")
HERE = CoderChoice(spec="script", backend="script", reason="round-robin")
CODEX = CoderChoice(spec="codex", backend="codex", reason="round-robin")
ON_BOX = CoderChoice(spec="box/codex", backend="codex", environment="box", reason="round-robin")
NOTICE = "notice: peerd confines this run"


def packet(memo: PacketMemo | None = None, **changes: object) -> steps.Packet:
    view = steps.Packet(
        orchestration_id="orc_1",
        packet_id="p",
        attempt=1,
        thread_id="thr_1",
        run_id="run_1",
        memo=memo or PacketMemo(base=BASE, prompt="the task", hop_runs=["run_1"], hop_started=5.0),
        base=BASE,
        spec=SPEC,
        coder=HERE,
        coders=[HERE, CODEX],
        packet_timeout_s=600.0,
        commit_sha=TIP,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def only(effects: list[steps.Effect], kind: type[steps.Effect]) -> steps.Effect:
    found = [e for e in effects if isinstance(e, kind)]
    assert len(found) == 1, effects
    return found[0]


def ended(status: str, **facts: object) -> steps.TurnEnded:
    return steps.TurnEnded(status, None, **facts)  # type: ignore[arg-type]


# --- implement: the coder's turn -----------------------------------------------------------------


def test_a_packet_without_a_thread_is_launched_and_the_launch_is_recorded() -> None:
    fresh = packet(PacketMemo(base=BASE), thread_id=None, run_id=None, attempt=2)
    assert steps.decide_implement(fresh, steps.Begin()) == [steps.Launch("p:impl:2")]
    [record] = steps.decide_implement(fresh, steps.Launched("thr_2", "run_2", "prompt", 700.0, 100.0))
    assert isinstance(record, steps.Record)
    assert record.fields == {"thread_id": "thr_2", "run_id": "run_2"}
    assert (record.memo.prompt, record.memo.deadline, record.memo.hop_started) == ("prompt", 700.0, 100.0)
    assert record.memo.hop_runs == ["run_2"] and fresh.memo.hop_runs == [], "the packet's memo is not changed"


def test_a_pending_follow_up_is_sent_once_for_the_run_it_follows_then_the_coder_is_waited_for() -> None:
    memo = PacketMemo(base=BASE, sends=1, pending_send="fix it", pending_after="run_1", deadline=9.0)
    assert steps.decide_implement(packet(memo), steps.Begin()) == [
        steps.Send("pending", 2, "p:send:2", "fix it")
    ]
    other = memo.model_copy(update={"pending_after": "run_0"})
    assert steps.decide_implement(packet(other), steps.Begin()) == [steps.Wait(9.0)]
    send = steps.Send("pending", 2, "p:send:2", "fix it")
    [record] = steps.decide_implement(packet(memo), steps.Sent(send, "run_2", 800.0, 200.0))
    assert isinstance(record, steps.Record) and record.fields == {"run_id": "run_2"}
    m = record.memo
    assert (m.sends, m.pending_send, m.pending_after, m.hop_started, m.hop_runs) == (
        2,
        None,
        None,
        200.0,
        ["run_2"],
    )


def test_past_a_budget_the_packet_stops_with_a_receipt_and_its_items_are_not_read() -> None:
    effects = steps.decide_implement(packet(), steps.TurnEnded("completed", "budget exceeded: 9 of 5 tokens"))
    receipt, stop = effects
    assert isinstance(receipt, steps.RecordImpl) and receipt.verification.classification == "budget"
    assert receipt.verification.output_tail == "budget exceeded: 9 of 5 tokens"
    assert stop == steps.StopOverBudget("budget exceeded: 9 of 5 tokens")


def test_a_turn_past_the_packet_timeout_is_stopped_and_redispatched() -> None:
    effects = steps.decide_implement(packet(), ended(TIMED_OUT))
    assert effects[0] == steps.Interrupt("Past the packet's time limit.")
    receipt = only(effects, steps.RecordImpl)
    assert isinstance(receipt, steps.RecordImpl) and receipt.verification.timed_out
    assert receipt.verification.classification == "timeout"
    assert receipt.memo.hop_runs == ["run_1"], "the receipt counts the turn's runs"
    again = only(effects, steps.Redispatch)
    assert isinstance(again, steps.Redispatch)
    assert (again.attempt, again.branch, again.archive) == (2, "orchestrate/orc_1/p-2", "thr_1")
    assert again.coder.spec == "codex" and again.coder.reason == "re-dispatched after timeout from script"
    assert (again.memo.redispatch, again.memo.hop_runs) == (1, [])
    assert again.memo.previous_failure == "The coder ran past its 600 s limit."


def test_a_coder_cut_off_by_a_restart_goes_on_in_its_session_without_a_retry() -> None:
    assert steps.decide_implement(packet(), ended("interrupted")) == [steps.NeedCut()]
    [resume] = steps.decide_implement(packet(), ended("interrupted", cut=True))
    assert isinstance(resume, steps.Send) and (resume.kind, resume.key) == ("resume", "p:resume:1")
    assert resume.text.startswith("peerd restarted while you were working") and resume.text.endswith(
        "the task"
    )
    [record] = steps.decide_implement(packet(), steps.Sent(resume, "run_2", 900.0, 300.0))
    assert isinstance(record, steps.Record)
    m = record.memo
    assert (m.resumes, m.hop_runs, m.deadline, m.hop_started, m.redispatch) == (
        1,
        ["run_1", "run_2"],
        900.0,
        5.0,
        0,
    )
    # Interrupted otherwise (a person's stop): its items are read, and it is a coder error.
    assert steps.decide_implement(packet(), ended("interrupted", cut=False)) == [steps.NeedOutcome()]
    effects = steps.decide_implement(
        packet(), ended("interrupted", cut=False, outcome=RunOutcome("", [], []))
    )
    receipt = only(effects, steps.RecordImpl)
    assert isinstance(receipt, steps.RecordImpl) and receipt.verification.classification == "coder_error"


def test_a_failed_run_is_environmental_only_by_its_structured_denials_never_by_words() -> None:
    said = RunOutcome("permission denied: the sandbox refused", [NOTICE], [])
    effects = steps.decide_implement(packet(), ended("failed", outcome=said))
    receipt = only(effects, steps.RecordImpl)
    assert isinstance(receipt, steps.RecordImpl) and receipt.verification.classification == "coder_error"
    assert receipt.memo.report == said.reply and receipt.memo.coder_errors == [NOTICE]
    assert "Its run reported:\n- notice" in receipt.verification.output_tail
    declined = RunOutcome("done", ["command rm -rf x declined"], ["command rm -rf x declined"])
    effects = steps.decide_implement(packet(), ended("failed", outcome=declined))
    receipt = only(effects, steps.RecordImpl)
    assert isinstance(receipt, steps.RecordImpl) and receipt.verification.classification == "environmental"
    assert receipt.verification.evidence.endswith("its sandbox declined: command rm -rf x declined")


def test_a_completed_run_is_collected_and_goes_to_verification_or_is_redispatched_when_empty() -> None:
    done = RunOutcome("all done", [], [])
    assert steps.decide_implement(packet(), ended("completed", outcome=done)) == [
        steps.NeedCollect(["run_1"])
    ]
    moved = CheckoutChange(path="calc.py", moved=True, reason="proven")
    stray = CheckoutChange(path="notes.txt", moved=False, reason="outside_files")
    [record] = steps.decide_implement(
        packet(), ended("completed", outcome=done, collected=Collected(TIP, [moved, stray]))
    )
    assert isinstance(record, steps.Record) and record.fields == {"state": "verifying", "commit_sha": TIP}
    m = record.memo
    assert (m.report, m.recovered, m.stray, m.checkout) == (
        "all done",
        ["calc.py"],
        ["notes.txt"],
        [moved, stray],
    )
    assert m.recovery_problem is None
    conflict = CheckoutChange(path="calc.py", moved=False, reason="does_not_apply")
    for tip in (None, BASE):
        effects = steps.decide_implement(
            packet(), ended("completed", outcome=done, collected=Collected(tip, [conflict]))
        )
        receipt = only(effects, steps.RecordImpl)
        assert isinstance(receipt, steps.RecordImpl) and receipt.verification.classification == "empty_diff"
        assert receipt.memo.not_recovered == ["calc.py"] and receipt.memo.recovery_problem == NOT_APPLIED
        assert isinstance(effects[-1], steps.Redispatch)


def test_a_failure_goes_to_another_coder_once_then_parks() -> None:
    done = RunOutcome("nothing to do", [], [])
    empty = ended("completed", outcome=done, collected=Collected(BASE))
    used = PacketMemo(base=BASE, redispatch=RETRY_LIMIT)
    assert steps.decide_implement(packet(used), empty)[-1] == steps.Park(
        "The coder changed nothing.\nIts last reply:\nnothing to do (already re-dispatched once)"
    )
    alone = steps.decide_implement(packet(coders=[HERE]), empty)[-1]
    assert isinstance(alone, steps.Park) and alone.why.endswith("(no other coder to re-dispatch to)")
    # Same backend and model elsewhere is another coder; a box's thread is not archived here.
    boxed = steps.decide_implement(packet(coder=ON_BOX, coders=[ON_BOX, HERE]), empty)[-1]
    assert isinstance(boxed, steps.Redispatch) and boxed.archive is None and boxed.coder.spec == "script"


# --- verify --------------------------------------------------------------------------------------


def verification(passed: bool, kind: str, *, timed_out: bool = False) -> VerificationResult:
    return VerificationResult(
        command="pytest -q", exit_code=0 if passed else 1, passed=passed, timed_out=timed_out,
        output_tail="out", classification=kind, evidence="exit 1",  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_passing_check_goes_to_review_after_its_receipt() -> None:
    memo = PacketMemo(base=BASE, hop_runs=["run_1"], reruns=1, environmental=1)
    receipt, record = steps.decide_verify(
        packet(memo), steps.Checked(verification(True, "passed"), memo, "ok"), now=50.0
    )
    assert (
        isinstance(receipt, steps.RecordImpl) and receipt.commit == TIP and receipt.memo.hop_runs == ["run_1"]
    )
    assert isinstance(record, steps.Record) and record.fields == {"state": "reviewing", "hop": "review"}
    assert (record.memo.review_started, record.memo.hop_runs, record.memo.environmental) == (50.0, [], 1)


def test_a_content_failure_goes_back_to_the_coder_once_then_parks_and_a_timeout_parks() -> None:
    memo = PacketMemo(base=BASE)
    output = "x" * 9000 + "FAILED test_add"
    _, back = steps.decide_verify(
        packet(memo), steps.Checked(verification(False, "content"), memo, output), now=1.0
    )
    assert isinstance(back, steps.Record) and back.fields == {"state": "implementing", "hop": "fix"}
    assert back.memo.content == 1 and back.memo.pending_after == "run_1"
    assert back.memo.pending_send is not None and "$ pytest -q\n" in back.memo.pending_send
    assert "FAILED test_add" in back.memo.pending_send and "x" * 8001 not in back.memo.pending_send
    used = PacketMemo(base=BASE, content=RETRY_LIMIT)
    _, park = steps.decide_verify(
        packet(used), steps.Checked(verification(False, "content"), used, "F"), now=1.0
    )
    assert park == steps.Park("Verification failed (content; exit 1):\n$ pytest -q\nF")
    late = verification(False, "timeout", timed_out=True)
    _, park = steps.decide_verify(packet(memo), steps.Checked(late, memo, "slow"), now=1.0)
    assert isinstance(park, steps.Park) and park.why.startswith("Verification failed (timeout;")


# --- review --------------------------------------------------------------------------------------

REVIEWER = CoderChoice(spec="reviewer", backend="reviewer", reason="another backend")
APPROVE = '{"verdict": "approve", "evidence": [], "summary": "fine"}'
CHANGES = json.dumps(
    {
        "verdict": "request_changes",
        "evidence": [{"file": "calc.py", "line": 4, "reason": "sign"}],
        "summary": "s",
    }
)
REJECT = '{"verdict": "reject", "evidence": [{"file": "calc.py", "reason": "wrong"}], "summary": "no"}'


def reviewed(memo: PacketMemo | None = None, **changes: object) -> steps.Reviewed:
    view = steps.Reviewed(
        packet_id="p",
        run_id="run_1",
        branch="orchestrate/orc_1/p",
        memo=memo
        or PacketMemo(
            base=BASE,
            review_started=7.0,
            review_round=1,
            review_thread="thr_r",
            review_run="run_r",
            review_runs=["run_r"],
        ),
        spec=SPEC,
        reviewer=REVIEWER,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def answer(reply: str, *, ask: int = 1, status: str = "completed") -> steps.ReviewerEnded:
    return steps.ReviewerEnded(ask, status, None, RunOutcome(reply, [], []))


def test_a_review_resumes_its_rounds_thread_or_launches_one_archiving_the_last_rounds() -> None:
    assert steps.decide_review(reviewed(), steps.ReviewBegin()) == [steps.WaitReviewer("thr_r", "run_r")]
    second = PacketMemo(base=BASE, changes=1, review_round=1, review_thread="thr_r", review_env="box")
    assert steps.decide_review(reviewed(second), steps.ReviewBegin()) == [
        steps.ArchiveReviewer("thr_r", "box"),
        steps.LaunchReviewer("p:review:2", 2),
    ]
    first = PacketMemo(base=BASE, review_started=3.0)
    assert steps.decide_review(reviewed(first), steps.ReviewBegin()) == [
        steps.LaunchReviewer("p:review:1", 1)
    ]
    [record] = steps.decide_review(
        reviewed(first, reviewer=ON_BOX), steps.ReviewerLaunched("thr_r", "run_r", 9.0)
    )
    assert isinstance(record, steps.Record) and record.fields == {}
    m = record.memo
    assert (m.review_thread, m.review_run, m.review_round, m.review_env) == ("thr_r", "run_r", 1, "box")
    assert (m.review_runs, m.review_started) == (["run_r"], 3.0), "the round began when the check passed"
    [record] = steps.decide_review(reviewed(PacketMemo()), steps.ReviewerLaunched("thr_r", "run_r", 9.0))
    assert isinstance(record, steps.Record) and record.memo.review_started == 9.0


def test_the_reviewers_answer_past_a_budget_or_from_a_failed_run_ends_the_review() -> None:
    over = steps.ReviewerEnded(1, "completed", "budget exceeded")
    assert steps.decide_review(reviewed(), over) == [steps.StopOverBudget("budget exceeded")]
    assert steps.decide_review(reviewed(), steps.ReviewerEnded(1, "completed", None)) == [steps.NeedOutcome()]
    failed = steps.ReviewerEnded(1, "failed", None, RunOutcome("", ["error: model down"], []))
    assert steps.decide_review(reviewed(), failed) == [
        steps.Park(
            "The reviewer's run (reviewer, here) ended failed, so there is no verdict. It reported:\n"
            "- error: model down"
        )
    ]


def test_an_invalid_verdict_is_asked_for_again_once_then_parks() -> None:
    [again] = steps.decide_review(reviewed(), answer("looks good"))
    assert isinstance(again, steps.AskReviewerAgain) and again.key == "p:review:1:again"
    assert again.text.startswith("Your answer was not a valid verdict:") and "peerd-script" not in again.text
    scripted = reviewed(reviewer=HERE)
    [again] = steps.decide_review(scripted, answer("looks good"))
    assert isinstance(again, steps.AskReviewerAgain) and again.text.startswith("```peerd-script\n")
    [record] = steps.decide_review(reviewed(), steps.ReviewerAsked("run_r2"))
    assert isinstance(record, steps.Record) and record.memo.review_runs == ["run_r", "run_r2"]
    [park] = steps.decide_review(reviewed(), answer("still not json", ask=2))
    assert isinstance(park, steps.Park) and park.why.startswith(
        "The reviewer (reviewer, here) gave no valid verdict"
    )
    assert park.why.endswith("Its last reply:\nstill not json")


def test_each_verdict_writes_its_receipt_then_moves_the_packet() -> None:
    receipt, record = steps.decide_review(reviewed(), answer(APPROVE))
    assert isinstance(receipt, steps.WriteReview) and (receipt.round, receipt.held) == (1, None)
    assert (receipt.started_at, list(receipt.runs)) == (7.0, ["run_r"])
    assert isinstance(record, steps.Record) and record.fields == {"state": "approved", "hop": None}
    assert record.memo.review_started is None
    held = steps.decide_review(reviewed(held=["setup.cfg"]), answer(APPROVE))
    assert isinstance(held[0], steps.WriteReview) and held[0].held == "out_of_scope"
    assert isinstance(held[1], steps.Record) and held[1].fields == {}
    assert isinstance(held[2], steps.Park) and "setup.cfg" in held[2].why
    receipt, back = steps.decide_review(reviewed(), answer(CHANGES))
    assert isinstance(back, steps.Record) and back.fields == {"state": "implementing", "hop": "changes"}
    assert (back.memo.changes, back.memo.pending_after) == (1, "run_1")
    assert back.memo.pending_send == (
        "The reviewer requested changes:\n- calc.py:4: sign\nMake them, verify, and report."
    )
    second = reviewed(PacketMemo(base=BASE, changes=RETRY_LIMIT, review_round=2))
    _, park = steps.decide_review(second, answer(CHANGES))
    assert park == steps.Park(
        "The reviewer (reviewer, here) requested changes again (the one round is used): s\n- calc.py:4: sign"
    )
    _, park = steps.decide_review(reviewed(), answer(REJECT))
    assert park == steps.Park("The reviewer (reviewer, here) rejected it: no\n- calc.py: wrong")


@pytest.mark.parametrize("verdict", [APPROVE, CHANGES, REJECT])
def test_a_decision_changes_no_memo_it_was_given(verdict: str) -> None:
    view = reviewed()
    before = view.memo.model_dump()
    steps.decide_review(view, answer(verdict))
    steps.decide_implement(packet(view.memo), ended(TIMED_OUT))
    assert view.memo.model_dump() == before
