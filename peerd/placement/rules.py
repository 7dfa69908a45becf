"""The placement rules (pure): which environments may take a piece of work, and which one does.

Fed the candidates (this environment and its linked ones, each with its last capacity report and
when it was read), what the work needs and the reservation ledger; no I/O, one injected `now`. A
candidate qualifies when it has the project's repository (exactly one project with it), the
provider installed, room under its `max_runs`, is not `manual-only`, and its link allows the
requested modes (never read-only). Among those the least loaded wins: the mean of its runs' share
of max_runs, its load per CPU (capped at 2) and its used memory's share, plus a floor, times its
preference's weight (prefer 0.5 < normal 1 < less 2). A tie goes to the one chosen least recently,
then to this environment, then by label.

Its runs are the report's live and queued runs plus the ones held for it in the `Ledger`: each
choice reserves a run on the chosen one at once (`reserve`), and a reservation counts until a report
read more than `ABSORB_AFTER_S` after it (which counts the run itself) absorbs it. So a burst of
choices made before any box reports again splits by free capacity, in proportion to `max_runs`.
"Full" is what a report says (its live and queued runs at `max_runs`): reserved runs are an
estimate, so they weigh in the score but never refuse, and a burst larger than the room left
spreads over the candidates in proportion to `max_runs` instead of being refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
# A report read this long after a choice counts the run chosen (the launch has reached the box,
# and a box keeps its own report for at most a second): the reservation is absorbed then.
ABSORB_AFTER_S = 2.0
HERE = ""  # this environment's key in the ledger


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

    @property
    def key(self) -> str:
        """Its key in the ledger."""
        return HERE if self.env_id is None else self.env_id


@dataclass(frozen=True)
class Reservation:
    """A run placed on `target` at `at` (this machine's clock), the `seq`th choice."""

    target: str
    at: float
    seq: int


@dataclass(frozen=True)
class Ledger:
    """What the chooser holds between choices: the reservations no report has absorbed yet (kept
    until `keep_for` after they were made, past which every report that still counts is newer),
    and when each candidate was last chosen (by choice number)."""

    held: tuple[Reservation, ...] = ()
    last_chosen: Mapping[str, int] = field(default_factory=dict)
    seq: int = 0


def held_for(ledger: Ledger, candidate: Candidate, margin: float = ABSORB_AFTER_S) -> int:
    """The runs reserved on this candidate that its report does not count yet: every reservation
    made less than `margin` before the report was read, or after it."""
    seen = candidate.seen_at
    return sum(1 for r in ledger.held if r.target == candidate.key and (seen is None or seen < r.at + margin))


def reserve(
    ledger: Ledger, target: str, now: float, keep_for: float = 2 * MAX_AGE_S + ABSORB_AFTER_S
) -> Ledger:
    """The ledger with one more run reserved on `target`, chosen now; reservations older than
    `keep_for` are dropped (a report that old is read again before choosing)."""
    seq = ledger.seq + 1
    held = (*(r for r in ledger.held if r.at > now - keep_for), Reservation(target, now, seq))
    return Ledger(held, {**ledger.last_chosen, target: seq}, seq)


def release(ledger: Ledger, seq: int) -> Ledger:
    """The ledger without the reservation of choice `seq` (its choice was not used)."""
    return Ledger(tuple(r for r in ledger.held if r.seq != seq), ledger.last_chosen, ledger.seq)


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


def busy(capacity: Capacity, held: int = 0) -> int:
    """Its runs: live and queued as reported, plus those held for it since."""
    return capacity.live_runs + capacity.queued_runs + held


def load_score(capacity: Capacity, held: int = 0) -> float:
    """0 (idle) to about 1.3 (full, overloaded, out of memory), before the preference weight."""
    runs = 1.0 if capacity.max_runs == 0 else busy(capacity, held) / capacity.max_runs
    load = min((capacity.load or 0.0) / capacity.cpus, LOAD_CAP)
    mem = 0.5  # not reported: neither good nor bad
    if capacity.mem_available is not None and capacity.mem_total:
        mem = 1.0 - min(capacity.mem_available / capacity.mem_total, 1.0)
    return (runs + load + mem) / 3


def score(capacity: Capacity, held: int = 0) -> float:
    """Lower wins: the load score (plus a floor) times the preference's weight."""
    return (load_score(capacity, held) + FLOOR) * WEIGHT[capacity.preference]


def standing(capacity: Capacity, held: int = 0) -> str:
    """`1 of 8 runs, load 0.4, 3.2 GiB free, prefers`: how a candidate stands (`3 of 8 runs (1
    queued, 1 just placed)` with queued and reserved runs)."""
    runs = f"{busy(capacity, held)} of {capacity.max_runs} runs"
    extra = [f"{n} {what}" for n, what in ((capacity.queued_runs, "queued"), (held, "just placed")) if n]
    parts = [runs + (f" ({', '.join(extra)})" if extra else "")]
    if capacity.load is not None:
        parts.append(f"load {capacity.load:.1f}")
    if capacity.mem_available is not None:
        parts.append(f"{capacity.mem_available / 2**30:.1f} GiB free")
    parts.append(SHOWN[capacity.preference])
    return ", ".join(parts)


def judge(candidate: Candidate, need: Need, now: float, max_age: float = MAX_AGE_S, held: int = 0) -> Verdict:
    """Whether this candidate may take the work, and why not (one sentence's worth); `held`: the
    runs reserved on it that its report does not count yet."""
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
    if busy(cap) >= cap.max_runs:  # as reported: runs just placed weigh (below) but never refuse
        return Verdict(candidate, f"full: {standing(cap, held)}")
    return Verdict(candidate, standing(cap, held), project_id=project, score=score(cap, held))


def _rank(verdict: Verdict, ledger: Ledger) -> tuple[float, int, int, str]:
    cand = verdict.candidate
    last = ledger.last_chosen.get(cand.key, 0)  # 0: never chosen, so before every chosen one
    return (verdict.score or 0.0, last, 0 if cand.here else 1, cand.label)


def place(
    candidates: list[Candidate], need: Need, ledger: Ledger, now: float, max_age: float = MAX_AGE_S
) -> tuple[Placed, Ledger]:
    """The choice (`choose`) and the ledger with a run reserved on it: the one step a burst of
    choices must take one at a time."""
    placed = choose(candidates, need, now, max_age, ledger)
    target = HERE if placed.environment_id is None else placed.environment_id
    return placed, reserve(ledger, target, now, 2 * max_age + ABSORB_AFTER_S)


def choose(
    candidates: list[Candidate],
    need: Need,
    now: float,
    max_age: float = MAX_AGE_S,
    ledger: Ledger | None = None,
) -> Placed:
    """The least loaded qualifying candidate (counting the runs `ledger` holds for each), with
    every candidate's reason; else `no_placement`."""
    ledger = ledger or Ledger()
    verdicts = [judge(c, need, now, max_age, held_for(ledger, c)) for c in candidates]
    ok = sorted((v for v in verdicts if v.ok), key=lambda v: _rank(v, ledger))
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
