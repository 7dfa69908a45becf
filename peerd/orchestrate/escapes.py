"""Containment's shell: after a local packet's hop, what changed in the user's checkout during the
run, whose each change is (`attribution.attribute`), and the coder's proven ones moved into its
worktree (`containment.recover_escaped`). Everything else is left exactly as it is and reported.

Reads: the checkout now (`userwork.snapshot`, content hashes), the start snapshot kept with the run,
and the hop's own runs' items (their `confined` mark and their file changes). A box's packets never
come here: containment there is the box's confinement.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from peerd import contracts as c
from peerd.errors import Conflict, GitError
from peerd.orchestrate import userwork
from peerd.orchestrate.attribution import Attribution, attribute, hop_facts
from peerd.orchestrate.containment import changed_paths, in_scope, recover_escaped
from peerd.orchestrate.context import OrchestrationContext
from peerd.orchestrate.memo import PacketMemo
from peerd.orchestrate.models import CheckoutChange
from peerd.runtime.git import GitLocation

log = structlog.get_logger(__name__)
_READ_PAGES = 50
# What the report says for a proven change that could not move (never git's own words).
NOT_APPLIED = (
    "they conflict with the coder's own work on the same files in its worktree, so peerd left them "
    "in your checkout as they are"
)


@dataclass(frozen=True)
class Collected:
    """A packet's result here: the tip, and what containment found in the user's checkout."""

    tip: str | None
    changes: list[CheckoutChange] = field(default_factory=list)

    def _paths(self, *reasons: str, moved: bool = False) -> list[str]:
        return sorted(ch.path for ch in self.changes if ch.moved == moved and ch.reason in reasons)

    def record(self, memo: PacketMemo) -> None:
        """What containment found, into the packet's memo (the implementation receipt reads it)."""
        not_applied = self._paths("does_not_apply")
        memo.recovered = sorted(ch.path for ch in self.changes if ch.moved)
        memo.not_recovered = not_applied
        memo.recovery_problem = NOT_APPLIED if not_applied else None
        memo.stray = self._paths("outside_files")
        memo.user_paths = self._paths("yours_before")
        memo.left = self._paths("confined", "no_coder_write", "unverified", "content_differs")
        memo.checkout = list(self.changes)


async def _items(
    ctx: OrchestrationContext, run_id: str, thread_id: str, run_ref: str
) -> list[tuple[str, Mapping[str, Any]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    after: int | None = None
    for _ in range(_READ_PAGES):
        read = c.ThreadRead(run_id=run_ref, after_position=after, limit=100, max_chars_per_item=1)
        page = await ctx.ops.thread_read(ctx.caller(run_id), thread_id, read)
        found += [(item.kind, item.data) for item in page.items]
        if not page.has_more or page.next_position is None:
            break
        after = page.next_position
    return found


def _real(path: Path) -> str:
    return os.path.realpath(path)


async def settle(
    ctx: OrchestrationContext,
    run_id: str,
    *,
    repo: Path,
    worktree: GitLocation,
    files: Sequence[str],
    baseline: Mapping[str, str],
    thread_id: str,
    hop_runs: Sequence[str],
) -> list[CheckoutChange]:
    """Attribute every path of the checkout that changed since the run started; move the proven
    ones (only those, only if still exactly as proven) into `worktree`; the rest stays."""
    now = await userwork.snapshot(repo)
    new, changed = userwork.appeared(baseline, now)
    if not new and not changed:
        return []
    facts = hop_facts([await _items(ctx, run_id, thread_id, run_ref) for run_ref in hop_runs])
    top = (await changed_paths(repo))[0]
    checkout, tree = _real(top), _real(worktree.work_tree)
    found: list[Attribution] = [
        attribute(
            path,
            before=baseline,
            now=now[path],
            in_files=in_scope(path, files),
            facts=facts,
            checkout=checkout,
            worktree=tree,
        )
        # The user's own paths from before count only inside this packet's files (the rest is
        # none of its business); every path that appeared is reported, wherever it is.
        for path in sorted({*new, *(p for p in changed if in_scope(p, files))})
    ]
    proven = {a.path: now[a.path] for a in found if a.proven}
    moved: set[str] = set()
    if proven:

        def still(path: str) -> bool:
            return userwork.content_hash(top / path) == proven.get(path)

        try:
            moved = set(await recover_escaped(repo, worktree, list(files), only=proven, still=still))
        except (GitError, Conflict) as exc:
            # Left where it is (the checkout was not changed); git's words go to the log only.
            log.info("orchestrate.escaped_not_moved", run_id=run_id, paths=sorted(proven), error=exc.message)
    changes: list[CheckoutChange] = []
    for a in found:
        if a.proven and a.path in moved:
            changes.append(CheckoutChange(path=a.path, moved=True, reason="proven"))
        elif a.proven and userwork.content_hash(top / a.path) != proven[a.path]:
            changes.append(CheckoutChange(path=a.path, moved=False, reason="content_differs"))
        elif a.proven:
            changes.append(CheckoutChange(path=a.path, moved=False, reason="does_not_apply"))
        else:
            changes.append(CheckoutChange(path=a.path, moved=False, reason=a.reason))
    return changes
