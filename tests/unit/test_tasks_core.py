"""The delegated-task rules, pure."""

from __future__ import annotations

import pytest

from peerd.tasks.rules import (
    BACKOFF_MAX_S,
    backoff_delay,
    cancel_result,
    complete,
    role_prompt,
    should_wake,
    task_status_from_run,
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
    assert [backoff_delay(n, 0.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert backoff_delay(9, 0.0) == BACKOFF_MAX_S
    assert backoff_delay(10_000, 0.5) == BACKOFF_MAX_S + 0.5, "no overflow, no attempt limit"
    assert 2.0 <= backoff_delay(1, 0.999) < 3.0


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
