"""What the plan hop and the scheduler decide, pure (as `steps.py` is for a packet's hops):
`decide_plan_attempt` and `decide_plan_ended` take the facts of the planner's attempt, `schedule`
the packets as recorded; each returns what to do. They read no store, wait for nothing and read
no clock: `engine.py` gathers the facts, asks here and performs the effects.

    plan:      PlanAttempt(attempt, over_budget) -> FailRun | LaunchPlanner | SendBack(errors)
               PlanEnded(attempt, over_budget, status, reply, parsed)
                   -> FailRun (over budget; its run failed; still not valid after the send-back)
                   | AcceptPlan(packets) | Retry(errors)
    schedule:  the packets, those in flight, the concurrency, whether the run is past its budget
                   -> Park(packet, why, expect) ... Start(packet) ...
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from peerd.orchestrate.states import DONE_PACKET, FAILED_PACKET, TERMINAL_PACKET, PacketState

PLAN_ATTEMPTS = 2  # the first plan, and one send-back of what was wrong with it

T = TypeVar("T")


# --- the plan hop --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanAttempt:
    attempt: int  # 1, then 2 for the send-back
    over_budget: str | None  # why the run is past its budget already (None: it is not)
    errors: Sequence[str] = ()  # what was wrong with the previous plan


@dataclass(frozen=True)
class PlanEnded(Generic[T]):
    attempt: int
    over_budget: str | None
    status: str  # how the planner's run ended
    reply: str | None
    packets: T | None  # the plan its reply parsed to (None: not a valid plan)
    errors: Sequence[str] = ()  # why it is not one


@dataclass(frozen=True)
class FailRun:
    why: str


@dataclass(frozen=True)
class LaunchPlanner:
    key: str


@dataclass(frozen=True)
class SendBack:
    """A follow-up in the planner's own session: only what was wrong."""

    key: str
    text: str


@dataclass(frozen=True)
class AcceptPlan(Generic[T]):
    packets: T


@dataclass(frozen=True)
class Retry:
    errors: Sequence[str]


def decide_plan_attempt(event: PlanAttempt) -> FailRun | LaunchPlanner | SendBack:
    if event.over_budget is not None:
        return FailRun(event.over_budget)
    key = f"plan:{event.attempt}"
    if event.attempt == 1:
        return LaunchPlanner(key)
    text = (
        "Your plan is not valid:\n"
        + "\n".join(f"- {e}" for e in event.errors)
        + "\nSend the whole corrected plan as JSON, in the same shape."
    )
    return SendBack(key, text)


def decide_plan_ended(event: PlanEnded[T]) -> FailRun | AcceptPlan[T] | Retry:
    if event.over_budget is not None:
        return FailRun(event.over_budget)
    if event.status != "completed":
        return FailRun(f"The planner's run ended {event.status}: {event.reply or 'no reply'}")
    if event.packets is not None:
        return AcceptPlan(event.packets)
    if event.attempt >= PLAN_ATTEMPTS:
        return FailRun("The plan was not valid after one send-back:\n" + "\n".join(event.errors))
    return Retry(event.errors)


# --- the scheduler -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheduled:
    """A packet as the scheduler sees it."""

    packet_id: str
    state: PacketState
    depends_on: Sequence[str] = ()


@dataclass(frozen=True)
class Park:
    packet_id: str
    why: str
    expect: PacketState  # the state it was decided from (compare-and-set)


@dataclass(frozen=True)
class Start:
    packet_id: str


def schedule(
    packets: Sequence[Scheduled],
    in_flight: Collection[str],
    *,
    concurrency: int,
    over_budget: str | None,
) -> list[Park | Start]:
    """One pass of the scheduler, in the packets' order: past the run's budget every packet not in
    flight parks; a packet whose dependency parked or was cancelled parks (and so, in the same
    pass, do the packets that depend on it); a packet starts (or resumes) once each dependency is
    approved or integrated, a queued one only while fewer than `concurrency` are in flight."""
    states = {p.packet_id: p.state for p in packets}
    running = len(in_flight)
    effects: list[Park | Start] = []
    for packet in packets:
        if packet.packet_id in in_flight or packet.state in TERMINAL_PACKET:
            continue
        if over_budget is not None:  # no new hop starts
            effects.append(Park(packet.packet_id, over_budget, packet.state))
            states[packet.packet_id] = "parked"
            continue
        if packet.state == "approved":
            continue
        blocked = [d for d in packet.depends_on if states.get(d) in FAILED_PACKET]
        if blocked:
            effects.append(
                Park(packet.packet_id, f"Dependency {', '.join(blocked)} did not make it.", packet.state)
            )
            states[packet.packet_id] = "parked"
            continue
        if any(states.get(d) not in DONE_PACKET for d in packet.depends_on):
            continue
        if packet.state == "queued" and running >= concurrency:
            continue
        effects.append(Start(packet.packet_id))
        running += 1
    return effects
