"""The rules of a move, pure: fed what the store and git say, they return what to do next.

A move of thread X from here to environment E:

    waiting --(no live or queued run; the commit point)--> moving --(the thread there exists)--> moved
       |                                                     |
       +--(a message to X)--> cancelled                      +--(a refusal that is final)--> failed

- **waiting**: recorded, nothing has left. The thread here still works: a live run (an agent's
  own, when it asked with `thread_move`) ends first; a message to it cancels the move
  (`on_message`), and a wake or continuation run queued meanwhile runs here first.
- **The commit point** (`may_commit`): no live and no queued run. In that same transaction the
  move becomes `moving` and the thread's queue is held, so from then on it takes no new runs: a
  message is refused `thread_moving`.
- **moving**: the steps, each recorded when done, so a resumed move skips it and repeats nothing
  (`next_step`): the snapshot commit, sending it and landing the branch there, the launch there
  (keyed by the move id), then the lineage there and `moved`.
- **failed**: a refusal that retrying cannot change before the thread there exists (`is_transient`,
  peerd/errors.py, from the error classes' own `transient` flag, says which can; a move retries
  those forever); the thread here is released (its queue as it was). After the launch there
  answered, a move only ends `moved`.
- **Branches there** (`landing`): a branch tip only moves to a descendant of itself.

The states and the transitions allowed between them are one table, `core/moves.py:TRANSITIONS`
(a waiting move may also fail); the store changes a state only through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peerd.core.backoff import Backoff
from peerd.core.moves import UNFINISHED, MoveState
from peerd.core.ownership import Right
from peerd.errors import is_transient as is_transient  # noqa: PLC0414  # the registry's, used here
from peerd.handoff.wire import BranchOutcome

OPEN: frozenset[MoveState] = frozenset(UNFINISHED)  # the states and their table: core/moves.py
Step = Literal["snapshot", "send", "launch", "finish"]
Reaction = Literal["cancel", "refuse_moving", "refuse_moved", "allow"]

# The transcript the thread there starts from: the last TRANSCRIPT_MESSAGES user and assistant
# messages, each cut to TRANSCRIPT_ITEM_CHARS, all of them to TRANSCRIPT_TOTAL_CHARS (oldest cut
# first), well inside a prompt's 120,000 characters with the move's own message (8,000).
TRANSCRIPT_MESSAGES = 20
TRANSCRIPT_ITEM_CHARS = 4_000
TRANSCRIPT_TOTAL_CHARS = 60_000

# Retrying a step that failed for a transient reason: 1 s doubling to 60 s, forever (a box that is
# down for a day gets its move when it is back).
RETRY = Backoff(first=1.0, cap=60.0)


def on_message(state: MoveState | None) -> Reaction:
    """What a message (a send) to the thread does while it has a move in `state`."""
    if state == "waiting":
        return "cancel"  # the person is still talking to it here: it stays here
    if state == "moving":
        return "refuse_moving"
    if state == "moved":
        return "refuse_moved"
    return "allow"


def may_commit(*, live_run: bool, queued_run: bool) -> bool:
    """Whether a waiting move may pass its commit point: the thread has nothing to run here."""
    return not live_run and not queued_run


@dataclass(frozen=True)
class Progress:
    """What a moving move has recorded so far."""

    snapshot: str | None  # the commit that carries the work, recorded before it is sent
    landed: bool  # the bundle is there and the branch there decided (recorded after both)
    there_thread_id: str | None  # the launch there answered


def next_step(progress: Progress) -> Step:
    """The first step not recorded as done: a resumed move starts there. `send` sends the bundle
    and lands the branch (both idempotent: the box's tips say what it has); `finish` records the
    lineage there (idempotent) and ends the move `moved`."""
    if progress.snapshot is None:
        return "snapshot"
    if not progress.landed:
        return "send"
    if progress.there_thread_id is None:
        return "launch"
    return "finish"


def may_fail(progress: Progress) -> bool:
    """A final refusal fails the move only while no thread there exists: after the launch
    answered, the thread there is the live copy and the move only ends `moved`."""
    return progress.there_thread_id is None


def landing(
    *, tip_there: str | None, incoming: str, ancestor: bool, checked_out: bool, right: Right = "own"
) -> BranchOutcome:
    """What the box does with its branch of the thread's name when the moved work `incoming`
    arrives: a tip only moves to a descendant of itself, and only a branch the calling link owns
    by the ledger (`right`, `core/ownership.py:may_change`: `own`, or `new` for a name nobody
    has) moves at all. `ancestor`: the tip there is an ancestor of `incoming`; `checked_out`: a
    worktree there has the branch checked out."""
    if tip_there == incoming and tip_there is not None:
        return "same"  # nothing moves
    if right == "not_yours":
        return "not-yours"  # left as it is; the moved work goes under refs/peerd/moved/<id>
    if tip_there is None:
        return "absent"  # the thread there is launched on it
    if not ancestor:
        return "diverged"  # kept as it is; the moved work goes under refs/peerd/moved/<id>
    if checked_out:
        return "checked-out"  # another worktree's branch is not moved under it; kept as for diverged
    return "fast-forward"


@dataclass(frozen=True)
class Message:
    role: Literal["user", "assistant"]
    text: str


def transcript(messages: list[Message]) -> str:
    """The last messages as a quoted transcript (every line starts with `> `, so nothing in it is
    read as instructions for peerd's scripted coder or as a fence), each cut, the whole bounded."""
    chosen = messages[-TRANSCRIPT_MESSAGES:]
    blocks: list[str] = []
    for message in chosen:
        text = message.text
        if len(text) > TRANSCRIPT_ITEM_CHARS:
            text = (
                text[:TRANSCRIPT_ITEM_CHARS]
                + f" [... {len(message.text) - TRANSCRIPT_ITEM_CHARS} more characters]"
            )
        quoted = "\n".join("> " + line for line in (text.splitlines() or [""]))
        blocks.append(f"{message.role}:\n{quoted}")
    while blocks and sum(len(b) + 2 for b in blocks) > TRANSCRIPT_TOTAL_CHARS:
        blocks.pop(0)  # the oldest goes first
    return "\n\n".join(blocks)


def continuation(
    *,
    origin_label: str,
    origin_env: str,
    thread_id: str,
    title: str,
    branch: str | None,
    snapshot: str,
    messages: list[Message],
    message: str | None,
) -> str:
    """The first prompt of the thread there: that it was moved, from where, the transcript, and
    the person's (or agent's) message last."""
    shown = messages[-TRANSCRIPT_MESSAGES:]
    parts = [
        f"This thread was moved here from {origin_label} (environment {origin_env}, thread {thread_id}: "
        f"{title!r}). Its git work came with it: this worktree starts at commit {snapshot}"
        + (f" (its branch there was {branch})" if branch else "")
        + ", with the uncommitted edits and new files it had there committed on top by peerd.",
        f"The conversation so far, its last {len(shown)} messages (each cut at {TRANSCRIPT_ITEM_CHARS} "
        "characters), quoted:",
        transcript(messages) or "(no messages)",
    ]
    parts.append(message if message else "Continue the work where it was left.")
    return "\n\n".join(parts)
