"""What a run spent, and budgets as stop rules: pure, no I/O.

Every CLI counts tokens its own way; `Usage` is one meaning for all of them:

- `input_tokens`: every prompt token the model read, cached ones included (Claude reports cache
  reads apart from its `input_tokens`; they are added here);
- `cached_tokens`: of those, the ones read from the provider's prompt cache;
- `output_tokens`: every token the model wrote, reasoning included (Gemini reports its thoughts apart
  from its output; they are added here);
- `reasoning_tokens`: of those, the model's private reasoning;
- `total_tokens`: input + output, what a token budget counts;
- `cost_usd`: the CLI's own figure (Claude Code's `total_cost_usd`), None when it gives none; or,
  for a CLI that reports no cost (Codex, Gemini CLI), an estimate from the owner's price table
  (`[prices]` in config.toml, `estimate`), then `cost_estimated` is true. A CLI's own cost always
  wins over the table;
- `provider_ms`: the CLI's own duration of the run, None when it gives none;
- `claimed`: the figures are what the run itself said (the scripted coder's script carries its
  usage as text anyone who writes a prompt chooses), not what peerd parsed from a coder CLI's own
  protocol stream. A caller's own budget counts claimed usage (the owner's tests rely on it; a link
  that under-claims only loosens its own stop rule), but the owner's per-link ceiling never counts
  a claimed cost (`ceiling_spend`): a link's scripted run counts as a run, at $0.

A provider reports the run's usage *so far* (a snapshot, never a delta); the run manager keeps the
latest and checks it against the run's budget (`exceeded`) each time one arrives.

A budget belongs to the work it was given to, not to one run: the launch or send that set it, and
every wake and continuation that carries that work on (`budget_scope`), count against it together
(`scope_exceeded`), in the live run's meter and at start-up, from the recorded usage, for a run a
crash cut (`peerd/store/threads/recovery.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Measure = Literal["tokens", "usd", "seconds"]  # what a budget limits


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None
    provider_ms: int | None = None
    wall_ms: int | None = None  # set by the run manager: started -> this report (or the end)
    cost_estimated: bool = False  # cost_usd is peerd's estimate from the price table, not the CLI's
    claimed: bool = False  # what the run said of itself (the scripted coder), not a CLI's stream

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, other: Usage) -> Usage:
        """The sum of two usages; a cost or duration only one of them knows counts as known."""
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost_usd=_add(self.cost_usd, other.cost_usd),
            provider_ms=_add(self.provider_ms, other.provider_ms),
            wall_ms=_add(self.wall_ms, other.wall_ms),
            # a sum with any estimated part is an estimate
            cost_estimated=self.cost_estimated or other.cost_estimated,
            claimed=self.claimed or other.claimed,  # and one with any claimed part is claimed
        )

    def since(self, before: Usage) -> Usage:
        """What was spent after `before`, from two running totals (never below zero); a cost or
        duration `before` does not know stays as it is."""
        return Usage(
            input_tokens=max(0, self.input_tokens - before.input_tokens),
            output_tokens=max(0, self.output_tokens - before.output_tokens),
            cached_tokens=max(0, self.cached_tokens - before.cached_tokens),
            reasoning_tokens=max(0, self.reasoning_tokens - before.reasoning_tokens),
            cost_usd=_less(self.cost_usd, before.cost_usd),
            provider_ms=_less(self.provider_ms, before.provider_ms),
            wall_ms=self.wall_ms,
            cost_estimated=self.cost_estimated,
            claimed=self.claimed,
        )

    def cost_since(self, before_usd: float | None) -> Usage:
        """This usage with its cost as a run's own part of a session's running total (Claude Code's
        `total_cost_usd` counts every earlier run of the session again): the total less what the
        session had cost before the run. A total below that is not a running total of those runs
        (the CLI started counting afresh): it stands as it is."""
        if self.cost_usd is None or before_usd is None or self.cost_usd < before_usd:
            return self
        return replace(self, cost_usd=round(self.cost_usd - before_usd, 10))

    def with_wall(self, wall_ms: int) -> Usage:
        return replace(self, wall_ms=wall_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedTokens": self.cached_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "totalTokens": self.total_tokens,
            "costUsd": self.cost_usd,
            "providerMs": self.provider_ms,
            "wallMs": self.wall_ms,
            "costEstimated": self.cost_estimated,
            "claimed": self.claimed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """The stored form back (`to_json`); wrong types read as absent."""
        return cls(
            input_tokens=_int(data.get("inputTokens")) or 0,
            output_tokens=_int(data.get("outputTokens")) or 0,
            cached_tokens=_int(data.get("cachedTokens")) or 0,
            reasoning_tokens=_int(data.get("reasoningTokens")) or 0,
            cost_usd=_float(data.get("costUsd")),
            provider_ms=_int(data.get("providerMs")),
            wall_ms=_int(data.get("wallMs")),
            cost_estimated=data.get("costEstimated") is True,
            claimed=data.get("claimed") is True,
        )


def total(usages: Iterable[Usage]) -> Usage | None:
    """The sum of `usages`, None when there are none (unknown, not zero)."""
    result: Usage | None = None
    for usage in usages:
        result = usage if result is None else result.plus(usage)
    return result


@dataclass(frozen=True)
class Price:
    """What a model costs, in dollars per million tokens (`[prices."MODEL"]` in config.toml).
    Cached input reads cost `cached_input_per_mtok` (None: as the rest of the input); reasoning is
    part of the output and costs what the output does."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None


def estimate(usage: Usage, price: Price | None) -> Usage:
    """`usage` with its cost estimated from `price` when the CLI gave none (its own always wins)."""
    if price is None or usage.cost_usd is not None:
        return usage
    cached = min(usage.cached_tokens, usage.input_tokens)
    cached_rate = price.input_per_mtok if price.cached_input_per_mtok is None else price.cached_input_per_mtok
    dollars = (
        (usage.input_tokens - cached) * price.input_per_mtok
        + cached * cached_rate
        + usage.output_tokens * price.output_per_mtok
    ) / 1_000_000
    return replace(usage, cost_usd=round(dollars, 8), cost_estimated=True)


def price_for(prices: Mapping[str, Price], model: str | None, provider: str) -> Price | None:
    """The price of a run: its model's entry (the thread's model, else the provider's configured
    one, as the caller resolved it), else an entry named after the provider; None: not priced."""
    if model is not None and model in prices:
        return prices[model]
    return prices.get(provider)


@dataclass(frozen=True)
class Budget:
    """A run's stop rule: any limit passed stops it. None: no limit of that kind."""

    tokens: int | None = None
    usd: float | None = None
    seconds: float | None = None
    # The run's price (not stored with the budget): a `usd` limit then counts an estimated cost
    # for a CLI that reports none, as the stored usage does.
    price: Price | None = field(default=None, compare=False)

    @property
    def empty(self) -> bool:
        return self.tokens is None and self.usd is None and self.seconds is None

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "usd": self.usd, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Budget:
        return cls(
            tokens=_int(data.get("tokens")), usd=_float(data.get("usd")), seconds=_float(data.get("seconds"))
        )


def exceeded(budget: Budget, usage: Usage | None, wall_s: float) -> str | None:
    """Why the run is past its budget ("budget exceeded: 51,200 of 50,000 tokens"), else None.

    Passing means more than the limit: a run that lands exactly on it is within it."""
    by = exceeded_by(budget, usage, wall_s)
    if by == "tokens" and usage is not None and budget.tokens is not None:
        return f"budget exceeded: {usage.total_tokens:,} of {budget.tokens:,} tokens"
    if by == "usd" and usage is not None and budget.usd is not None:
        priced = estimate(usage, budget.price)
        about = "~" if priced.cost_estimated else ""
        return f"budget exceeded: {about}${priced.cost_usd or 0.0:,.4f} of ${budget.usd:,.4f}"
    if by == "seconds" and budget.seconds is not None:
        return f"budget exceeded: {wall_s:,.1f} of {budget.seconds:,g} seconds"
    return None


def exceeded_by(budget: Budget, usage: Usage | None, wall_s: float) -> Measure | None:
    """Which limit of `budget` the run passed (`exceeded` says it), the first in the order tokens,
    dollars, seconds; None within it. Seconds are the runs' elapsed time, which peerd measures
    whether or not the coder reports usage."""
    if budget.tokens is not None and usage is not None and usage.total_tokens > budget.tokens:
        return "tokens"
    priced = None if usage is None else estimate(usage, budget.price)
    if budget.usd is not None and priced is not None and (priced.cost_usd or 0.0) > budget.usd:
        return "usd"
    if budget.seconds is not None and wall_s > budget.seconds:
        return "seconds"
    return None


def remaining(budget: Budget, usage: Usage | None, wall_s: float) -> Budget:
    """What is left of `budget` after `usage` and `wall_s`: the next run's own budget, so the run
    manager stops it as usage arrives once the whole passes. A limit already reached leaves the
    least a budget can say (1 token, $0.0001, 1 second): the run is stopped at its first report."""
    spent = usage or Usage()
    return Budget(
        tokens=None if budget.tokens is None else max(1, budget.tokens - spent.total_tokens),
        usd=None if budget.usd is None else max(0.0001, budget.usd - (spent.cost_usd or 0.0)),
        seconds=None if budget.seconds is None else max(1.0, budget.seconds - wall_s),
    )


def tightest(*budgets: Budget | None) -> Budget | None:
    """The lowest limit of each kind over `budgets`; None when none sets any."""
    given = [b for b in budgets if b is not None and not b.empty]
    if not given:
        return None

    def low(values: list[Any]) -> Any:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return Budget(
        tokens=low([b.tokens for b in given]),
        usd=low([b.usd for b in given]),
        seconds=low([b.seconds for b in given]),
    )


# --- a budget belongs to the work, across every run of it -------------------------------------------

# Runs that carry on the work of the run before them rather than start new work: a wake (a task
# this work delegated ended) and a continuation (a run cut by a daemon stop, or an owed approval).
CARRIED_ORIGINS: frozenset[str] = frozenset({"wake", "continue"})


@dataclass(frozen=True)
class MeteredRun:
    """What deciding about a run's budget needs to know of one run of its thread."""

    id: str
    number: int
    origin: str = "user"  # "user" (a launch or a send), "wake", "continue"
    continues: str | None = None  # a continuation's cut run
    budget: Budget | None = None
    usage: Usage | None = None


def budget_scope(run_id: str, runs: Sequence[MeteredRun]) -> list[MeteredRun]:
    """The runs whose usage counts against `run_id`'s budget, oldest first, `run_id` last.

    A budget is set by a launch or a send (origin "user"): that run's work is the work the budget
    is for. A wake or a continuation carries on the work of the run it follows (a continuation:
    the run it continues; a wake: the run before it), so it belongs to that run's scope, back to
    the run that set it. Empty when `run_id` is not in `runs`."""
    ordered = sorted(runs, key=lambda r: r.number)
    by_id = {r.id: r for r in ordered}
    before = {r.id: ordered[i - 1] if i else None for i, r in enumerate(ordered)}
    roots: dict[str, str] = {}

    def root_of(run: MeteredRun) -> str:
        path: list[str] = []
        current: MeteredRun | None = run
        while current is not None and current.id not in roots and current.origin in CARRIED_ORIGINS:
            if current.id in path:  # a loop cannot be recorded; bounded all the same
                break
            path.append(current.id)
            followed = by_id.get(current.continues or "") if current.origin == "continue" else None
            current = followed if followed is not None else before[current.id]
        found = run.id if current is None else roots.get(current.id, current.id)
        for run_id_on_path in path:
            roots[run_id_on_path] = found
        roots.setdefault(run.id, found)
        return found

    target = by_id.get(run_id)
    if target is None:
        return []
    root = root_of(target)
    return [r for r in ordered if r.number <= target.number and root_of(r) == root]


def scope_budget(scope: Sequence[MeteredRun]) -> Budget | None:
    """The budget of a scope (`budget_scope`): the one its first run set, tightened by any the
    last run carries of its own; None: no limit."""
    if not scope:
        return None
    first, last = scope[0], scope[-1]
    return tightest(first.budget, last.budget if last is not first else None)


def spent_before(scope: Sequence[MeteredRun]) -> Usage | None:
    """What the runs of a scope before its last one spent (None: nothing recorded)."""
    return total(r.usage for r in scope[:-1] if r.usage is not None)


def scope_exceeded(budget: Budget, before: Usage | None, usage: Usage | None, wall_s: float) -> str | None:
    """Why the work is past its budget: what earlier runs of it spent (`before`, its wall time
    included) plus this run's `usage` and `wall_s`; the reason names the runs when there were
    several ("budget exceeded: 55,200 of 50,000 tokens, over 2 runs of this work"). None: within."""
    if before is None:
        return exceeded(budget, usage, wall_s)
    spent = before if usage is None else before.plus(usage)
    why = exceeded(budget, spent, (before.wall_ms or 0) / 1000 + wall_s)
    return None if why is None else f"{why}, counting the earlier runs of this work"


DAY_S = 24 * 3600.0


def ceiling_spend(usages: Iterable[Usage | None]) -> float:
    """What a link's runs cost against the owner's dollar ceiling: each run's recorded cost, a
    claimed one (`Usage.claimed`: the run's own say, e.g. the scripted coder's) counting $0."""
    return sum((u.cost_usd or 0.0) for u in usages if u is not None and not u.claimed)


def ceiling_refusal(*, max_runs: int | None, max_usd: float | None, runs: int, usd: float) -> str | None:
    """Why a link may not start another run here (its last 24 hours: `runs` started, `usd` spent),
    naming the limit; None when it may."""
    if max_runs is not None and runs >= max_runs:
        return (
            f"This machine's owner lets a linked machine start at most {max_runs:,} runs a day "
            f"(links.max_runs in its config.toml); {runs:,} started in the last 24 hours. Try later, or ask them."
        )
    if max_usd is not None and usd >= max_usd:
        return (
            f"This machine's owner lets a linked machine's runs spend at most ${max_usd:,.2f} a day "
            f"(links.max_usd_per_day in its config.toml); ${usd:,.2f} spent in the last 24 hours. "
            "Try later, or ask them."
        )
    return None


def describe(usage: Usage | None) -> str:
    """One line for people: "1,234 tokens (1,000 in, 50 cached; 234 out, 10 reasoning), $0.0120, 4.2 s"."""
    if usage is None:
        return "unknown"
    parts = [
        f"{usage.total_tokens:,} tokens ({usage.input_tokens:,} in, {usage.cached_tokens:,} cached; "
        f"{usage.output_tokens:,} out, {usage.reasoning_tokens:,} reasoning)"
    ]
    if usage.cost_usd is not None and usage.cost_estimated:
        parts.append(f"~${usage.cost_usd:,.4f} (estimate)")
    elif usage.cost_usd is not None:
        parts.append(f"${usage.cost_usd:,.4f}")
    if usage.wall_ms is not None:
        parts.append(f"{usage.wall_ms / 1000:,.1f} s")
    if usage.provider_ms is not None:
        parts.append(f"provider {usage.provider_ms / 1000:,.1f} s")
    return ", ".join(parts)


def _less(a: float | int | None, b: float | int | None) -> Any:
    if a is None or b is None:
        return a
    return max(a - b, 0)


def _add(a: float | int | None, b: float | int | None) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None
