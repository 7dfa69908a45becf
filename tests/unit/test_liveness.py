"""The sweep of open work, pure (peerd/core/liveness.py): which open records nothing owns, owes
or ends, and the fix for each."""

from __future__ import annotations

from peerd.core.liveness import (
    STARTING_GRACE_S,
    OpenApproval,
    OpenMove,
    OpenRun,
    OpenTask,
    OpenWait,
    Owners,
    Snapshot,
    sweep,
)

NOW = 10_000.0
OLD = NOW - STARTING_GRACE_S - 1


def actions(snapshot: Snapshot, owners: Owners | None = None) -> list[tuple[str, str]]:
    return [(f.action, f.id) for f in sweep(snapshot, owners or Owners())]


def test_a_live_run_nothing_runs_is_cut_and_one_being_run_is_owned() -> None:
    runs = [OpenRun("r1", "t1", "running", OLD), OpenRun("r2", "t2", "running", OLD)]
    assert actions(Snapshot(NOW, runs=runs), Owners(runs=frozenset({"r2"}))) == [("cut_run", "r1")]


def test_a_run_just_made_starting_is_on_its_clock() -> None:
    young = OpenRun("r1", "t1", "starting", NOW - 1)
    assert actions(Snapshot(NOW, runs=[young])) == []
    assert actions(Snapshot(NOW, runs=[OpenRun("r1", "t1", "starting", OLD)])) == [("cut_run", "r1")]
    # `running` has no grace: its task existed before it was recorded so.
    assert actions(Snapshot(NOW, runs=[OpenRun("r1", "t1", "running", NOW - 1)])) == [("cut_run", "r1")]


def test_a_queue_nothing_starts_is_started_unless_held_archived_or_busy() -> None:
    runs = [
        OpenRun("q1", "t1", "queued", OLD),
        OpenRun("q2", "t1", "queued", OLD),  # one fix per thread
        OpenRun("q3", "t2", "queued", OLD, queue_held=True),  # a Stop: the owner's
        OpenRun("q4", "t3", "queued", OLD, archived=True),
        OpenRun("q5", "t4", "queued", OLD),
        OpenRun("r5", "t4", "running", OLD),  # its live run goes first
        OpenRun("q6", "t5", "queued", NOW - 1),  # just queued: the run manager is on it
    ]
    assert actions(Snapshot(NOW, runs=runs), Owners(runs=frozenset({"r5"}))) == [("start_queue", "t1")]


def test_a_question_whose_run_is_gone_is_withdrawn() -> None:
    approvals = [
        OpenApproval("a1", "r1", "interrupted"),
        OpenApproval("a2", "r2", None),  # the run is gone
        OpenApproval("a3", "r3", "running"),  # asked by a live run: its gate owns it
        OpenApproval("a4", "r4", "completed"),  # a gate still waits on it: owned until answered
    ]
    found = actions(Snapshot(NOW, approvals=approvals), Owners(questions=frozenset({"a4"})))
    assert found == [("withdraw_approval", "a1"), ("withdraw_approval", "a2")]


def test_a_local_task_with_nothing_left_to_do_is_settled() -> None:
    tasks = [
        OpenTask("k1", "running", None, child_thread_id="c1"),
        OpenTask("k2", "running", None, child_thread_id="c2", child_busy=True),  # its child works
        OpenTask("k3", "pending", None),  # its launch is in flight (start-up relaunches it)
        OpenTask("k4", "running", "box", link_known=True),  # the follower drives it
        OpenTask("k5", "running", "gone", link_known=False),
        OpenTask("k6", "completed", None, child_thread_id="c6"),
    ]
    assert actions(Snapshot(NOW, tasks=tasks)) == [("settle_task", "c1"), ("end_task", "k5")]


def test_a_move_nobody_drives_is_resumed() -> None:
    moves = [OpenMove("m1", "moving"), OpenMove("m2", "waiting"), OpenMove("m3", "moved")]
    assert actions(Snapshot(NOW, moves=moves), Owners(moves=frozenset({"m2"}))) == [("resume_move", "m1")]


def test_a_wait_nobody_watches_is_resumed() -> None:
    waits = [OpenWait("w1"), OpenWait("w2")]
    assert actions(Snapshot(NOW, waits=waits), Owners(waits=frozenset({"w2"}))) == [("resume_wait", "w1")]


def test_a_quiet_store_breaks_nothing() -> None:
    assert sweep(Snapshot(NOW), Owners()) == []
