"""The board's pure rules (peerd/console/board.py): a thread's column, what needs the person and
why, the filters and the paging."""

from __future__ import annotations

from peerd import contracts as c
from peerd.console.board import Card, Filters, column_of, lay_out, needs_of, task_waits


def thread(
    n: int = 1, *, status: str | None = "completed", reason: str | None = None, state: str = "active"
) -> c.Thread:
    run = None
    if status is not None:
        run = {"id": f"run_{n}", "threadId": f"thr_{n}", "number": 1, "status": status, "reason": reason,
               "createdAt": 0.5}  # fmt: skip
    data = {
        "id": f"thr_{n}", "projectId": "prj", "title": f"Thread {n}", "provider": "script", "model": None,
        "runtimeMode": "auto", "interactionMode": "default", "status": "active", "queueHeld": False,
        "inPlace": False, "worktreePath": "/w", "branch": None, "providerSession": None,
        "createdAt": 1.0, "updatedAt": float(n), "latestRun": run,
    }  # fmt: skip
    return c.Thread.model_validate(data | {"status": state})


def task(status: str = "failed", ended: float | None = 200.0) -> c.TaskInfo:
    return c.TaskInfo.model_validate(
        {
            "taskId": "tsk_1",
            "status": status,
            "title": "sub",
            "parentThreadId": "thr_1",
            "createdAt": 1.0,
            "endedAt": ended,
        }
    )


def test_columns_by_the_latest_run() -> None:
    assert column_of(thread(status=None)) == "queued"
    assert column_of(thread(status="starting")) == "queued"
    assert column_of(thread(status="running")) == "running"
    assert column_of(thread(status="completed")) == "done"
    for ended in ("failed", "cancelled", "interrupted"):
        assert column_of(thread(status=ended)) == "failed"
    assert column_of(thread(status="completed", state="moved")) == "done"


def test_what_needs_the_person() -> None:
    plain = thread(status="failed", reason="exit 3")
    assert needs_of(plain) == ()
    stopped = thread(status="failed", reason="budget exceeded: 5,000 of 10 tokens")
    (need,) = needs_of(stopped)
    assert need.kind == "budget" and column_of(stopped, (need,)) == "needs"
    asked = needs_of(thread(status="running"), approvals=[("ap_1", "run `ls`")])
    assert [(n.kind, n.approval_id) for n in asked] == [("approval", "ap_1")]
    # a failed task waits while its parent has not run since it ended
    assert task_waits(task(), thread(status="completed"))
    assert not task_waits(task(ended=0.1), thread(status="completed"))  # the parent ran after
    assert not task_waits(task(), thread(status="running"))
    assert not task_waits(task("completed"), thread(status="completed"))
    assert not task_waits(task(), thread(status="completed", state="archived"))


def test_filters_search_and_pages() -> None:
    cards = [Card("here", "E", "laptop", "repo", thread(n)) for n in range(1, 8)]
    board = lay_out(cards, Filters(), per_column=3)
    done = next(col for col in board.columns if col.key == "done")
    assert done.total == 7 and [x.thread.id for x in done.cards] == ["thr_7", "thr_6", "thr_5"]
    assert board.pages == 3
    second = lay_out(cards, Filters(page=3), per_column=3)
    assert [x.thread.id for x in next(col for col in second.columns if col.key == "done").cards] == ["thr_1"]
    assert lay_out(cards, Filters(q="thread 4"), per_column=3).shown == 1
    assert lay_out(cards, Filters(provider="codex")).shown == 0
    assert lay_out(cards, Filters(env="here", project="repo")).shown == 7
    assert Filters.of({"page": "x", "q": " a b "}) == Filters(q="a b")
    assert Filters(q="a b", page=2).query(page=3) == "q=a+b&page=3"
    assert Filters(q="a").query(page=1) == "q=a"


def test_a_peers_text_on_a_card_is_escaped() -> None:
    """Titles, labels and project names come from peers: the board shows them as text."""
    from peerd.console.render import render_text  # noqa: PLC0415  # Jinja2 on use, like the console

    hostile = "<img src=x onerror=alert(1)>"
    card = Card("BOX", "BOX", hostile, hostile, thread(1).model_copy(update={"title": hostile}))
    html = render_text("_board.html", root="/c/x", board=lay_out([card], Filters()), filters=Filters())
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
