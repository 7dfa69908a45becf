"""Usage from each CLI's stream (the pinned versions' real shapes, captured against the fake model
with its cached and reasoning tokens), and the pure budget rules (peerd/core/usage.py)."""

# Recorded JSON lines are kept verbatim, one per line, so they can be compared with real output.
# ruff: noqa: E501

from __future__ import annotations

import json
from typing import Any

import pytest

from peerd.core.usage import Budget, Usage, describe, exceeded, total
from peerd.errors import ConfigInvalid
from peerd.providers.claude_events import ClaudeEvents
from peerd.providers.codex_events import CodexEvents
from peerd.providers.gemini_events import GeminiEvents
from peerd.runtime.provider import UsageReported

# claude-code 2.1.332 `result` (fake model: input 10, cache reads 3, output 5); fields trimmed
# only where they say nothing about usage (modelUsage, subagent_stats, timings).
CLAUDE_RESULT = json.loads(
    '{"type": "result", "subtype": "success", "is_error": false, "duration_ms": 460, "duration_api_ms": 45, "num_turns": 1, "result": "Hello.", "stop_reason": "end_turn", "session_id": "89049c15-a7aa-44d3-90dc-d702741aaa14", "total_cost_usd": 0.0001406, "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 5, "output_tokens_details": {"thinking_tokens": 0}, "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0}, "service_tier": "standard", "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0}, "inference_geo": "", "iterations": [], "speed": "standard", "fallback_credit": null}, "permission_denials": [], "terminal_reason": "completed"}'
)
# codex 0.171.0 (fake model: input 10 with 3 cached, output 5 with 2 reasoning).
CODEX_TURN = json.loads(
    '{"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 3, "cache_write_input_tokens": 0, "output_tokens": 5, "reasoning_output_tokens": 2}}'
)
# gemini-cli 0.61.0 (fake model: prompt 10 with 3 cached, candidates 5, thoughts 2).
GEMINI_RESULT = json.loads(
    '{"type": "result", "timestamp": "2026-12-01T13:34:20.945Z", "status": "success", "stats": {"total_tokens": 17, "input_tokens": 10, "output_tokens": 5, "cached": 3, "input": 7, "duration_ms": 206, "tool_calls": 0, "models": {"gemini-2.5-flash": {"total_tokens": 17, "input_tokens": 10, "output_tokens": 5, "cached": 3, "input": 7}}}}'
)


def usages(events: list[Any]) -> list[Usage]:
    return [event.usage for event in events if isinstance(event, UsageReported)]


def test_claude_counts_cache_reads_and_writes_as_input_and_keeps_its_cost_and_duration() -> None:
    assert usages(ClaudeEvents().feed(CLAUDE_RESULT)) == [
        Usage(
            input_tokens=13,
            output_tokens=5,
            cached_tokens=3,
            reasoning_tokens=0,
            cost_usd=0.0001406,
            provider_ms=460,
        )
    ]
    written = {**CLAUDE_RESULT, "usage": {**CLAUDE_RESULT["usage"], "cache_creation_input_tokens": 7}}
    assert usages(ClaudeEvents().feed(written))[0].input_tokens == 20


def claude_assistant(message_id: str, block: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """An `assistant` line as claude-code 2.1.332 writes one per content block (observed shape)."""
    return {
        "type": "assistant",
        "message": {"id": message_id, "type": "message", "role": "assistant", "model": "claude-opus-5-5",
                    "content": [block], "stop_reason": None, "stop_sequence": None, "usage": usage,
                    "context_management": None},
        "parent_tool_use_id": None,
        "session_id": "89049c15-a7aa-44d3-90dc-d702741aaa14",
    }  # fmt: skip


def test_claude_reports_a_growing_lower_bound_per_model_message_before_its_result() -> None:
    """Budgets can stop a long Claude run: each model request's usage counts as it streams."""
    parser = ClaudeEvents()
    started = {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 3}
    tool = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "true"}}
    first = usages(parser.feed(claude_assistant("msg_1", tool, started)))
    again = usages(parser.feed(claude_assistant("msg_1", {"type": "text", "text": "x"}, started)))
    second = usages(parser.feed(claude_assistant("msg_2", {"type": "text", "text": "Hello."}, started)))
    assert first == [Usage(input_tokens=13, output_tokens=1, cached_tokens=3)]
    assert again == []  # the same message's next block repeats its usage: not counted twice
    assert second == [Usage(input_tokens=26, output_tokens=2, cached_tokens=6)]
    # The result's figures (the real output, the cost) replace the estimate.
    (final,) = usages(parser.feed(CLAUDE_RESULT))
    assert final.cost_usd == 0.0001406 and final.output_tokens == 5


def test_a_failed_claude_turn_still_reports_what_it_spent() -> None:
    failed = {**CLAUDE_RESULT, "subtype": "error_max_budget_usd", "is_error": True}
    assert usages(ClaudeEvents().feed(failed))[0].total_tokens == 18


def test_claude_without_usage_reports_none() -> None:
    bare = {k: v for k, v in CLAUDE_RESULT.items() if k not in ("usage",)}
    assert usages(ClaudeEvents().feed(bare)) == []


def test_codex_reports_its_sessions_running_total_less_what_the_session_spent_before() -> None:
    """`turn.completed` carries the session's running total (a resumed session's first turn counts
    the earlier runs too, codex 0.171.0): the run's usage is the last total less `usage_before`."""
    one = Usage(input_tokens=10, output_tokens=5, cached_tokens=3, reasoning_tokens=2)
    two = {**CODEX_TURN, "usage": {k: 2 * v for k, v in CODEX_TURN["usage"].items()}}
    parser = CodexEvents()
    assert usages(parser.feed(CODEX_TURN)) == [one]
    assert usages(parser.feed(two)) == [one.plus(one)]  # a running total: not added again
    resumed = CodexEvents(usage_before=one)
    assert usages(resumed.feed(two)) == [one]
    assert usages(CodexEvents(usage_before=one.plus(one)).feed(CODEX_TURN)) == [Usage()]  # never below 0
    assert usages(resumed.feed(two))[0].cost_usd is None


def test_gemini_adds_its_thoughts_to_the_output() -> None:
    assert usages(GeminiEvents().feed(GEMINI_RESULT)) == [
        Usage(input_tokens=10, output_tokens=7, cached_tokens=3, reasoning_tokens=2, provider_ms=206)
    ]
    assert usages(GeminiEvents().feed(GEMINI_RESULT))[0].total_tokens == 17  # Gemini's own total


@pytest.mark.parametrize(
    "bad",
    [
        {"input_tokens": "10", "output_tokens": None},
        {"input_tokens": -4, "output_tokens": True},
        {"input_tokens": 1.5},
    ],
)
def test_odd_counts_read_as_zero_never_raise(bad: dict[str, Any]) -> None:
    for parser, line in (
        (ClaudeEvents(), {**CLAUDE_RESULT, "usage": bad, "total_cost_usd": "a lot"}),
        (CodexEvents(), {"type": "turn.completed", "usage": bad}),
        (GeminiEvents(), {"type": "result", "status": "success", "stats": bad}),
    ):
        (usage,) = usages(parser.feed(line))
        assert usage.input_tokens == 0 and usage.output_tokens == 0 and usage.cost_usd is None


def test_the_budget_rules() -> None:
    spent = Usage(input_tokens=51_000, output_tokens=200, cost_usd=0.5)
    assert exceeded(Budget(tokens=50_000), spent, 1.0) == "budget exceeded: 51,200 of 50,000 tokens"
    assert exceeded(Budget(tokens=51_200), spent, 1.0) is None  # exactly at the limit is within it
    assert exceeded(Budget(usd=0.25), spent, 1.0) == "budget exceeded: $0.5000 of $0.2500"
    assert exceeded(Budget(usd=0.25), Usage(input_tokens=5), 1.0) is None  # no cost reported
    assert exceeded(Budget(seconds=2), None, 2.5) == "budget exceeded: 2.5 of 2 seconds"
    assert exceeded(Budget(seconds=2), None, 1.5) is None
    assert exceeded(Budget(), spent, 1e9) is None


def test_sums_keep_unknown_apart_from_zero() -> None:
    assert total([]) is None
    a = Usage(input_tokens=1, output_tokens=2, cost_usd=None, wall_ms=10)
    b = Usage(input_tokens=3, output_tokens=4, cost_usd=0.5, provider_ms=7)
    summed = total([a, b])
    assert summed == Usage(input_tokens=4, output_tokens=6, cost_usd=0.5, provider_ms=7, wall_ms=10)
    assert Usage.from_json(summed.to_json()) == summed if summed else False
    assert describe(None) == "unknown"
    assert describe(b) == "7 tokens (3 in, 0 cached; 4 out, 0 reasoning), $0.5000, provider 0.0 s"


# --- the price table (`[prices]`): estimates for CLIs that report no cost ------------------------


def test_an_estimate_prices_cached_input_apart_and_a_clis_own_cost_wins() -> None:
    from peerd.core.usage import Price, estimate, price_for  # noqa: PLC0415

    price = Price(input_per_mtok=1.25, cached_input_per_mtok=0.125, output_per_mtok=10.0)
    usage = Usage(
        input_tokens=1_000_000, cached_tokens=200_000, output_tokens=100_000, reasoning_tokens=40_000
    )
    priced = estimate(usage, price)
    assert priced.cost_usd == pytest.approx(2.025) and priced.cost_estimated
    assert estimate(Usage(input_tokens=10, cost_usd=0.5), price) == Usage(input_tokens=10, cost_usd=0.5)
    assert estimate(usage, None) == usage
    no_cache_rate = estimate(Usage(input_tokens=1_000_000, cached_tokens=1_000_000), Price(2.0, 1.0))
    assert no_cache_rate.cost_usd == pytest.approx(2.0)  # cached input costs as input without a rate
    table = {"gpt-x": price, "codex": Price(1.0, 1.0)}
    assert price_for(table, "gpt-x", "codex") is price
    assert price_for(table, "other", "codex") == Price(1.0, 1.0) and price_for(table, None, "gemini") is None


def test_an_estimate_is_marked_in_sums_lines_and_budgets() -> None:
    from peerd.core.usage import Price, estimate  # noqa: PLC0415

    guess = estimate(Usage(input_tokens=1000), Price(input_per_mtok=12.0, output_per_mtok=0.0))
    assert describe(guess).endswith("~$0.0120 (estimate)")
    assert total([guess, Usage(cost_usd=1.0)]) == Usage(
        input_tokens=1000, cost_usd=1.012, cost_estimated=True
    )
    assert Usage.from_json(guess.to_json()) == guess and guess.to_json()["costEstimated"] is True
    priced = Budget(usd=0.01, price=Price(input_per_mtok=12.0, output_per_mtok=0.0))
    assert exceeded(priced, Usage(input_tokens=1000), 0.0) == "budget exceeded: ~$0.0120 of $0.0100"
    assert exceeded(Budget(usd=0.01), Usage(input_tokens=1000), 0.0) is None  # no price: no cost
    assert exceeded(priced, Usage(input_tokens=1000, cost_usd=0.001), 0.0) is None  # the CLI's own wins


def test_the_price_table_in_config_toml(tmp_path: Any) -> None:
    from peerd.config import load  # noqa: PLC0415
    from peerd.core.usage import Price  # noqa: PLC0415

    path = tmp_path / "config.toml"
    path.write_text(
        '[providers.codex]\nmodel = "gpt-5.1-codex"\n\n'
        '[prices."gpt-5.1-codex"]\ninput_per_mtok = 1.25\ncached_input_per_mtok = 0.125\noutput_per_mtok = 10.0\n'
    )
    config = load(path)
    assert config.price_table() == {"gpt-5.1-codex": Price(1.25, 10.0, 0.125)}
    assert config.default_models() == {"codex": "gpt-5.1-codex"}
    path.write_text("[prices.m]\ninput_per_mtok = -1\noutput_per_mtok = 1\n")
    with pytest.raises(ConfigInvalid):
        load(path)
    path.write_text("[prices.m]\ninput_per_mtok = 1\n")  # the output price is required
    with pytest.raises(ConfigInvalid):
        load(path)
