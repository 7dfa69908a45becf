"""The change feed's rules, pure: which runs a link follows, and what changed after a cursor.

A laptop's follower tells the box once which runs it follows (a durable *subscription* on the box,
keyed by the link), then long-polls for *changes after a cursor*. Nothing here touches a socket,
the store or a timer; both shells (`peerd.tasks.follower` on the laptop, `peerd.tasks.feed` on
the box) feed these machines what happened and do what they say.

    set hash      order-independent: the XOR of each run id's SHA-256 (first 16 bytes), so both
                  sides keep it up to date in O(1) per run added or removed
    Subscription  the laptop's side: the runs it wants followed, the changes the box has not
                  confirmed yet (`next_delta`), the cursor, and when to send the whole set again
    LinkFeed      the box's side for one link: the followed runs and their threads, the runs
                  reported settled or gone (each with the sequence number it changed at), the
                  cursor, and which threads must be looked at again

A cursor is `<epoch>-<seq>`: the box daemon's epoch (random per process) and a per-link sequence
number. A cursor of another epoch (the box restarted), one ahead of the box, or none at all (the
laptop restarted) asks for everything reported so far: a restart on either side re-syncs with one
request. A subscription's set hash is checked by the box on every change the laptop sends; a
mismatch (or a first request after the laptop's restart that finds one) makes the laptop send its
whole set once (`reset`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_FOLLOWED_RUNS = 20_000  # per link, on both sides (the box refuses more; the laptop queues the rest)
INLINE_REPLY_MAX = 16_000  # a settled run's reply up to this many characters comes with its report
CURSOR_PATTERN = r"^[0-9a-f]{16}-[0-9]{1,15}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def run_hash(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")


def hash_hex(value: int) -> str:
    return f"{value:032x}"


class RunSet:
    """A set of run ids with its order-independent hash, kept as it changes."""

    def __init__(self, run_ids: Iterable[str] = ()) -> None:
        self.ids: set[str] = set()
        self.hash = 0
        for run_id in run_ids:
            self.add(run_id)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.ids

    def add(self, run_id: str) -> bool:
        if run_id in self.ids:
            return False
        self.ids.add(run_id)
        self.hash ^= run_hash(run_id)
        return True

    def discard(self, run_id: str) -> bool:
        if run_id not in self.ids:
            return False
        self.ids.discard(run_id)
        self.hash ^= run_hash(run_id)
        return True

    def clear(self) -> None:
        self.ids.clear()
        self.hash = 0

    @property
    def hex(self) -> str:
        return hash_hex(self.hash)


def set_hash(run_ids: Iterable[str]) -> str:
    return RunSet(run_ids).hex


# --- cursors -----------------------------------------------------------------------------------------


def make_cursor(epoch: str, seq: int) -> str:
    return f"{epoch}-{seq}"


def is_cursor(text: str) -> bool:
    return _CURSOR.match(text) is not None


def cursor_seq(cursor: str | None, epoch: str, current: int) -> int | None:
    """The sequence number a cursor continues from, or None: everything reported is owed (no
    cursor, another epoch, or one ahead of this box: nothing beyond the link's own data either way)."""
    if cursor is None or not is_cursor(cursor):
        return None
    its_epoch, _, seq = cursor.partition("-")
    if its_epoch != epoch or int(seq) > current:
        return None
    return int(seq)


# --- the laptop's side ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    """One subscription request: remove then add (a `reset` replaces the box's set with `add`);
    `set_hash` is the laptop's whole set afterwards. Nothing to add or remove: a check only."""

    add: tuple[str, ...]
    remove: tuple[str, ...]
    reset: bool
    set_hash: str

    @property
    def check_only(self) -> bool:
        return not (self.add or self.remove or self.reset)


@dataclass
class Subscription:
    """What the laptop wants the box to follow for it, and what the box has confirmed.

    `want` is the whole set (kept with its hash); `_dirty` holds the runs whose state at the box
    may differ from `want` (changed since the last confirmed request, or sent in one that failed:
    adds and removes are idempotent, so they are simply sent again). At most one request is in
    flight (`_sent`)."""

    want: RunSet = field(default_factory=RunSet)
    cursor: str | None = None
    _dirty: set[str] = field(default_factory=set)
    _sent: Delta | None = None
    _sent_dirty: set[str] = field(default_factory=set)
    _checked: bool = False  # the box's set was compared with ours since this follower started
    _full: bool = False  # the box said its set differs: send ours whole

    def load(self, run_ids: Iterable[str]) -> None:
        """A follower starting: the set it wants, which the box should still hold (checked by the
        first request, a hash only)."""
        self.want = RunSet(run_ids)
        self._dirty.clear()
        self._sent, self._sent_dirty, self._checked, self._full = None, set(), False, False

    def follow(self, run_id: str) -> None:
        if self.want.add(run_id):
            self._dirty.add(run_id)

    def unfollow(self, run_id: str) -> None:
        if self.want.discard(run_id):
            self._dirty.add(run_id)

    @property
    def in_flight(self) -> bool:
        return self._sent is not None

    @property
    def settled(self) -> bool:
        """The box holds what we want, as far as we know (nothing to send, nothing in flight)."""
        return self._checked and not self._full and not self._dirty and self._sent is None

    def next_delta(self) -> Delta | None:
        """The request to send now, if any (never two at once)."""
        if self._sent is not None:
            return None
        if self._full:
            delta = Delta(tuple(sorted(self.want.ids)), (), True, self.want.hex)
        elif not self._checked:
            # After a restart: does the box still hold our set? One request says (a hash only).
            # Changes made meanwhile go in it too: they are checked by the same hash.
            delta = self._changes()
        elif self._dirty:
            delta = self._changes()
        else:
            return None
        self._sent, self._sent_dirty, self._dirty = delta, self._dirty, set()
        return delta

    def _changes(self) -> Delta:
        add = tuple(sorted(r for r in self._dirty if r in self.want))
        remove = tuple(sorted(r for r in self._dirty if r not in self.want))
        return Delta(add, remove, False, self.want.hex)

    def confirmed(self, in_sync: bool) -> None:
        """The box answered the request in flight: in sync, or its set differs from ours."""
        sent = self._sent
        self._sent, self._sent_dirty = None, set()
        self._checked = True
        if sent is not None and sent.reset and in_sync:
            self._full = False
        elif not in_sync:
            self._full = True

    def unconfirmed(self) -> None:
        """The request in flight failed: whatever it carried may or may not be there; send it again."""
        self._dirty |= self._sent_dirty
        self._sent, self._sent_dirty = None, set()

    def polled(self, cursor: str, box_hash: str | None, resynced: bool) -> None:
        """A poll answered. When the box did not continue our cursor (it restarted, or we did) and
        says its set's hash, a mismatch while nothing is unsent means its set differs: send ours."""
        self.cursor = cursor
        if resynced and box_hash is not None and self.settled and box_hash != self.want.hex:
            self._full = True

    def forget(self) -> None:
        """The link is gone: nothing is owed to the box any more."""
        self._dirty.clear()
        self._sent, self._sent_dirty = None, set()


# --- the box's side ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """A followed run as the laptop is told of it: settled (with its result run, and the result
    run's reply when `inline`: no further read is needed) or gone."""

    run_id: str
    found: bool
    settled: bool
    status: str | None = None
    result_run_id: str | None = None
    reason: str | None = None
    reply: str | None = None
    inline: bool = False
    usage: str | None = None  # the settled thread's usage, with its delegations (JSON), None: unknown


@dataclass
class Applied:
    """What a subscription change did: the threads now listened to, and those no longer."""

    threads_added: set[str]
    threads_removed: set[str]
    in_sync: bool


class LinkFeed:
    """One link's followed runs on the box, and the changes reported to it.

    `runs` maps each followed run to its thread (None: not a run of a thread this link started,
    or none at all: reported gone, and nothing of it is read). A run's report is kept until the
    laptop unfollows it, so a lost answer is never a lost result: the next poll with the old
    cursor (or none) gets it again."""

    def __init__(
        self, epoch: str, runs: dict[str, str | None] | None = None, *, cap: int = MAX_FOLLOWED_RUNS
    ):
        self.epoch = epoch
        self.cap = cap
        self.seq = 0
        self.runs: dict[str, str | None] = {}
        self.by_thread: dict[str, set[str]] = {}
        self.set = RunSet()
        self.reported: dict[str, tuple[int, Report]] = {}
        self.dirty: set[str] = set()  # threads to look at again
        self._gained: set[str] = set()  # threads followed / no longer followed by the change applied
        self._lost: set[str] = set()
        for run_id, thread_id in (runs or {}).items():
            self._add(run_id, thread_id)
        self.dirty = set(self.by_thread)  # everything is looked at once after loading

    @property
    def cursor(self) -> str:
        return make_cursor(self.epoch, self.seq)

    def size_after(self, add: Iterable[str], remove: Iterable[str], reset: bool) -> int:
        adds = set(add)
        if reset:
            return len(adds)
        removes = set(remove) - adds
        new = sum(1 for run_id in adds if run_id not in self.runs)
        return len(self.runs) + new - sum(1 for run_id in removes if run_id in self.runs)

    def apply(
        self, add: dict[str, str | None], remove: Iterable[str], reset: bool, set_hash_hex: str
    ) -> Applied:
        """Apply a change (the shell checked its size and resolved each added run's thread, and
        stores it). Adds and removes are idempotent; the work is O(the change), not O(the set)."""
        self._gained, self._lost = set(), set()
        if reset:
            for run_id in list(self.runs):
                self._remove(run_id)
        for run_id in remove:
            if run_id not in add:
                self._remove(run_id)
        for run_id, thread_id in add.items():
            if run_id not in self.runs:
                self._add(run_id, thread_id)
                if thread_id is not None:
                    self.dirty.add(thread_id)
        gained, lost = self._gained - self._lost, self._lost - self._gained
        return Applied(gained, lost, self.set.hex == set_hash_hex)

    def _add(self, run_id: str, thread_id: str | None) -> None:
        self.runs[run_id] = thread_id
        self.set.add(run_id)
        if thread_id is None:  # no run of a thread this link started: gone, and nothing more is said
            self._report(Report(run_id, found=False, settled=False))
        else:
            if thread_id not in self.by_thread:
                self._gained.add(thread_id)
            self.by_thread.setdefault(thread_id, set()).add(run_id)

    def _remove(self, run_id: str) -> None:
        if run_id not in self.runs:
            return
        thread_id = self.runs.pop(run_id)
        self.set.discard(run_id)
        self.reported.pop(run_id, None)
        if thread_id is not None:
            runs = self.by_thread.get(thread_id)
            if runs is not None:
                runs.discard(run_id)
                if not runs:
                    del self.by_thread[thread_id]
                    self.dirty.discard(thread_id)
                    self._lost.add(thread_id)

    def changed(self, thread_ids: Iterable[str]) -> None:
        """These threads changed (the shell's change feed said so): look at them again."""
        self.dirty.update(t for t in thread_ids if t in self.by_thread)

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def record(self, reports: Iterable[Report], unsettled: Iterable[str] = ()) -> bool:
        """What a look at some threads found: settled or gone runs are reported (a new sequence
        number when their report changed); runs found unsettled are not. True if anything changed."""
        changed = False
        for report in reports:
            if report.run_id not in self.runs:
                continue
            changed = self._report(report) or changed
        for run_id in unsettled:
            self.reported.pop(run_id, None)  # no longer settled (someone sent it more work)
        return changed

    def _report(self, report: Report) -> bool:
        known = self.reported.get(report.run_id)
        if known is not None and known[1] == report:
            return False
        self.seq += 1
        self.reported[report.run_id] = (self.seq, report)
        return True

    def since(self, cursor: str | None) -> tuple[list[Report], bool]:
        """The reports after `cursor`, oldest first, and whether the cursor was not continued
        (then every report is owed). O(reports kept): those are the runs settled and not yet
        unfollowed, a handful on a link whose laptop keeps up."""
        seq = cursor_seq(cursor, self.epoch, self.seq)
        after = 0 if seq is None else seq
        owed = sorted((kept for kept in self.reported.values() if kept[0] > after), key=lambda kept: kept[0])
        return [report for _, report in owed], seq is None
