"""The change feed's rules, pure (no sockets, no store, no timers): the set hash, the laptop's
subscription (deltas, the check after a restart, the whole set only on a mismatch) and the box's
per-link feed (reports after a cursor, re-sync after a restart on either side). Each test names
the rule it guards."""

from __future__ import annotations

from peerd.errors import CapabilityDenied, NotFound
from peerd.tasks.feedclient import feed_code, feed_message
from peerd.tasks.machine import EndTask, FollowerMachine, OpenTask, Poll, PollAnswer, RunReport, Subscribe
from peerd.tasks.rules import classify
from peerd.tasks.subscription import (
    Delta,
    LinkFeed,
    Report,
    RunSet,
    Subscription,
    cursor_seq,
    make_cursor,
    set_hash,
)

EPOCH = "0123456789abcdef"


def test_the_set_hash_is_order_independent_and_kept_in_o1() -> None:
    """Rule: both sides keep the hash as runs come and go, and agree whatever the order."""
    assert set_hash(["a", "b", "c"]) == set_hash(["c", "a", "b"]) != set_hash(["a", "b"])
    runs = RunSet(["a", "b"])
    runs.add("c")
    runs.discard("a")
    assert runs.hex == set_hash(["b", "c"])
    assert not runs.add("b"), "adding twice changes nothing (no XOR cancelling)"
    assert runs.hex == set_hash(["b", "c"])
    assert set_hash([]) == "0" * 32


# --- the laptop's subscription -------------------------------------------------------------------


def test_after_a_restart_the_first_request_is_the_hash_only() -> None:
    """Rule: a restart re-syncs with one request: the laptop sends its set's hash, not its set."""
    sub = Subscription()
    sub.load(f"r{i}" for i in range(10_000))
    delta = sub.next_delta()
    assert delta == Delta((), (), False, set_hash(f"r{i}" for i in range(10_000)))
    assert delta.check_only
    sub.confirmed(in_sync=True)
    assert sub.settled and sub.next_delta() is None, "in sync: nothing more is sent"


def test_a_mismatch_sends_the_whole_set_once() -> None:
    """Rule: on a mismatch the box says so and the laptop sends its full set, once."""
    sub = Subscription()
    sub.load(["r1", "r2"])
    sub.next_delta()
    sub.confirmed(in_sync=False)
    full = sub.next_delta()
    assert full == Delta(("r1", "r2"), (), True, set_hash(["r1", "r2"]))
    sub.confirmed(in_sync=True)
    assert sub.next_delta() is None


def test_changes_are_sent_as_deltas_one_request_at_a_time() -> None:
    """Rule: tasks starting and ending change the subscription by deltas (add/remove), coalesced:
    at most one request in flight, the next carrying everything since."""
    sub = Subscription()
    sub.load(["r1"])
    sub.next_delta()
    sub.confirmed(True)
    sub.follow("r2")
    first = sub.next_delta()
    assert first == Delta(("r2",), (), False, set_hash(["r1", "r2"]))
    sub.follow("r3")
    sub.unfollow("r1")
    assert sub.next_delta() is None, "one request in flight"
    sub.confirmed(True)
    assert sub.next_delta() == Delta(("r3",), ("r1",), False, set_hash(["r2", "r3"]))


def test_a_failed_request_is_sent_again_whatever_happened_since() -> None:
    """Rule: adds and removes are idempotent: what a failed request carried is sent again, and a
    run added then removed meanwhile is removed (the box may have it)."""
    sub = Subscription()
    sub.load([])
    sub.next_delta()
    sub.confirmed(True)
    sub.follow("r1")
    sub.follow("r2")
    sub.next_delta()
    sub.unconfirmed()
    sub.unfollow("r1")
    assert sub.next_delta() == Delta(("r2",), ("r1",), False, set_hash(["r2"]))


def test_a_box_restart_with_another_set_is_found_by_the_poll() -> None:
    """Rule: a restart of the box re-syncs with the poll itself: a cursor it does not continue is
    answered with its set's hash; a mismatch (while nothing is unsent) sends the set once."""
    sub = Subscription()
    sub.load(["r1"])
    sub.next_delta()
    sub.confirmed(True)
    sub.polled(make_cursor(EPOCH, 3), set_hash(["r1"]), resynced=True)
    assert sub.next_delta() is None, "same set: nothing to send"
    sub.polled(make_cursor(EPOCH, 0), set_hash([]), resynced=True)
    assert sub.next_delta() == Delta(("r1",), (), True, set_hash(["r1"]))


# --- the box's feed for one link ------------------------------------------------------------------


def feed(runs: dict[str, str | None] | None = None) -> LinkFeed:
    return LinkFeed(EPOCH, runs or {}, cap=5)


def settled(run_id: str) -> Report:
    return Report(run_id, True, True, "completed", run_id, None)


def test_only_changes_after_the_cursor_are_answered() -> None:
    """Rule: the box answers with the changed runs only, after the cursor it was given."""
    f = feed({"r1": "t1", "r2": "t2"})
    assert f.take_dirty() == {"t1", "t2"}, "after loading, every followed thread is looked at once"
    f.record([settled("r1")], ["r2"])
    first, resynced = f.since(None)
    assert (first, resynced) == ([settled("r1")], True)
    cursor = f.cursor
    assert f.since(cursor) == ([], False), "nothing new after it"
    f.record([settled("r1")])
    assert f.since(cursor) == ([], False), "a report that did not change is not sent again"
    f.record([settled("r2")])
    assert f.since(cursor) == ([settled("r2")], False)


def test_a_lost_answer_is_never_a_lost_result() -> None:
    """Rule: a report is kept until the laptop unfollows the run: the old cursor gets it again."""
    f = feed({"r1": "t1"})
    before = f.cursor
    f.record([settled("r1")])
    assert f.since(before) == ([settled("r1")], False)
    assert f.since(before) == ([settled("r1")], False), "asked again, answered again"
    f.apply({}, ["r1"], False, set_hash([]))
    assert f.since(before) == ([], False), "unfollowed: forgotten"


def test_a_cursor_from_another_box_process_or_ahead_resyncs_with_everything_kept() -> None:
    """Rule: a restart on either side re-syncs with one request: a cursor of another epoch, one
    ahead of the box, or none, is answered with every report kept (never more than the link's)."""
    f = feed({"r1": "t1", "r2": "t2"})
    f.record([settled("r1")])
    for cursor in (None, make_cursor("f" * 16, 1), make_cursor(EPOCH, 99)):
        assert f.since(cursor) == ([settled("r1")], True), cursor
    assert cursor_seq(make_cursor(EPOCH, 1), EPOCH, 1) == 1
    assert cursor_seq("bogus", EPOCH, 1) is None


def test_runs_of_no_thread_of_the_link_are_gone_and_nothing_else() -> None:
    """Rule: a run that is not a run of this link's threads (another link's, an unknown one) is
    reported `found: false` with nothing about it, and nothing of it is ever looked at."""
    f = feed({})
    f.apply({"theirs": None, "r1": "t1"}, [], False, set_hash(["theirs", "r1"]))
    reports, _ = f.since(None)
    assert reports == [Report("theirs", found=False, settled=False)]
    assert f.take_dirty() == {"t1"}


def test_the_set_hash_is_checked_after_each_change() -> None:
    f = feed({"r1": "t1"})
    applied = f.apply({"r2": "t2"}, ["r1"], False, set_hash(["r2"]))
    assert applied.in_sync and applied.threads_added == {"t2"} and applied.threads_removed == {"t1"}
    assert not f.apply({"r3": "t3"}, [], False, set_hash(["r3"])).in_sync, "the box holds r2 too"
    assert f.apply({"r3": "t3"}, [], True, set_hash(["r3"])).in_sync, "a reset replaces the set"
    assert set(f.runs) == {"r3"}


def test_the_size_of_a_change_is_known_before_it_is_applied() -> None:
    """Rule: the set size is capped; the shell refuses a change above it before storing anything."""
    f = feed({"r1": "t1", "r2": "t2"})
    assert f.size_after(["r3", "r1"], ["r2"], False) == 2
    assert f.size_after([f"n{i}" for i in range(6)], [], True) == 6 > f.cap
    assert f.size_after(["r1"], ["r1"], False) == 2, "added and removed at once: kept"


def test_a_change_to_one_thread_is_one_thread_to_look_at() -> None:
    """Rule: a wake costs O(1) on the box: only the changed thread is looked at again."""
    f = LinkFeed(EPOCH, {f"r{i}": f"t{i}" for i in range(10_000)})
    f.take_dirty()
    f.changed({"t7", "not-followed"})
    assert f.take_dirty() == {"t7"}


# --- the follower machine with the feed -------------------------------------------------------------


def task(i: int) -> OpenTask:
    return OpenTask(f"task{i}", "running", f"th{i}", f"r{i}", False, "box")


def test_a_new_task_joins_without_restarting_the_poll() -> None:
    """Rule: a new task joins the subscription with a short request beside the poll in flight."""
    m = FollowerMachine(chunk_s=50.0, jitter=lambda: 0.0)
    m.load([task(0)])
    [check] = m.plan(0.0)
    assert isinstance(check, Subscribe)
    m.subscribed(0.0, True)
    [poll] = m.plan(0.0)
    assert isinstance(poll, Poll)
    m.upsert(task(1))
    [join] = m.plan(1.0)
    assert join == Subscribe(Delta(("r1",), (), False, set_hash(["r0", "r1"])))
    m.subscribed(1.0, True)
    assert [type(a).__name__ for a in m.plan(1.0)] == ["AwaitPoll"], "the poll goes on"


def test_a_settled_run_ends_its_task_and_leaves_the_subscription() -> None:
    m = FollowerMachine(chunk_s=50.0, jitter=lambda: 0.0)
    m.load([task(0), task(1)])
    m.plan(0.0)
    m.subscribed(0.0, True)
    m.plan(0.0)
    [read] = m.polled(
        1.0, PollAnswer("x" * 16 + "-1", (RunReport("r1", True, True, "completed", None, "r1"),))
    )
    assert type(read).__name__ == "ReadResult"
    m.drop("task1")
    [leave] = m.plan(1.0)
    assert leave == Subscribe(Delta((), ("r1",), False, set_hash(["r0"])))


def test_a_reply_that_came_with_the_report_ends_the_task_without_a_read() -> None:
    """Rule: a wake is O(1) requests: with the reply inline the task ends on the poll's answer."""
    m = FollowerMachine(chunk_s=50.0, jitter=lambda: 0.0)
    m.load([task(0)])
    m.plan(0.0)
    m.subscribed(0.0, True)
    m.plan(0.0)
    report = RunReport("r0", True, True, "completed", None, "r0", "THE REPLY", True)
    assert m.polled(1.0, PollAnswer("x" * 16 + "-1", (report,))) == [
        EndTask("task0", "completed", "THE REPLY")
    ]


def test_runs_past_the_cap_wait_and_join_when_one_leaves() -> None:
    """Rule: the laptop follows at most the cap of runs per link (the box refuses more); the
    others wait in arrival order and join as soon as a followed one leaves."""
    m = FollowerMachine(chunk_s=50.0, jitter=lambda: 0.0, max_followed=2)
    m.load([task(0), task(1), task(2)])
    assert m.sub.want.ids == {"r0", "r1"}
    m.plan(0.0)
    m.subscribed(0.0, True)
    m.drop("task0")
    [join] = m.plan(1.0)
    assert join == Subscribe(Delta(("r2",), ("r0",), False, set_hash(["r1", "r2"])))


def test_a_box_without_the_change_feed_is_waited_out_not_a_dead_link() -> None:
    """Rule (old boxes): a box that answers `not_found` for the feed's routes backs the link off
    with a sentence saying to update peerd there; its tasks are not failed."""
    gone = NotFound("No such endpoint: POST /v1/feed/changes")
    assert classify(feed_code(gone)) == "transient"
    assert (
        feed_message(gone, "box")
        == "box runs a peerd without the change feed; update peerd there (the tasks wait)."
    )
    assert feed_code(CapabilityDenied("refused")) == "capability_denied"
