"""The delegated-task rules, pure."""

from __future__ import annotations

import sqlite3

import pytest

from peerd.errors import NotLinked, PeerdError, PeerUnreachable, StorageUnavailable, ThreadNotFound
from peerd.tasks.rules import (
    LINK_BACKOFF,
    STORE_RETRY,
    RunFact,
    cancel_result,
    classify,
    complete,
    error_code,
    is_store_fault,
    result_text,
    role_prompt,
    settlement,
    should_wake,
    stopped_with_parent,
    task_status_from_run,
    wake_due,
    wake_text,
)


@pytest.mark.parametrize("current", ["pending", "running"])
def test_an_open_task_takes_its_first_result(current: str) -> None:
    done = complete(current, "completed", "the reply")
    assert done is not None and (done.status, done.result) == ("completed", "the reply")


@pytest.mark.parametrize("current", ["completed", "failed", "cancelled", "interrupted"])
def test_first_result_wins_a_later_report_is_refused(current: str) -> None:
    assert complete(current, "completed", "a late reply") is None


def test_a_non_terminal_report_completes_nothing() -> None:
    assert complete("running", "running", "x") is None  # type: ignore[arg-type]


def test_wake_rules() -> None:
    assert should_wake("always", parent_live=True) is True
    assert should_wake("always", parent_live=False) is True
    assert should_wake("settled_only", parent_live=True) is False, "a waiting call takes the result"
    assert should_wake("settled_only", parent_live=False) is True


def test_the_wake_text_is_the_references() -> None:
    assert wake_text(["tsk_1"]) == (
        "Delegated task tsk_1 reached a terminal state. Use task_status with taskId tsk_1 to read the result."
    )
    assert wake_text(["a", "b"]).startswith("Delegated tasks a, b reached terminal states.")


def test_backoff_doubles_from_two_seconds_to_five_minutes() -> None:
    assert [LINK_BACKOFF.delay(n, 0.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert LINK_BACKOFF.delay(9, 0.0) == 300.0
    assert LINK_BACKOFF.delay(10_000, 0.5) == 300.5, "no overflow, no attempt limit"
    assert 2.0 <= LINK_BACKOFF.delay(1, 0.999) < 3.0


def test_a_store_fault_is_retried_from_two_seconds_to_thirty() -> None:
    assert [STORE_RETRY.delay(n, 0.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 16.0, 30.0]
    assert STORE_RETRY.delay(10_000, 0.999) == 30.999


def test_role_prompt() -> None:
    assert role_prompt("review", "check it") == "Act as the review sub-agent for this task.\n\ncheck it"
    assert role_prompt("general", "x") == "x"
    assert role_prompt(None, "x") == "x"


def test_run_statuses_map_to_task_statuses() -> None:
    assert task_status_from_run("completed") == "completed"
    assert task_status_from_run("failed") == "failed"
    assert task_status_from_run("interrupted") == "interrupted"
    assert task_status_from_run("rolled_back") == "cancelled"


def test_cancel_result() -> None:
    assert cancel_result("not needed") == "Cancelled: not needed"
    assert cancel_result(None) == "Cancelled."


def test_stopped_with_parent() -> None:
    assert stopped_with_parent("User stopped") == "Stopped with its parent: User stopped"
    assert stopped_with_parent(None) == "Stopped with its parent."


def test_the_wake_condition() -> None:
    live = {"parent_status": "active", "queue_held": False}
    assert wake_due("always", **live, parent_live=True) is True
    assert wake_due("settled_only", **live, parent_live=True) is False, "the waiting call takes it"
    assert wake_due("settled_only", **live, parent_live=False) is True
    assert wake_due("always", parent_status="active", queue_held=True, parent_live=False) is False, "stopped"
    assert wake_due("always", parent_status="archived", queue_held=False, parent_live=False) is False
    assert wake_due("always", parent_status=None, queue_held=False, parent_live=False) is False, "gone"
    assert wake_due("always", **live, parent_live=False, wanted=False) is False, "the caller hears it"


def test_one_result_text_policy_for_local_and_remote_children() -> None:
    assert result_text("completed", "the reply", "why") == "the reply"
    assert result_text("completed", None, "why") == "why"
    assert result_text("completed", None, None) == "(The child thread ended without a reply.)"
    assert (
        result_text("interrupted", None, None, where="box")
        == "(The child thread in box ended without a reply.)"
    )
    assert result_text("failed", "the reply", "the error") == "the error", (
        "a failed run's result is its error"
    )
    assert result_text("failed", "the reply", None) == "the reply"
    assert result_text("failed", None, None, where="box") == "The child run in box failed."


def fact(number: int, status: str, origin: str = "user") -> RunFact:
    return RunFact(f"r{number}", number, status, origin)


def test_settlement_waits_for_the_childs_own_work() -> None:
    launched = fact(1, "completed")
    assert settlement(launched, [launched], open_children=False, queue_held=False) == (True, launched)
    assert settlement(launched, [launched], open_children=True, queue_held=False)[0] is False
    wake = fact(2, "running", "wake")
    assert settlement(launched, [launched, wake], open_children=False, queue_held=False)[0] is False
    done = fact(2, "completed", "wake")
    assert settlement(launched, [launched, done], open_children=False, queue_held=False) == (True, done)
    later = fact(3, "completed", "user")
    assert settlement(launched, [launched, done, later], open_children=False, queue_held=False) == (
        True,
        done,
    )


def test_a_continuation_after_a_restart_is_the_childs_own_work() -> None:
    cut = fact(1, "interrupted")
    going_on = fact(2, "queued", "continue")
    assert settlement(cut, [cut, going_on], open_children=False, queue_held=False)[0] is False
    finished = fact(2, "completed", "continue")
    assert settlement(cut, [cut, finished], open_children=False, queue_held=False) == (True, finished)
    assert settlement(cut, [cut, going_on], open_children=False, queue_held=True) == (True, cut), "stopped"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("unreachable", "transient"),
        ("storage_unavailable", "transient"),
        ("shutting_down", "transient"),
        ("unavailable", "transient"),
        ("clock_skew", "transient"),  # the box's clock: right again, the link works again
        ("version_skew", "transient"),  # the box's peerd: updated, the call works
        ("rate_limited", "transient"),
        ("capability_denied", "link"),
        ("not_linked", "link"),
        ("link_revoked", "link"),
        ("pin_mismatch", "link"),
        ("not_a_peerd", "link"),
        ("wrong_environment", "link"),
        ("incompatible", "link"),
        ("parent_not_active", "task"),  # narrower than capability_denied: one task, not the link
        ("not_yours", "task"),
        ("thread_not_found", "task"),
        ("invalid_request", "task"),
        ("idempotency_key_reused", "task"),
        ("internal_error", "task"),  # a bug is not retried for ever
        ("a_code_from_a_newer_peerd", "task"),
    ],
)
def test_failures_are_sorted_by_code(code: str, kind: str) -> None:
    assert classify(code) == kind


def test_error_codes_of_exceptions() -> None:
    assert error_code(NotLinked("This environment is not linked to x.")) == "not_linked"
    assert error_code(ThreadNotFound("not linked")) == "thread_not_found", "the message is never read"
    assert error_code(PeerUnreachable("x")) == "unreachable"
    assert error_code(PeerdError("x", code="newer_than_this")) == "newer_than_this"  # a newer peer's
    assert error_code(sqlite3.OperationalError("database or disk is full")) == "storage_unavailable"
    assert error_code(RuntimeError("bug")) == "internal_error"
    assert is_store_fault(StorageUnavailable("full")) and not is_store_fault(ValueError())
