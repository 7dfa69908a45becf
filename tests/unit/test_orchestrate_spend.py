"""An orchestration's spend and budgets as pure rules: what is left for a hop's run, the tightest
of two budgets, and which budget stops what (peerd/core/usage.py, peerd/orchestrate/spend.py)."""

from __future__ import annotations

from typing import Any

from peerd.core.usage import Budget, Usage, remaining, tightest
from peerd.orchestrate import spend
from peerd.orchestrate.context import Settings

CODER = {"spec": "script", "backend": "script", "reason": "test"}


def run_receipt(packet: str | None, run_id: str, tokens: int, seconds: float = 1.0) -> dict[str, Any]:
    usage = Usage(input_tokens=tokens).to_json()
    body = {"runId": run_id, "threadId": "t", "role": "implementer", "usage": usage, "seconds": seconds}
    return {"kind": spend.RUN, "packetId": packet, "body": body}


def settings(**request: Any) -> Settings:
    return Settings.from_request({"coders": [CODER], **request})


def test_what_is_left_of_a_budget() -> None:
    budget = Budget(tokens=50_000, usd=2.0, seconds=600)
    left = remaining(budget, Usage(input_tokens=30_000, output_tokens=100, cost_usd=0.5), 100.0)
    assert left == Budget(tokens=19_900, usd=1.5, seconds=500.0)
    # reached: the least a budget can say, so the run stops at its first report
    assert remaining(Budget(tokens=10), Usage(input_tokens=10), 0.0).tokens == 1
    assert remaining(Budget(seconds=5), None, 9.0).seconds == 1.0
    assert remaining(Budget(tokens=10), None, 0.0) == Budget(tokens=10)


def test_the_tightest_of_two_budgets() -> None:
    assert tightest(None, Budget()) is None
    assert tightest(Budget(tokens=10, usd=3.0), Budget(tokens=20, seconds=5)) == Budget(
        tokens=10, usd=3.0, seconds=5
    )


def test_a_replayed_run_counts_once_and_packets_apart() -> None:
    receipts = [run_receipt("a", "r1", 100), run_receipt("a", "r1", 150), run_receipt("b", "r2", 7)]
    assert spend.packet_spend(receipts, "a").usage == Usage(input_tokens=150)
    assert spend.whole_spend(receipts).usage == Usage(input_tokens=157)
    assert spend.whole_spend([]).usage is None  # unknown, not zero
    hop = spend.hop_usage(receipts, ["r2"])
    assert hop is not None and hop.total_tokens == 7


def test_the_packets_budget_then_the_whole_runs() -> None:
    receipts = [
        run_receipt(None, "plan", 1000),
        run_receipt("a", "r1", 40_000),
        run_receipt("b", "r2", 20_000),
    ]
    both = settings(budget={"tokens": 100_000}, packetBudget={"tokens": 30_000})
    assert spend.past(both, receipts, "a") == "budget exceeded: 40,000 of 30,000 tokens"
    assert spend.past(both, receipts, "b") is None
    hop = spend.hop_budget(both, receipts, "b")
    assert hop is not None and hop.tokens == 10_000  # the packet's 30,000 less its 20,000
    whole = settings(budget={"tokens": 50_000})
    assert spend.past(whole, receipts, "b") == (
        "budget exceeded: 61,000 of 50,000 tokens (the whole orchestration's --budget)"
    )
    assert (
        spend.past(settings(), receipts, "a") is None and spend.hop_budget(settings(), receipts, "a") is None
    )
    scopes = [(s.scope, s.exceeded) for s in spend.states(both, receipts, "a")]
    assert scopes == [("packet", True), ("orchestration", False)]
