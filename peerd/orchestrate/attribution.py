"""Whose is a change in the user's checkout? The attribution rule of containment, pure.

peerd records the user's checkout when a run starts (`userwork.snapshot`: every path `git status`
reports, with the hash of its content). When a packet's hop ends, every path whose content is not
what was recorded changed during the run. Someone wrote it: the user, who keeps working while a run
goes on, or, only when the coder ran unconfined, the packet's coder, whose edit escaped its
worktree. peerd moves a change into the packet's worktree only when it can **prove** the coder wrote
it; everything else is the user's: reported ("changed in your checkout during the run, left as it
is") and never moved, restored or committed. When in doubt, left.

The proof, for one path P of the checkout (`attribute`), every step must hold:

1. P was clean when the run started (`yours_before`: what was dirty then is the user's);
2. P is inside the packet's files (`outside_files`);
3. at least one run of the hop was not confined (`confined`: a confined run sees the registered
   checkouts hidden and can write only its worktree; its notice item carries the code `confined`,
   so when every run of the hop was confined, no coder could write there at all);
4. the coder's own items of the hop hold a file change that did not fail and names P in the
   checkout: an absolute path equal to `checkout/P`; a relative path is the coder's worktree
   (`no_coder_write`);
5. the last such item says what it wrote: the sha256 of the file's bytes after the write
   (`unverified` when it does not: the coder CLIs do not report it, the scripted coder does);
6. P's content now is exactly that (`content_differs`: someone changed it after the coder did).

Then `proven`, and only then is P moved; a proven change that does not apply to the worktree's own
work is left too (`does_not_apply`, set by the shell). Hashes are of content (`content_hash`),
never git's cached stat data.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerd.core.runs import CONFINED
from peerd.orchestrate.models import CheckoutReason

# What a file-change item's status says when the change did not happen.
_NOT_DONE = frozenset({"failed", "declined", "error", "cancelled"})


@dataclass(frozen=True, slots=True)
class CoderWrite:
    """One file a coder's item says it wrote: the path as the item names it (absolute, or relative
    to the coder's worktree) and the sha256 hex of the file's bytes after it, when it says."""

    path: str
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class HopFacts:
    """What a hop's runs say about themselves: whether every one was confined, and the writes."""

    confined: bool
    writes: tuple[CoderWrite, ...] = ()


@dataclass(frozen=True, slots=True)
class Attribution:
    path: str
    reason: CheckoutReason

    @property
    def proven(self) -> bool:
        return self.reason == "proven"


def writes_of(items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[CoderWrite]:
    """The files `(kind, data)` items of a run say the coder wrote, in order. The shapes peerd's
    providers give a file change: `{"path", "sha256"?}` (the scripted coder), `{"changes": [{"path"}],
    "status"}` (Codex, Claude, Gemini). A change whose status says it did not happen is no write."""
    found: list[CoderWrite] = []
    for kind, data in items:
        if kind != "file_change" or data.get("status") in _NOT_DONE or data.get("error"):
            continue
        digest = data.get("sha256") if isinstance(data.get("sha256"), str) else None
        if isinstance(data.get("path"), str) and data["path"]:
            found.append(CoderWrite(data["path"], digest))
        changes = data.get("changes")
        for change in changes if isinstance(changes, list) else []:
            if isinstance(change, Mapping) and isinstance(change.get("path"), str) and change["path"]:
                found.append(CoderWrite(change["path"], None))
    return found


def confined_run(items: Iterable[tuple[str, Mapping[str, Any]]]) -> bool:
    """Whether a run's items carry peerd's typed mark that it ran confined."""
    return any(kind == "notice" and data.get("code") == CONFINED for kind, data in items)


def hop_facts(runs: Sequence[Sequence[tuple[str, Mapping[str, Any]]]]) -> HopFacts:
    """Facts of a hop from each of its runs' items: confined only when it had runs and every one
    was (an older run without the mark counts as unconfined: the proof is then asked for)."""
    confined = bool(runs) and all(confined_run(items) for items in runs)
    return HopFacts(confined, tuple(w for items in runs for w in writes_of(items)))


def names_path(write: CoderWrite, path: str, *, checkout: str, worktree: str) -> bool:
    """Whether `write` names `checkout/path`: an absolute path, or a relative one that leaves the
    worktree for it (both normalised, no link followed)."""
    where = write.path if posixpath.isabs(write.path) else posixpath.join(worktree, write.path)
    return posixpath.normpath(where) == posixpath.normpath(posixpath.join(checkout, path))


def attribute(
    path: str,
    *,
    before: Mapping[str, str],
    now: str,
    in_files: bool,
    facts: HopFacts,
    checkout: str,
    worktree: str,
) -> Attribution:
    """Whose the change of `path` (relative to the checkout's top) is; `before` is the start
    snapshot, `now` the path's content hash now (`userwork.content_hash`), `checkout` and
    `worktree` the real absolute paths of the checkout's top and the packet's worktree."""
    if path in before:
        return Attribution(path, "yours_before")
    if not in_files:
        return Attribution(path, "outside_files")
    if facts.confined:
        return Attribution(path, "confined")
    named = [w for w in facts.writes if names_path(w, path, checkout=checkout, worktree=worktree)]
    if not named:
        return Attribution(path, "no_coder_write")
    last = named[-1]
    if last.sha256 is None:
        return Attribution(path, "unverified")
    if now != f"sha256:{last.sha256}":
        return Attribution(path, "content_differs")
    return Attribution(path, "proven")
