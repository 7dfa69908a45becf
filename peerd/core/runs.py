"""Run lifecycle rules, pure: which transitions are allowed, which run starts next, what an
interrupt does, and how startup recovers runs a dead daemon left live.

    queued ──> starting ──> running ──> completed | failed | interrupted
      │           │                       ^
      └───────────┴──> cancelled          └── (starting can also end failed or interrupted)

A run a daemon stop or crash cut (`plan_cut`) whose work had already passed its budget (from the
usage recorded before the stop) fails with the budget's reason and is never continued. Any other
cut run is interrupted with a reason naming the environment;
a wake run, and a delegated child's run where the box allows it, is continued by a new run
(origin "continue", naming the cut run) recorded in the same transaction:

    running ──cut──> interrupted  +  queued (continue) ──> starting ──> ...

The run manager asks these functions and then performs the I/O; nothing here touches a store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from peerd import errors

RunStatus = Literal["queued", "starting", "running", "completed", "failed", "cancelled", "interrupted"]

TERMINAL: frozenset[RunStatus] = frozenset({"completed", "failed", "cancelled", "interrupted"})
LIVE: frozenset[RunStatus] = frozenset({"starting", "running"})

_ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    "queued": frozenset({"starting", "cancelled"}),
    "starting": frozenset({"running", "failed", "interrupted", "cancelled"}),
    "running": frozenset({"completed", "failed", "interrupted"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "interrupted": frozenset(),
}

# The codes of a run's items (the typed mark; the reason is prose): declared once, with what each
# means, in peerd/errors.py's table of item codes (`ITEM_CODES`).
DAEMON_STOPPED = errors.DAEMON_STOPPED
CONFINED = errors.CONFINED
BUDGET_EXCEEDED = errors.BUDGET_EXCEEDED
RUN_INTERRUPTED = errors.RUN_INTERRUPTED
INTERRUPT_REASONS = ("Interrupted.", "Stopped.")  # an interrupt's reason when its caller gave none


def interrupted_notice(reason: str | None) -> str:
    """The text of the item an interrupt leaves (`RUN_INTERRUPTED`): its reason as a sentence."""
    if not reason or reason in INTERRUPT_REASONS:
        return reason or INTERRUPT_REASONS[0]
    return f"Interrupted: {reason}"


RECOVERY_REASON = "The daemon stopped while this run was live; it was interrupted."
SHUTDOWN_REASON = "The daemon shut down while this run was live; it was interrupted."
CONTINUE_NOTE = "Your previous turn was cut off by a restart of peerd; continue."
# A run cut again and again (a restart loop) is continued this many times in a row, no more.
MAX_CONTINUATIONS = 3

RunOrigin = Literal["user", "wake", "continue"]
CutHow = Literal["crash", "shutdown"]
ThreadKind = Literal["plain", "child", "orchestrated"]


class InvalidTransition(ValueError):
    pass


@dataclass(frozen=True)
class RunFact:
    """What settling a delegated task needs to know of one of the child thread's runs (read by
    `store/threads/reads.py:run_facts`, weighed by `tasks/rules.py:settlement`)."""

    id: str
    number: int
    status: str
    origin: str  # "user", "wake" or "continue"
    reason: str | None = None


def is_terminal(status: RunStatus) -> bool:
    return status in TERMINAL


def is_live(status: RunStatus) -> bool:
    return status in LIVE


def check_transition(current: RunStatus, new: RunStatus) -> RunStatus:
    """Return `new` if a run may go from `current` to it; a terminal status is final."""
    if new not in _ALLOWED[current]:
        raise InvalidTransition(f"a run cannot go from {current} to {new}")
    return new


@dataclass(frozen=True)
class RunView:
    """The little a decision needs to know about a run."""

    id: str
    number: int
    status: RunStatus
    origin: str = "user"  # "user", "wake" (a task's result for its parent), "continue" (after a cut)
    continues: str | None = None  # for origin "continue": the cut run it goes on with


def next_to_start(runs: Sequence[RunView], *, queue_held: bool, archived: bool) -> str | None:
    """The run to start now: the oldest queued one, only when nothing is live and the queue flows.
    A continuation goes first: it finishes the turn a restart cut, before anything queued after it."""
    if queue_held or archived or any(is_live(r.status) for r in runs):
        return None
    queued = [r for r in runs if r.status == "queued"]
    first = [r for r in queued if r.origin == "continue"] or queued
    return min(first, key=lambda r: r.number).id if first else None


@dataclass(frozen=True)
class InterruptPlan:
    target_run: str | None  # the live run to interrupt
    hold_queue: bool
    outcome: Literal["interrupt_requested", "no_active_run", "cancelled"] | RunStatus
    cancel_run: str | None = None  # the queued run that ends cancelled now (it never starts)


def plan_interrupt(runs: Sequence[RunView], *, stop: bool, run_id: str | None = None) -> InterruptPlan:
    """Interrupt the live run, if any; `stop` also holds the queue so nothing queued starts.

    With `run_id`, only that run: live, it is interrupted; queued, it is cancelled (it leaves the
    queue and never starts, whatever runs before it); ended, nothing changes and the outcome is its
    status. The caller has checked that the run is one of these `runs`."""
    if run_id is not None:
        run = next(r for r in runs if r.id == run_id)
        if run.status == "queued":
            return InterruptPlan(None, stop, "cancelled", cancel_run=run.id)
        if is_live(run.status):
            return InterruptPlan(run.id, stop, "interrupt_requested")
        return InterruptPlan(None, stop, run.status)
    live = [r for r in runs if is_live(r.status)]
    if live:
        return InterruptPlan(max(live, key=lambda r: r.number).id, stop, "interrupt_requested")
    return InterruptPlan(None, stop, "no_active_run")


# --- runs a daemon stop cut ------------------------------------------------------------------


def thread_kind(*, started_by: str | None, delegated: bool) -> ThreadKind:
    """Whose work a thread is: a delegated child (a task here, or a link's launch carrying its
    lineage), an orchestration's coder (its engine resumes it), or anything else."""
    if started_by is not None and started_by.startswith("orchestrate:"):
        return "orchestrated"
    if delegated or (started_by is not None and started_by.startswith("task:")):
        return "child"
    return "plain"


@dataclass(frozen=True)
class CutThread:
    """What deciding about a cut run needs to know of its thread."""

    kind: ThreadKind
    stopped: bool  # its queue is held (a person's or its parent's Stop) or it is archived
    has_session: bool  # a provider session to resume
    runs: tuple[RunView, ...]


@dataclass(frozen=True)
class Cut:
    """A run a daemon stop cut: interrupted with `reason`; when `continued`, a new run (origin
    "continue") goes on with it in the same session, its prompt `continuation_prompt(...)` of the
    prompt of run `repeat_prompt_of` (None: the note alone)."""

    run_id: str
    reason: str
    continued: bool
    repeat_prompt_of: str | None = None
    status: Literal["interrupted", "failed"] = "interrupted"  # failed: its budget was passed


def cut_chain(run: RunView, runs: Sequence[RunView]) -> list[RunView]:
    """`run`, the run it continues, the one that one continues ... back to the first cut one."""
    by_id = {r.id: r for r in runs}
    chain = [run]
    while chain[-1].origin == "continue" and chain[-1].continues in by_id and len(chain) <= len(runs):
        chain.append(by_id[chain[-1].continues])
    return chain


def stop_reason(label: str | None, how: CutHow, *, continued: bool) -> str:
    """Says where it happened: the daemon of which environment stopped, and what becomes of it."""
    if label is None and not continued:
        return RECOVERY_REASON if how == "crash" else SHUTDOWN_REASON
    who = f"The daemon of {label}" if label else "The daemon"
    verb = "stopped" if how == "crash" else "shut down"
    then = "it goes on in a new run after the restart." if continued else "it was interrupted."
    return f"{who} {verb} while this run was live; {then}"


def plan_cut(
    run: RunView,
    thread: CutThread,
    *,
    label: str | None,
    continue_children: bool,
    how: CutHow,
    over_budget: str | None = None,
) -> Cut:
    """A live run cut by a stop or crash of this daemon.

    A wake run is always continued: the wake is owed until a wake run finishes. A delegated
    child's run is continued when the box's setting says so (`continue_cut_runs`, on by default).
    Never a thread a person or its parent stopped, never an orchestration's coder (its engine
    resumes it, once per cut, with the packet's prompt), and never more than `MAX_CONTINUATIONS`
    cuts in a row (no restart loops). The continuation repeats the first prompt of the chain when
    the agent may not have it (a wake's message, a run that never reached its provider, no session).
    A run whose work had passed its budget (`over_budget`: why, from its recorded usage) fails
    with that reason and is not continued: the stop the budget asked for is what the cut lost.
    """
    if over_budget is not None:
        return Cut(run_id=run.id, reason=over_budget, continued=False, status="failed")
    chain = cut_chain(run, thread.runs)
    root = chain[-1]
    wanted = root.origin == "wake" or (continue_children and thread.kind == "child")
    continued = wanted and not thread.stopped and len(chain) <= MAX_CONTINUATIONS
    repeat = root.origin == "wake" or run.status == "starting" or not thread.has_session
    return Cut(
        run_id=run.id,
        reason=stop_reason(label, how, continued=continued),
        continued=continued,
        repeat_prompt_of=root.id if continued and repeat else None,
    )


def continuation_prompt(repeated: str | None) -> str:
    if repeated is None:
        return CONTINUE_NOTE
    return f"{CONTINUE_NOTE} The message of that turn was:\n\n{repeated}"


def recover_at_startup(
    threads: Sequence[CutThread],
    *,
    label: str | None = None,
    continue_children: bool = False,
    how: CutHow = "crash",
    over_budget: Mapping[str, str] | None = None,
) -> list[Cut]:
    """Runs that were live when the daemon died are cut: interrupted with the reason, and
    continued where `plan_cut` says so; those in `over_budget` (run id -> why) fail."""
    past = over_budget or {}
    return [
        plan_cut(r, t, label=label, continue_children=continue_children, how=how, over_budget=past.get(r.id))
        for t in threads
        for r in t.runs
        if is_live(r.status)
    ]
