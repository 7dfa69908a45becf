"""Concurrent worktree changes in one repository (a box launching many delegated threads at once
into one project): git's `worktree add` and `worktree prune` race on `.git/worktrees/<id>`, so
peerd serialises them per repository. Without that, some of 30 concurrent adds fail with
"failed to read .git/worktrees/<id>/commondir" or "could not open .git/worktrees/<id>/locked"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from peerd.runtime import git
from tests.helpers import make_repo

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)


async def test_concurrent_worktree_adds_and_removes_in_one_repository_all_succeed(tmp_path: Path) -> None:
    for round_ in range(2):  # the race is timing-dependent; a few rounds make a miss unlikely
        repo = make_repo(tmp_path / f"repo{round_}")
        trees = [(tmp_path / f"wt{round_}" / f"t{i}", f"b{i}") for i in range(30)]
        await asyncio.gather(*(git.create_worktree(repo, path, branch, None) for path, branch in trees))
        assert all((path / "README.md").is_file() for path, _ in trees)
        half = trees[:15]
        more = [(tmp_path / f"wt{round_}" / f"u{i}", f"c{i}") for i in range(15)]
        await asyncio.gather(
            *(git.remove_worktree(repo, path, delete_branch=branch) for path, branch in half),
            *(git.create_worktree(repo, path, branch, None) for path, branch in more),
        )
        assert not any(path.exists() for path, _ in half)
        assert all((path / "README.md").is_file() for path, _ in more)
