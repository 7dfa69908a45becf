"""The board and what needs the person, pure: which column a thread's card goes in, what needs
you (and why), the filters, search and paging. The I/O is `peerd.console.fleet`; the pages are
`peerd.console.boardpages`.

Columns, by the thread's state (`column_of`):

    queued     its latest run is queued or starting, or it has none yet
    running    its latest run is running
    needs you  something waits for the person (below), whatever its run does
    done       its latest run completed, or the thread moved (its copy goes on there)
    failed     its latest run failed, was cancelled or interrupted

What needs you (`needs_of`), one reason each:

    approval     a question of one of its runs waits for a yes or no (here, or on a box for the
                 work this machine started there)
    budget stop  its latest run was stopped by its budget ("budget exceeded: ..."): it waits for a
                 person to send again (with more budget) or leave it
    failed task  a task it delegated failed and the thread has not run since (its next run is the
                 person's call)

Archived threads are not on the board.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from peerd import contracts as c

COLUMNS = (
    ("queued", "Queued"),
    ("running", "Running"),
    ("needs", "Needs you"),
    ("done", "Done"),
    ("failed", "Failed"),
)
CARDS_PER_COLUMN = 40
BUDGET_STOP = "budget exceeded"
_COLUMN_OF_STATUS = {
    "queued": "queued",
    "starting": "queued",
    "running": "running",
    "completed": "done",
    "failed": "failed",
    "cancelled": "failed",
    "interrupted": "failed",
}


@dataclass(frozen=True)
class Need:
    """One thing that waits for the person, about one thread."""

    kind: str  # approval | budget | task | review
    text: str
    approval_id: str | None = None
    task_id: str | None = None


@dataclass(frozen=True)
class Card:
    env_key: str
    env_id: str
    env_label: str
    project: str
    thread: c.Thread
    needs: tuple[Need, ...] = ()

    @property
    def column(self) -> str:
        return column_of(self.thread, self.needs)


@dataclass(frozen=True)
class Filters:
    project: str = ""
    env: str = ""
    provider: str = ""
    q: str = ""
    page: int = 1

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        try:
            number = max(1, min(10_000, int(query.get("page", "1"))))
        except ValueError:
            number = 1
        return cls(
            project=query.get("project", "").strip()[:200],
            env=query.get("env", "").strip()[:100],
            provider=query.get("provider", "").strip()[:64],
            q=query.get("q", "").strip()[:200],
            page=number,
        )

    def query(self, **change: object) -> str:
        """The query string of these filters with `change` applied (empty values and page 1 left out)."""
        values = {"project": self.project, "env": self.env, "provider": self.provider, "q": self.q}
        values |= {"page": str(self.page)} | {k: str(v) for k, v in change.items()}
        return urlencode({k: v for k, v in values.items() if v and not (k == "page" and v == "1")})

    def keeps(self, card: Card) -> bool:
        if self.env and card.env_key != self.env:
            return False
        if self.project and card.project != self.project:
            return False
        if self.provider and card.thread.provider != self.provider:
            return False
        if self.q:
            words = self.q.casefold()
            hay = f"{card.thread.title}\n{card.thread.id}\n{card.project}\n{card.env_label}".casefold()
            return all(w in hay for w in words.split())
        return True


def last_change(thread: c.Thread) -> float:
    """When the thread last changed, for "newest first": its own update, or its latest run's
    creation, start or end, whichever is latest (a run's end does not touch the thread's row)."""
    run = thread.latest_run
    moments = [thread.updated_at]
    if run is not None:
        moments += [t for t in (run.created_at, run.started_at, run.ended_at) if t is not None]
    return max(moments)


def column_of(thread: c.Thread, needs: Iterable[Need] = ()) -> str:
    if any(True for _ in needs):
        return "needs"
    if thread.status == "moved":
        return "done"
    run = thread.latest_run
    if run is None:
        return "queued"
    return _COLUMN_OF_STATUS.get(run.status, "failed")


def budget_stopped(thread: c.Thread) -> bool:
    run = thread.latest_run
    return (
        thread.status == "active"
        and run is not None
        and run.status == "failed"
        and (run.reason or "").startswith(BUDGET_STOP)
    )


def task_waits(task: c.TaskInfo, parent: c.Thread | None) -> bool:
    """A failed task waits for the person while its parent has not run since it ended."""
    if task.status != "failed" or parent is None or parent.status != "active":
        return False
    run = parent.latest_run
    if run is None or task.ended_at is None:
        return True
    return run.created_at <= task.ended_at and run.status not in ("queued", "starting", "running")


def review_waits(wait: dict[str, Any], thread: c.Thread) -> bool:
    """A wait on a pull request that ended with a review asking for changes waits for the person
    while its thread has not run since the wake that told its agent (peerd/waits/): the person
    reads the review and what the agent made of it, and anything they send makes it leave."""
    if wait.get("outcome") != "changes_requested" or thread.status != "active":
        return False
    run, ended = thread.latest_run, wait.get("endedAt")
    if run is None or not isinstance(ended, int | float):
        return True
    woken = wait.get("wokenRunId")
    return (run.id == woken or run.created_at <= ended) and run.status not in (
        "queued",
        "starting",
        "running",
    )


def needs_of(
    thread: c.Thread,
    *,
    approvals: Iterable[tuple[str, str]] = (),
    failed_tasks: Iterable[c.TaskInfo] = (),
    reviews: Iterable[dict[str, Any]] = (),
) -> tuple[Need, ...]:
    """What about `thread` waits for the person: its pending approvals (id, summary), a budget stop,
    the failed tasks it delegated that wait, a review that asked for changes on its pull request."""
    found = [Need("approval", summary, approval_id=aid) for aid, summary in approvals]
    if budget_stopped(thread):
        assert thread.latest_run is not None  # noqa: S101  # budget_stopped says so
        found.append(Need("budget", f"stopped by its budget ({thread.latest_run.reason})"))
    for task in failed_tasks:
        if task_waits(task, thread):
            found.append(Need("task", f"its task {task.title!r} failed", task_id=task.task_id))
    for wait in reviews:
        if review_waits(wait, thread):
            found.append(
                Need("review", f"a review asked for changes on {wait.get('prUrl') or wait.get('pr')}")
            )
    return tuple(found)


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    total: int = 0
    cards: list[Card] = field(default_factory=list)


@dataclass(frozen=True)
class Board:
    columns: list[Column]
    pages: int
    page: int
    shown: int  # cards matching the filters


def lay_out(cards: Iterable[Card], filters: Filters, per_column: int = CARDS_PER_COLUMN) -> Board:
    """The cards the filters keep, by column, newest change first; page N shows each column's
    cards N*per_column-per_column .. N*per_column."""
    kept = sorted((x for x in cards if filters.keeps(x)), key=lambda x: -last_change(x.thread))
    by_column: dict[str, list[Card]] = {key: [] for key, _ in COLUMNS}
    for card in kept:
        by_column[card.column].append(card)
    start = (filters.page - 1) * per_column
    columns = [
        Column(key, title, len(by_column[key]), by_column[key][start : start + per_column])
        for key, title in COLUMNS
    ]
    pages = max(1, *(-(-col.total // per_column) for col in columns))
    return Board(columns, pages, min(filters.page, pages), len(kept))
