"""The follower's vocabulary, pure data: what it knows of a task and of a followed run, and the
actions `FollowerMachine` (`peerd.tasks.machine`) asks its shell to perform."""

from __future__ import annotations

from dataclasses import dataclass

from peerd.tasks.rules import TaskStatus
from peerd.tasks.subscription import Delta


@dataclass(frozen=True)
class OpenTask:
    """What the follower knows of one open task (or one with a stop still owed)."""

    id: str
    status: str
    child_thread_id: str | None
    child_run_id: str | None
    stop_owed: bool
    label: str


@dataclass(frozen=True)
class RunReport:
    """One followed run as the box reported it."""

    run_id: str
    found: bool
    settled: bool
    status: str | None = None
    reason: str | None = None
    result_run_id: str | None = None
    reply: str | None = None  # the result run's reply, when `inline` (nothing more to read)
    inline: bool = False
    usage: str | None = None  # what the child spent (JSON), when the box reports it


@dataclass(frozen=True)
class PollAnswer:
    cursor: str
    runs: tuple[RunReport, ...]
    resynced: bool = False
    set_hash: str | None = None


# --- actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    pass


@dataclass(frozen=True)
class Sleep:
    until: float


@dataclass(frozen=True)
class Relaunch:
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class DeliverStops:
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class Subscribe:
    delta: Delta


@dataclass(frozen=True)
class Poll:
    cursor: str | None
    timeout: float  # what the box is asked to wait at most
    deadline: float  # when an unanswered poll counts as a failure


@dataclass(frozen=True)
class AwaitPoll:
    deadline: float


@dataclass(frozen=True)
class StopPoll:
    """Abandon the poll in flight (the link failed or backs off, or nothing is left to follow)."""


@dataclass(frozen=True)
class EndTask:
    task_id: str
    status: TaskStatus
    result: str
    usage: str | None = None  # what the child spent there (JSON), kept with the task


@dataclass(frozen=True)
class ReadResult:
    """Read the settled run's last reply there, then feed it to `result_read`."""

    task_id: str
    thread_id: str
    result_run_id: str
    status: str | None
    reason: str | None
    label: str
    usage: str | None = None


@dataclass(frozen=True)
class DropStop:
    """A stop that can never be delivered (the link is gone): clear it, saying why."""

    task_id: str
    error: str


@dataclass(frozen=True)
class SaveBackoff:
    attempts: int  # 0 clears the stored backoff
    next_at: float  # in the machine's (monotonic) time: never stored as such
    error: str | None
    delay_s: float = 0.0  # what is stored: the delay, with the wall time it was decided at


@dataclass(frozen=True)
class NoteError:
    """The link's trouble, on every open task of it (one statement); noted once per message."""

    error: str


@dataclass(frozen=True)
class NoteQuiet:
    """Followed runs the box has said nothing of for `chunks` whole chunks while it answered: a log
    line (once per run), so a result that never comes is visible (issue 26, case 8)."""

    task_ids: tuple[str, ...]
    chunks: int


@dataclass(frozen=True)
class CheckLink:
    """Look at the link here (no network): forgotten or revoked meanwhile is a `failed` event."""


Action = (
    Exit
    | Sleep
    | Relaunch
    | DeliverStops
    | Subscribe
    | Poll
    | AwaitPoll
    | StopPoll
    | EndTask
    | ReadResult
    | DropStop
    | SaveBackoff
    | NoteError
    | NoteQuiet
    | CheckLink
)
