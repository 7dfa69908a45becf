"""Property: whatever edits a worktree goes through, what peerd takes of it (a move's snapshot,
`commit_all`) holds exactly the worktree's files, path -> (mode, bytes), read independently of git.

Random sequences of same-size edits (with the file's mtime put back, so its stat data are what
the index recorded: an edit inside one clock tick), other edits, new files in nested directories,
deletes, renames, executable-bit flips, symbolic links, ignored files, `git add` (also `-f` of an
ignored file) and `git rm --cached`, with snapshots and commits in between. The repository has
`core.checkStat=minimal` (git then compares whole-second mtimes and sizes only, no ctime), which
makes "the stat data say unchanged" deterministic instead of a race against the clock, and its
index entries are made older than the index (not racy), so git's own racy-entry check cannot
rescue a take that trusts them. `make test` runs a bounded number of examples;
`PEERD_FUZZ_EXAMPLES` (`make fuzz`) runs more.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from itertools import count
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peerd.handoff.gitwork import snapshot
from peerd.runtime import git as rgit
from peerd.runtime.git import GitLocation, commit_all
from tests.helpers import git, make_repo
from tests.support.handoff import loc_git, tree_files

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)

# `make test`: 25 examples, the same ones every run; `make fuzz`: more, new ones each run.
FUZZING = bool(os.environ.get("PEERD_FUZZ_EXAMPLES"))
EXAMPLES = int(os.environ.get("PEERD_FUZZ_EXAMPLES") or 25)
START = {
    "a.txt": b"alpha\n",
    "b.txt": b"bravo\n",
    "d/c.txt": b"charlie\n",
    "d/e/f.txt": b"foxtrot\n",
    "run.sh": b"#!/bin/sh\n",
    ".gitignore": b"*.log\n",
}
NAMES = [
    "a.txt",
    "b.txt",
    "g.txt",
    "d/c.txt",
    "d/h.txt",
    "d/e/f.txt",
    "d/e/i.txt",
    "run.sh",
    "x.log",
    "d/y.log",
]
_names = st.sampled_from(NAMES)
OPS = st.one_of(
    st.tuples(st.just("write"), _names, st.binary(max_size=12)),
    st.tuples(st.just("same-size"), _names, st.integers(1, 255)),
    st.tuples(st.just("delete"), _names),
    st.tuples(st.just("rename"), _names, _names),
    st.tuples(st.just("chmod"), _names),
    st.tuples(st.just("symlink"), _names, st.sampled_from(["a.txt", "d", "../nowhere"])),
    st.tuples(st.just("add"), _names, st.booleans()),
    st.tuples(st.just("rm-cached"), _names),
    st.tuples(st.just("take"), st.sampled_from(["snapshot", "commit"])),
)


def worktree_files(where: GitLocation) -> dict[str, tuple[str, bytes]]:
    """What the worktree holds, read from the file system: every file and link (never followed),
    except ignored (`*.log`) files the index does not track."""
    tracked = set(loc_git(where, "ls-files", "-z").split("\0"))
    found: dict[str, tuple[str, bytes]] = {}

    def walk(directory: Path, prefix: str) -> None:
        for entry in os.scandir(directory):
            name = prefix + entry.name
            if name == ".git" or (name.endswith(".log") and name not in tracked):
                continue
            if entry.is_symlink():
                found[name] = ("120000", os.fsencode(Path(entry.path).readlink()))
            elif entry.is_dir():
                walk(Path(entry.path), name + "/")
            else:
                mode = "100755" if os.lstat(entry.path).st_mode & stat.S_IXUSR else "100644"
                found[name] = (mode, Path(entry.path).read_bytes())

    walk(where.work_tree, "")
    return found


def apply(where: GitLocation, op: tuple[object, ...]) -> None:
    top = where.work_tree
    kind, name = op[0], str(op[1])
    path = top / name
    if kind in ("write", "symlink", "rename"):
        path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "write":
        if path.is_symlink():
            path.unlink()
        path.write_bytes(bytes(op[2]))  # type: ignore[call-overload]
    elif kind == "same-size":
        if not path.is_file() or path.is_symlink() or path.stat().st_size == 0:
            return
        before = path.stat()
        shift = int(op[2])  # type: ignore[call-overload]
        path.write_bytes(bytes((b + shift) % 256 for b in path.read_bytes()))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the stat data say "unchanged"
    elif kind == "delete":
        if path.is_symlink() or path.is_file():
            path.unlink()
    elif kind == "rename":
        target = top / str(op[2])
        if os.path.lexists(path) and target != path:
            target.parent.mkdir(parents=True, exist_ok=True)
            path.replace(target)
    elif kind == "chmod":
        if path.is_file() and not path.is_symlink():
            path.chmod(path.stat().st_mode ^ 0o111)
    elif kind == "symlink":
        if os.path.lexists(path):
            path.unlink()
        path.symlink_to(str(op[2]))
    elif kind == "add":
        force = ["-f"] if op[2] else []
        if os.path.lexists(path):
            loc_git(where, "add", *force, "--", name)
    elif kind == "rm-cached":
        loc_git(where, "rm", "-q", "--cached", "--ignore-unmatch", "--", name)


async def take(repo: Path, where: GitLocation, how: str, moves: count[int]) -> None:
    expected = worktree_files(where)
    head = loc_git(where, "rev-parse", "HEAD").strip()
    if how == "snapshot":
        index = loc_git(where, "ls-files", "--stage", "--debug")
        commit, _ = await snapshot(where, move_id=f"mov_{next(moves)}", message="m")
        assert loc_git(where, "ls-files", "--stage", "--debug") == index  # the index is not changed
        assert loc_git(where, "rev-parse", "HEAD").strip() == head
    else:
        commit = await commit_all(where, "m") or head
        assert loc_git(where, "status", "--porcelain", "--untracked-files=all") == ""
    assert tree_files(repo, commit) == expected


async def make_worktree(repo: Path, path: Path) -> GitLocation:
    await rgit.create_worktree(repo, path, f"peerd/{path.name}", "main")
    where = await rgit.locate_worktree(repo, path)
    # Every entry older than the index: git's racy-entry check does not look at them.
    past = time.time_ns() - 100 * 10**9
    for name in START:
        os.utime(path / name, ns=(past, past))
    loc_git(where, "update-index", "--refresh")
    return where


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not FUZZING,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, max_size=14))
def test_what_is_taken_is_exactly_the_worktrees_files(tmp_path: Path, ops: list[tuple[object, ...]]) -> None:
    repo = tmp_path / "repo"
    if not repo.exists():
        make_repo(repo, origin=None)
        git(repo, "config", "core.checkStat", "minimal")
        for name, content in START.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_bytes(content)
        (repo / "run.sh").chmod(0o755)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "start")
    number = len(list((tmp_path / "wt").glob("*"))) if (tmp_path / "wt").exists() else 0

    async def run() -> None:
        where = await make_worktree(repo, tmp_path / "wt" / f"w{number}")
        moves = count()
        for op in ops:
            if op[0] == "take":
                await take(repo, where, str(op[1]), moves)
            else:
                apply(where, op)
        await take(repo, where, "snapshot", moves)
        await take(repo, where, "commit", moves)

    asyncio.run(run())
