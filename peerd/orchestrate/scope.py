"""A packet keeps to its files: what its commit changes outside them, and whether that may land.

A packet declares its `files` (paths or directories). Its coder works in a worktree of its own,
where nothing stops it from editing anything; so after each implementation peerd lists the paths
the packet's commit changes against its base (`runtime/git/diffs.py:changed_files`: the two trees compared, by
content, never by stat data) that are not among its files (`outside`). Those paths are:

- in the implementation receipt (`outOfScope`) and the report;
- shown to the reviewer (`prompts.reviewer_prompt`), who judges them with the rest;
- never integrated unless allowed: `--allow-out-of-scope` for the whole run, or the packet's
  `allow_out_of_scope` in your own plan (true, or the extra paths it may change). An approved
  packet with changes outside its files that nothing allows is **held**: parked, whole (the
  in-scope part is not integrated alone: half a coder's work never lands silently), its review
  receipt saying `held: out_of_scope`, and its dependents park as after any other park.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peerd.orchestrate.containment import in_scope
from peerd.orchestrate.models import PacketSpec

FLAG = "--allow-out-of-scope"


def outside(changed: Sequence[str], files: Sequence[str]) -> list[str]:
    """The changed paths that are not one of `files` or under one of its directories, sorted."""
    return sorted({path for path in changed if not in_scope(path, files)})


def run_allows(request: Mapping[str, Any]) -> bool:
    """Whether the run was started with --allow-out-of-scope (recorded with its flags)."""
    return bool((request.get("flags") or {}).get("allowOutOfScope"))


def held_paths(out_of_scope: Sequence[str], spec: PacketSpec, *, run_allows: bool) -> list[str]:
    """The paths outside the packet's files that nothing allows: non-empty holds the packet."""
    if run_allows or spec.allow_out_of_scope is True:
        return []
    extra = spec.allow_out_of_scope if isinstance(spec.allow_out_of_scope, list) else []
    return [path for path in out_of_scope if not (extra and in_scope(path, extra))]


@dataclass(frozen=True, slots=True)
class Outside:
    """A commit's paths outside its packet's files, and those of them nothing allows."""

    paths: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)


def held_message(pid: str, paths: Sequence[str], branch: str | None) -> str:
    """The parked packet's failure: what it changed outside its files, and the ways on."""
    listed = ", ".join(paths[:20]) + (" ..." if len(paths) > 20 else "")
    return (
        f"Held, not integrated: the reviewer approved packet {pid}, but its commit also changes files "
        f"outside the packet's files: {listed}. peerd integrates such a packet only when you allow it: "
        f"run again with {FLAG}, or set allow_out_of_scope (true, or those paths) for this packet in "
        "your plan." + (f" Its branch {branch} keeps the work." if branch else "")
    )
