"""Rules: creating a worktree is O(1) in the number of worktrees the repository has (two git
processes for a new one, none listing the others), git runs off the event loop thread, and a
cancelled git call leaves no process behind."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest

from peerd.runtime import git, gitrun
from tests.helpers import git as run_git
from tests.helpers import make_repo


class Spy:
    """Every git command line `gitrun` starts, and the thread that started it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[list[str], str]] = []
        real = gitrun._Running.run
        spy = self

        def run(
            self: gitrun._Running, argv: list[str], stdin: bytes | None, env: dict[str, str]
        ) -> tuple[int, bytes, bytes]:
            subcommand = [a for a in argv[1:] if not a.startswith("-") and "=" not in a and "/" not in a]
            spy.calls.append((subcommand, threading.current_thread().name))
            return real(self, argv, stdin, env)

        monkeypatch.setattr(gitrun._Running, "run", run)

    def subcommands(self) -> list[str]:
        return [argv[0] if argv else "?" for argv, _ in self.calls]


def add_worktrees(repo: Path, root: Path, n: int) -> None:
    for i in range(n):
        run_git(repo, "worktree", "add", "-q", "-b", f"fill/{i}", str(root / f"fill-{i}"))


async def test_a_new_worktree_is_two_git_processes_whatever_the_repository_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    add_worktrees(repo, tmp_path, 40)
    spy = Spy(monkeypatch)
    await git.create_worktree(repo, tmp_path / "wt" / "thr_1", "peerd/thr_1", None)
    assert spy.subcommands() == ["cat-file", "worktree"]  # resolve branch + start, then add
    assert all(argv[:2] != ["worktree", "list"] for argv, _ in spy.calls)
    assert run_git(tmp_path / "wt" / "thr_1", "branch", "--show-current").strip() == "peerd/thr_1"

    spy.calls.clear()
    await git.create_worktree(repo, tmp_path / "wt" / "thr_1", "peerd/thr_1", None)  # again: kept
    assert spy.calls == []


async def test_git_runs_in_worker_threads_never_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    spy = Spy(monkeypatch)
    await asyncio.gather(
        git.head_commit(repo),
        git.create_worktree(repo, tmp_path / "a", "peerd/a", None),
        git.status_porcelain(repo),
    )
    loop_thread = threading.current_thread().name
    assert spy.calls and all(name != loop_thread and name.startswith("peerd-git") for _, name in spy.calls)


async def test_a_cancelled_git_call_kills_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    started = threading.Event()
    procs: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: object, **kw: object) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = real_popen(*args, **kw)  # type: ignore[call-overload]
        procs.append(proc)
        started.set()
        return proc

    monkeypatch.setattr(gitrun.subprocess, "Popen", popen)
    # A git that runs until stopped (an alias the test itself passes on the command line).
    slow = asyncio.ensure_future(gitrun._git(repo, "-c", "alias.slow=!sleep 2", "slow"))
    assert await asyncio.to_thread(started.wait, 10)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert procs[0].poll() is not None  # killed and reaped by the time the cancel returns
    assert procs[0].returncode < 0


def test_branch_names_are_checked_as_git_checks_them(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    names = [
        "peerd/thr_1", "orchestrate/run/p-1.x", "a", "a/b/c", "bad..name", "-f", "/a", "a/", "a.", "a.lock",
        "a/.b", "a//b", "a@{b", "@", "a b", "a~b", "a^b", "a:b", "a?b", "a*b", "a[b", "a\\b", "a\x01b", "a\x7fb",
        ".a", "a/b.lock/c", "é/ü", "a@b", "a{b}",
    ]  # fmt: skip
    for name in names:
        by_git = run_check_ref_format(repo, name)
        assert git.valid_branch_name(name) == (by_git and not name.startswith("-")), name


def run_check_ref_format(repo: Path, name: str) -> bool:
    done = subprocess.run(
        ["git", "check-ref-format", f"refs/heads/{name}"], cwd=repo, capture_output=True, check=False
    )
    return done.returncode == 0
