"""Issue 26's owed things, the pure rules: a budget belongs to its work across every run of it
(`core/usage.py:budget_scope`), a cut run already past its budget fails (`core/runs.py:plan_cut`),
and a resumed Claude session's running cost total counts once (`Usage.cost_since`)."""

from __future__ import annotations

from peerd.core.runs import CutThread, RunView, plan_cut, recover_at_startup
from peerd.core.usage import (
    Budget,
    MeteredRun,
    Usage,
    budget_scope,
    scope_budget,
    scope_exceeded,
    spent_before,
)
from peerd.providers.claude_events import ClaudeEvents
from peerd.runtime.provider import UsageReported

BUDGET = Budget(tokens=50_000)


def spent(tokens: int) -> Usage:
    return Usage(input_tokens=tokens - 100, output_tokens=100)


def test_a_continuation_counts_against_the_budget_of_the_run_it_continues() -> None:
    runs = [
        MeteredRun("r1", 1, budget=BUDGET, usage=spent(30_100)),
        MeteredRun("r2", 2, origin="continue", continues="r1", usage=spent(25_100)),
    ]
    scope = budget_scope("r2", runs)
    assert [r.id for r in scope] == ["r1", "r2"]
    assert scope_budget(scope) == BUDGET
    before = spent_before(scope)
    assert before is not None and before.total_tokens == 30_100
    why = scope_exceeded(BUDGET, before, runs[1].usage, 0.0)
    assert why is not None and "55,200 of 50,000 tokens" in why and "earlier runs" in why
    # Within the limit alone, the continuation would not be stopped: the carry-over is the rule.
    assert scope_exceeded(BUDGET, None, runs[1].usage, 0.0) is None


def test_wakes_and_chains_of_continuations_belong_to_the_work_a_send_starts_anew() -> None:
    runs = [
        MeteredRun("r1", 1, budget=BUDGET, usage=spent(10_000)),
        MeteredRun("r2", 2, origin="wake", usage=spent(10_000)),
        MeteredRun("r3", 3, origin="continue", continues="r2", usage=spent(10_000)),
        MeteredRun("r4", 4, origin="continue", continues="r3"),
        MeteredRun("r5", 5, budget=Budget(tokens=5), usage=spent(10_000)),  # a send: new work
        MeteredRun("r6", 6, origin="wake"),
        MeteredRun("r7", 7, origin="continue"),  # an owed approval's run names no cut run
    ]
    assert [r.id for r in budget_scope("r4", runs)] == ["r1", "r2", "r3", "r4"]
    assert spent_before(budget_scope("r4", runs)) == spent(10_000).plus(spent(10_000)).plus(spent(10_000))
    assert [r.id for r in budget_scope("r7", runs)] == ["r5", "r6", "r7"]
    assert scope_budget(budget_scope("r7", runs)) == Budget(tokens=5)
    assert budget_scope("r1", runs) == [runs[0]] and spent_before([runs[0]]) is None
    assert budget_scope("nope", runs) == []


def test_a_run_without_a_budget_in_its_work_has_no_limit() -> None:
    runs = [MeteredRun("r1", 1, usage=spent(99_999)), MeteredRun("r2", 2, origin="continue", continues="r1")]
    assert scope_budget(budget_scope("r2", runs)) is None


def test_a_seconds_budget_counts_the_earlier_runs_wall_time() -> None:
    before = Usage(wall_ms=50_000)
    assert scope_exceeded(Budget(seconds=60), before, None, 11.0) is not None
    assert scope_exceeded(Budget(seconds=60), before, None, 9.0) is None


CHILD = CutThread(kind="child", stopped=False, has_session=True, runs=(RunView("r1", 1, "running"),))


def test_a_cut_run_past_its_budget_fails_and_is_not_continued() -> None:
    why = "budget exceeded: 51,200 of 50,000 tokens"
    cut = plan_cut(CHILD.runs[0], CHILD, label="box", continue_children=True, how="crash", over_budget=why)
    assert cut.status == "failed" and not cut.continued and cut.reason == why
    # Within its budget, the same child is continued (the setting's default).
    (plain,) = recover_at_startup([CHILD], label="box", continue_children=True, over_budget={})
    assert plain.status == "interrupted" and plain.continued


def test_a_resumed_claude_sessions_running_cost_counts_once() -> None:
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "hi",
        "total_cost_usd": 0.054908,  # the session's total: this run and the one before
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "session_id": "s1",
    }
    events = ClaudeEvents(cost_before=0.031376).feed(result)
    (usage,) = [e.usage for e in events if isinstance(e, UsageReported)]
    assert usage.cost_usd is not None and abs(usage.cost_usd - 0.023532) < 1e-9
    assert usage.total_tokens == 15  # tokens are the run's own already
    (first,) = [e.usage for e in ClaudeEvents().feed(result) if isinstance(e, UsageReported)]
    assert first.cost_usd == 0.054908  # a new session: its total is its own
    # A total below what came before is not a running total of those runs: it stands.
    assert Usage(cost_usd=0.01).cost_since(0.03).cost_usd == 0.01
    assert Usage(cost_usd=None).cost_since(0.03).cost_usd is None


def test_a_withdrawn_question_takes_no_decision_and_is_owed_to_nobody() -> None:
    import pytest  # noqa: PLC0415

    from peerd.approvals import rules  # noqa: PLC0415

    asked = rules.Approval(
        id="ap_1",
        run_id="r1",
        thread_id="t1",
        ask_key="s0",
        kind="command",
        tool="run",
        summary="run `true`",
        detail={},
        digest="d",
        created_at=0.0,
        deadline_at=60.0,
    )
    gone = rules.cancel(asked, "the run that asked is no longer live", now=1.0)
    with pytest.raises(rules.Withdrawn):
        rules.decide(gone, rules.Decision("approve", "owner"), now=2.0)
    assert rules.owed_to("d", [gone]) is None  # a later run asking the same asks anew
    approved = rules.decide(asked, rules.Decision("approve", "owner"), now=2.0)
    assert rules.owed_to("d", [gone, approved]) is approved  # a decision not yet told is still owed
