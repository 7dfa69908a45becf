"""Issue 26, case 1: what a move's snapshot (and a commit of a worktree) takes is what the files
hold, never what stale stat data say. A same-size edit made in the second the worktree was checked
out (`a - b` -> `a + b`) has the very `lstat` the index recorded; git compares such an entry by
content only while the index it reads is not newer than it, which a copied index always is."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from peerd.handoff.gitwork import snapshot
from peerd.runtime import git as rgit
from peerd.runtime.git import GitLocation, commit_all
from tests.helpers import git
from tests.support.handoff import loc_git, next_second, project, stat_as_recorded

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)


def blob(repo: Path, commit: str, path: str) -> bytes:
    done = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=repo, capture_output=True, check=True)
    return done.stdout


async def edited_as_checked_out(repo: Path, tmp: Path) -> GitLocation:
    """A worktree made by peerd (`read-tree -u --reset`) and, in the same second, `calc.py` edited
    to the same size: its stat data say "unchanged" (checked, tried again on a second's edge)."""
    for attempt in range(5):
        worktree = tmp / f"wt{attempt}"
        await next_second()
        await rgit.create_worktree(repo, worktree, f"peerd/race{attempt}", "HEAD")
        (worktree / "calc.py").write_text("a + b\n")
        location = await rgit.locate_worktree(repo, worktree)
        if stat_as_recorded(location, "calc.py"):
            return location
    pytest.fail("could not edit calc.py within the second its worktree was checked out")


async def test_a_same_size_edit_made_as_the_worktree_was_checked_out_is_in_the_snapshot(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path)
    location = await edited_as_checked_out(repo, tmp_path)
    index_before = loc_git(location, "ls-files", "--stage", "--debug")
    head_before = loc_git(location, "rev-parse", "HEAD")
    await next_second()  # the move comes later: a copy of the index would be newer than its entries
    commit, made = await snapshot(location, move_id="mov_race", message="uncommitted work")
    assert made
    assert blob(repo, commit, "calc.py") == b"a + b\n"
    assert git(repo, "rev-parse", f"{commit}^").strip() == head_before.strip()
    # The worktree, its index and its branch are as they were.
    assert loc_git(location, "ls-files", "--stage", "--debug") == index_before
    assert loc_git(location, "rev-parse", "HEAD") == head_before
    assert (location.work_tree / "calc.py").read_text() == "a + b\n"


async def test_a_same_size_edit_as_the_worktree_was_checked_out_is_committed(tmp_path: Path) -> None:
    repo = project(tmp_path)
    location = await edited_as_checked_out(repo, tmp_path)
    await next_second()
    sha = await commit_all(location, "the coder's work")
    assert sha is not None
    assert blob(repo, sha, "calc.py") == b"a + b\n"
    assert loc_git(location, "status", "--porcelain") == ""  # the index now matches the commit


async def test_two_hundred_same_size_edits_each_snapshotted_under_load(tmp_path: Path) -> None:
    """Four worktrees at once (both cores busy), 50 rounds each: `git add -A` (the index records
    the file's stat now), at once a same-size edit, a snapshot that must hold it."""
    repo = project(tmp_path)
    locations = []
    for n in range(4):
        await rgit.create_worktree(repo, tmp_path / f"load{n}", f"peerd/load{n}", "HEAD")
        locations.append(await rgit.locate_worktree(repo, tmp_path / f"load{n}"))
    texts = ("a - b\n", "a + b\n")
    missed: list[tuple[int, int]] = []

    async def rounds(n: int, where: GitLocation) -> None:
        for i in range(50):
            await asyncio.to_thread(loc_git, where, "add", "-A")
            text = texts[(i + 1) % 2]
            (where.work_tree / "calc.py").write_text(text)
            commit, _ = await snapshot(where, move_id=f"mov_{n}_{i}", message="m")
            if blob(repo, commit, "calc.py") != text.encode():
                missed.append((n, i))

    await asyncio.gather(*(rounds(n, where) for n, where in enumerate(locations)))
    assert missed == []
