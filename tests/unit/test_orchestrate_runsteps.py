"""What the plan hop and the scheduler decide (`peerd/orchestrate/runsteps.py`), without I/O."""

from __future__ import annotations

from peerd.orchestrate import runsteps as rs
from peerd.orchestrate.runsteps import Park, Scheduled, Start, schedule


def test_the_plan_hop_launches_then_sends_back_what_was_wrong() -> None:
    assert rs.decide_plan_attempt(rs.PlanAttempt(1, None)) == rs.LaunchPlanner("plan:1")
    again = rs.decide_plan_attempt(rs.PlanAttempt(2, None, ["packet a: no files"]))
    assert again == rs.SendBack(
        "plan:2",
        "Your plan is not valid:\n- packet a: no files\nSend the whole corrected plan as JSON, in the same shape.",
    )
    assert rs.decide_plan_attempt(rs.PlanAttempt(2, "over the budget", ["x"])) == rs.FailRun(
        "over the budget"
    )


def test_the_plan_hop_ends_with_a_plan_one_send_back_or_a_failed_run() -> None:
    def ended(attempt: int, **facts: object) -> object:
        given: dict[str, object] = {"over_budget": None, "status": "completed", "reply": "r", "packets": None}
        given.update(facts)
        return rs.decide_plan_ended(rs.PlanEnded(attempt, **given))  # type: ignore[arg-type]

    assert ended(1, packets=["a"]) == rs.AcceptPlan(["a"])
    assert ended(1, errors=["bad"]) == rs.Retry(["bad"])
    assert ended(2, errors=["bad", "worse"]) == rs.FailRun(
        "The plan was not valid after one send-back:\nbad\nworse"
    )
    assert ended(1, status="failed", reply=None) == rs.FailRun("The planner's run ended failed: no reply")
    assert ended(1, status="interrupted", reply="cut") == rs.FailRun(
        "The planner's run ended interrupted: cut"
    )
    assert ended(1, over_budget="spent", packets=["a"]) == rs.FailRun("spent")


def test_a_packet_starts_once_its_dependencies_are_done_within_the_concurrency() -> None:
    packets = [
        Scheduled("a", "queued"),
        Scheduled("b", "queued"),
        Scheduled("c", "queued", ("a",)),
        Scheduled("d", "reviewing"),  # resumed whatever the concurrency
    ]
    assert schedule(packets, (), concurrency=1, over_budget=None) == [Start("a"), Start("d")]
    assert schedule(packets, ("a",), concurrency=2, over_budget=None) == [Start("b"), Start("d")]
    done = [Scheduled("a", "approved"), Scheduled("c", "queued", ("a",)), Scheduled("e", "integrated")]
    assert schedule(done, (), concurrency=1, over_budget=None) == [Start("c")]


def test_a_failed_dependency_parks_its_dependents_in_the_same_pass() -> None:
    packets = [
        Scheduled("a", "parked"),
        Scheduled("b", "queued", ("a",)),
        Scheduled("c", "queued", ("b",)),
        Scheduled("d", "queued", ("x",)),  # not known: waits
    ]
    assert schedule(packets, (), concurrency=4, over_budget=None) == [
        Park("b", "Dependency a did not make it.", "queued"),
        Park("c", "Dependency b did not make it.", "queued"),
    ]


def test_past_the_budget_every_packet_not_in_flight_parks() -> None:
    packets = [Scheduled("a", "implementing"), Scheduled("b", "approved"), Scheduled("c", "integrated")]
    assert schedule(packets, ("a",), concurrency=1, over_budget="spent") == [Park("b", "spent", "approved")]
