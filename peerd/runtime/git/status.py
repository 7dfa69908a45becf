"""What a working tree holds that HEAD does not: `git status` read without refreshing the index
(`GIT_OPTIONAL_LOCKS=0`), and tracked paths put back as HEAD has them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from peerd.runtime.git.runner import IGNORE_NESTED, Where, run, run_raw

__all__ = ["StatusEntry", "restore_from_head", "status_entries", "status_porcelain"]


@dataclass(frozen=True, slots=True)
class StatusEntry:
    """One `git status --porcelain` entry: its two status letters (`??` untracked, `!!` ignored),
    its path relative to the top (a trailing `/`: a nested repository), and a rename's source."""

    xy: str
    path: str
    orig: str | None  # the source of a rename or copy


async def status_porcelain(path: Where) -> list[str]:
    """`git status --porcelain=v1` lines for the working tree at `path`, every untracked file listed."""
    result = await run(path, "status", "--porcelain=v1", "--untracked-files=all", IGNORE_NESTED)
    return result.stdout.splitlines()


async def status_entries(checkout: Where, *, renames: bool) -> list[StatusEntry]:
    """`git status --porcelain -z` of the whole working tree, every untracked file listed; paths
    are relative to its top directory. Read only: no index refresh (`GIT_OPTIONAL_LOCKS=0`)."""
    args = ["status", "--porcelain=v1", "-z", "--untracked-files=all", IGNORE_NESTED]
    args.append("--find-renames" if renames else "--no-renames")
    raw = await run_raw(checkout, *args)
    fields = [os.fsdecode(field) for field in raw.stdout.split(b"\0")]
    entries: list[StatusEntry] = []
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if len(field) < 4:
            continue
        xy, path = field[:2], field[3:]
        orig: str | None = None
        if "R" in xy or "C" in xy:
            orig = fields[i] if i < len(fields) else None
            i += 1
        entries.append(StatusEntry(xy, path, orig))
    return entries


async def restore_from_head(where: Where, paths: list[str]) -> None:
    """Put `paths` (taken literally) back as HEAD has them, in the index and the working tree."""
    await run(
        where,
        "--literal-pathspecs",
        "restore",
        "--staged",
        "--worktree",
        "--source=HEAD",
        "--",
        *paths,
    )
