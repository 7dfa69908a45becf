"""Rules: `git --version` is read whatever a vendor appends; the installed version is asked once per
process; the direct worktree path (peerd writing git's admin files, runtime/git/direct.py) is taken
only with a git of `DIRECT_WORKTREE_TESTED`, and any other git gets `git worktree add`, with the same
worktree as the result."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from peerd.runtime import git
from peerd.runtime.git import runner, version
from peerd.runtime.git.version import GitVersion
from tests.helpers import git as run_git
from tests.helpers import make_repo


def command_of(argv: list[str]) -> list[str]:
    """The git command in a runner's argv: without `git -C <dir>`, a location and `SAFE_CONFIG`."""
    rest = argv[argv.index("-C") + 2 :]
    rest = [a for a in rest if not a.startswith(("--git-dir=", "--work-tree="))]
    return rest[len(git.SAFE_CONFIG) :] if tuple(rest[: len(git.SAFE_CONFIG)]) == git.SAFE_CONFIG else rest


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("git version 2.39.5", GitVersion(2, 39, 5)),
        ("git version 2.39.5\n", GitVersion(2, 39, 5)),
        ("git version 2.43.0.windows.1", GitVersion(2, 43, 0)),
        ("git version 2.39.3 (Apple Git-146)", GitVersion(2, 39, 3)),
        ("git version 2.45.GIT", GitVersion(2, 45, 0)),
        ("git version 2.47.0-rc1", GitVersion(2, 47, 0)),
        ("git version 2.20", GitVersion(2, 20, 0)),
        ("git version 10.2.33", GitVersion(10, 2, 33)),
        ("hub version 2.14.2", None),
        ("git version two", None),
        ("", None),
    ],
)
def test_parse_version(text: str, parsed: GitVersion | None) -> None:
    assert git.parse_version(text) == parsed


def test_the_tested_range_is_releases_with_any_patch_level() -> None:
    tested = git.DIRECT_WORKTREE_TESTED
    assert str(tested) == "2.39-2.47"
    assert [
        git.direct_worktree_tested(GitVersion(*v)) for v in [(2, 38, 9), (2, 39, 0), (2, 47, 99), (2, 48, 0)]
    ] == [
        False,
        True,
        True,
        False,
    ]
    assert not git.direct_worktree_tested(None)  # unknown: the slow path
    assert tested.first >= git.MINIMUM


async def test_the_installed_version_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version, "_known", [])
    asked: list[list[str]] = []
    real = runner._Running.run

    def run(
        self: runner._Running, argv: list[str], stdin: bytes | None, env: dict[str, str]
    ) -> tuple[int, bytes, bytes]:
        asked.append(argv)
        return real(self, argv, stdin, env)

    monkeypatch.setattr(runner._Running, "run", run)
    first = await git.installed_version()
    assert first is not None and first == git.parse_version(run_git(Path.cwd(), "--version"))
    assert await git.installed_version() == first
    assert [argv[-1] for argv in asked] == ["--version"]
    assert asked[0][:3] == ["git", "-C", "/"] and "core.hooksPath=/dev/null" in asked[0]  # the runner's


@pytest.mark.parametrize("installed", [GitVersion(2, 48, 1), GitVersion(2, 38, 0), None])
async def test_outside_the_tested_range_a_worktree_is_made_by_git_worktree_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: GitVersion | None
) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setattr(version, "_known", [installed])
    commands: list[str] = []
    real = runner._Running.run

    def run(
        self: runner._Running, argv: list[str], stdin: bytes | None, env: dict[str, str]
    ) -> tuple[int, bytes, bytes]:
        assert threading.current_thread().name.startswith("peerd-git")
        commands.append(" ".join(command_of(argv)))
        return real(self, argv, stdin, env)

    monkeypatch.setattr(runner._Running, "run", run)
    worktree = tmp_path / "wt" / "thr_1"
    await git.create_worktree(repo, worktree, "peerd/thr_1", None)

    assert not any(c.startswith(("update-ref", "read-tree")) for c in commands), commands
    assert any(c.startswith("worktree add -b peerd/thr_1 -- ") for c in commands), commands
    # The worktree git made: on its branch at HEAD, clean, listed, and removable by peerd.
    assert run_git(worktree, "branch", "--show-current").strip() == "peerd/thr_1"
    assert run_git(worktree, "rev-parse", "HEAD") == run_git(repo, "rev-parse", "HEAD")
    assert run_git(worktree, "status", "--porcelain") == ""
    assert str(worktree) in run_git(repo, "worktree", "list")
    assert not list((repo / ".git" / "worktrees").glob("*/locked"))
    await git.remove_worktree(repo, worktree, delete_branch="peerd/thr_1")
    assert str(worktree) not in run_git(repo, "worktree", "list")


async def test_inside_the_tested_range_the_admin_files_are_written_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setattr(version, "_known", [GitVersion(2, 39, 5)])
    commands: list[str] = []
    real = runner._Running.run

    def run(
        self: runner._Running, argv: list[str], stdin: bytes | None, env: dict[str, str]
    ) -> tuple[int, bytes, bytes]:
        commands.append(
            next(a for a in argv[argv.index("-C") + 2 :] if a not in git.SAFE_CONFIG and "=" not in a)
        )
        return real(self, argv, stdin, env)

    monkeypatch.setattr(runner._Running, "run", run)
    worktree = tmp_path / "wt" / "thr_1"
    await git.create_worktree(repo, worktree, "peerd/thr_1", None)
    assert commands == ["update-ref", "read-tree"]
    assert run_git(worktree, "branch", "--show-current").strip() == "peerd/thr_1"


async def test_probe_version_says_what_git_printed_and_where_it_is() -> None:
    found = await git.probe_version(10)
    assert found.error is None and found.text is not None and found.text.startswith("git version ")
    assert found.path is not None and found.path.endswith("/git")


async def test_probe_version_without_git_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    found = await git.probe_version(10)
    assert (found.text, found.path, found.error) == (None, None, "not found on PATH")
