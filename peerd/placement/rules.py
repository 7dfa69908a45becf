"""The placement rules (pure): which environments may take a piece of work, and which one does.

Fed the candidates (this environment and its linked ones, each with its last capacity report and
when it was read) and what the work needs; no I/O, one injected `now`. A candidate qualifies when
it has the project's repository (exactly one project with it), the provider installed, room under
its `max_runs` (live runs < max_runs), is not `manual-only`, and its link allows the requested
modes (never read-only). Among those the least loaded wins: the mean of its runs' share of
max_runs, its load per CPU (capped at 2) and its used memory's share, plus a floor, times its
preference's weight (prefer 0.5 < normal 1 < less 2). A tie goes to this environment, then by label.
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.contracts import Capacity, Placed, Preference, RuntimeMode
from peerd.core.access import runtime_rank
from peerd.errors import NoPlacement

MAX_AGE_S = 60.0  # a capacity report older than this is read again before choosing
WEIGHT: dict[Preference, float] = {"prefer": 0.5, "normal": 1.0, "less": 2.0, "manual-only": 0.0}
SHOWN: dict[Preference, str] = {
    "prefer": "prefers",
    "normal": "normal",
    "less": "less often",
    "manual-only": "manual only",
}
FLOOR = 0.1  # an idle box still has a score, so its preference still counts
LOAD_CAP = 2.0  # load per CPU past this says no more about the box


@dataclass(frozen=True)
class Candidate:
    """One environment as the chooser sees it. `env_id` None: this environment."""

    env_id: str | None
    label: str
    capacity: Capacity | None
    seen_at: float | None = None  # when `capacity` was read (this environment: now)
    error: str | None = None  # why it could not be read ("not reachable: ..."), when the last try failed
    access: RuntimeMode | None = None  # the link's level; None here
    blocked: str | None = None  # out before anything is looked at (revoked, via a link, ...)

    @property
    def here(self) -> bool:
        return self.env_id is None


@dataclass(frozen=True)
class Need:
    provider: str
    repository_key: str | None  # this project's; None: no repository to match elsewhere
    here_project_id: str  # the project here (this environment always has it)
    runtime_mode: RuntimeMode | None = None  # an explicit mode; omitted ones are the box's call


@dataclass(frozen=True)
class Verdict:
    candidate: Candidate
    reason: str  # why it is out, or how it stands
    project_id: str | None = None  # set when it qualifies
    score: float | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


def is_stale(candidate: Candidate, now: float, max_age: float = MAX_AGE_S) -> bool:
    """A linked environment whose report is missing or older than `max_age`: read it again first."""
    if candidate.here or candidate.blocked is not None:
        return False
    return candidate.capacity is None or candidate.seen_at is None or now - candidate.seen_at > max_age


def load_score(capacity: Capacity) -> float:
    """0 (idle) to about 1.3 (full, overloaded, out of memory), before the preference weight."""
    runs = 1.0 if capacity.max_runs == 0 else capacity.live_runs / capacity.max_runs
    load = min((capacity.load or 0.0) / capacity.cpus, LOAD_CAP)
    mem = 0.5  # not reported: neither good nor bad
    if capacity.mem_available is not None and capacity.mem_total:
        mem = 1.0 - min(capacity.mem_available / capacity.mem_total, 1.0)
    return (runs + load + mem) / 3


def score(capacity: Capacity) -> float:
    """Lower wins: the load score (plus a floor) times the preference's weight."""
    return (load_score(capacity) + FLOOR) * WEIGHT[capacity.preference]


def standing(capacity: Capacity) -> str:
    """`1 of 8 runs, load 0.4, 3.2 GiB free, prefers`: how a candidate stands."""
    parts = [f"{capacity.live_runs} of {capacity.max_runs} runs"]
    if capacity.load is not None:
        parts.append(f"load {capacity.load:.1f}")
    if capacity.mem_available is not None:
        parts.append(f"{capacity.mem_available / 2**30:.1f} GiB free")
    parts.append(SHOWN[capacity.preference])
    return ", ".join(parts)


def judge(candidate: Candidate, need: Need, now: float, max_age: float = MAX_AGE_S) -> Verdict:
    """Whether this candidate may take the work, and why not (one sentence's worth)."""
    if candidate.blocked is not None:
        return Verdict(candidate, candidate.blocked)
    if candidate.access == "read-only":
        return Verdict(candidate, "the link is read-only, so it cannot start work there")
    rank = runtime_rank
    if (
        candidate.access is not None
        and need.runtime_mode is not None
        and rank(need.runtime_mode) > rank(candidate.access)
    ):
        return Verdict(candidate, f"the link allows at most {candidate.access}, not {need.runtime_mode}")
    cap = candidate.capacity
    stale = cap is None or (not candidate.here and is_stale(candidate, now, max_age))
    if candidate.error is not None and stale:
        return Verdict(candidate, candidate.error)
    if cap is None:
        return Verdict(candidate, "reports no capacity (an older peerd)")
    if cap.preference == "manual-only":
        return Verdict(candidate, "manual only")
    if need.provider not in cap.providers:
        return Verdict(candidate, f"no provider {need.provider}")
    project = need.here_project_id if candidate.here else None
    if project is None:
        if need.repository_key is None:
            return Verdict(candidate, "this project has no repository to match there")
        matches = [p.id for p in cap.projects if p.repository_key == need.repository_key]
        if not matches:
            return Verdict(candidate, "no project with this repository")
        if len(matches) > 1:
            return Verdict(candidate, f"several projects with this repository ({', '.join(matches)})")
        project = matches[0]
    if cap.live_runs >= cap.max_runs:
        return Verdict(candidate, f"full: {standing(cap)}")
    return Verdict(candidate, standing(cap), project_id=project, score=score(cap))


def _rank(verdict: Verdict) -> tuple[float, int, str]:
    return (verdict.score or 0.0, 0 if verdict.candidate.here else 1, verdict.candidate.label)


def choose(candidates: list[Candidate], need: Need, now: float, max_age: float = MAX_AGE_S) -> Placed:
    """The least loaded qualifying candidate, with every candidate's reason; else `no_placement`."""
    verdicts = [judge(c, need, now, max_age) for c in candidates]
    ok = sorted((v for v in verdicts if v.ok), key=_rank)
    if not ok:
        listed = "; ".join(f"{v.candidate.label}: {v.reason}" for v in verdicts) or "no environments"
        raise NoPlacement(
            f"No environment can take this work ({listed}). Free a slot, link or fix one of them, "
            "or name the environment yourself."
        )
    best = ok[0]
    others = [v for v in verdicts if v is not best]
    reason = f"{best.candidate.label}: {best.reason}"
    if others:
        reason += "; " + "; ".join(f"{v.candidate.label}: {v.reason}" for v in others)
    assert best.project_id is not None  # noqa: S101  # set on every qualifying verdict
    return Placed(
        environment_id=best.candidate.env_id,
        label=best.candidate.label,
        project_id=best.project_id,
        reason=reason,
    )
