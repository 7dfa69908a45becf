"""The git wrapper against real repositories made in tmp_path (requires `git` on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from peerd.errors import GitError, InvalidRequest
from peerd.runtime import git
from peerd.runtime.git import runner

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

# Commits must work on a machine without a global git config, and the user's own config (hooks,
# signing, default branch) must not leak into the tests.
_GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def run_git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env=_GIT_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def init_repo(path: Path, *, commit: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    run_git(path, "init", "-q")
    if commit:
        (path / "README.md").write_text("hello\n")
        run_git(path, "add", "README.md")
        run_git(path, "commit", "-q", "-m", "initial")
    return path


def branches(repo: Path) -> list[str]:
    return run_git(repo, "branch", "--format=%(refname:short)").split()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo")


async def test_toplevel_of_a_subdirectory(repo: Path) -> None:
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    assert await git.toplevel(sub) == repo.resolve()


async def test_toplevel_outside_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidRequest, match="is not inside a git repository"):
        await git.toplevel(plain)


async def test_toplevel_of_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="does not exist"):
        await git.toplevel(tmp_path / "missing")


async def test_origin_absent_and_present(repo: Path) -> None:
    assert await git.origin_url(repo) is None
    assert await git.repository_key(repo) is None
    run_git(repo, "remote", "add", "origin", "https://user:tok@github.com/Owner/Repo.git")
    assert await git.origin_url(repo) == "https://user:tok@github.com/Owner/Repo.git"
    assert await git.repository_key(repo) == "github.com/owner/repo"


async def test_ssh_and_https_clones_share_a_key(tmp_path: Path) -> None:
    a = init_repo(tmp_path / "a")
    b = init_repo(tmp_path / "b")
    run_git(a, "remote", "add", "origin", "git@github.com:o/r.git")
    run_git(b, "remote", "add", "origin", "https://github.com/o/r")
    assert await git.repository_key(a) == await git.repository_key(b) == "github.com/o/r"


async def test_two_clones_of_one_local_bare_origin_share_a_key(tmp_path: Path) -> None:
    seed = init_repo(tmp_path / "seed")
    run_git(tmp_path, "clone", "-q", "--bare", str(seed), "origin.git")
    run_git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), "one")
    run_git(tmp_path, "clone", "-q", f"file://{tmp_path}/origin.git", "two")
    three = init_repo(tmp_path / "three", commit=False)
    run_git(three, "remote", "add", "origin", "../origin.git/")  # relative to the top level
    key = await git.repository_key(tmp_path / "one")
    assert key == f"file:{tmp_path.resolve()}/origin"
    assert await git.repository_key(tmp_path / "two") == key
    assert await git.repository_key(three) == key
    assert await git.repository_key(seed) is None


async def test_head_commit(repo: Path, tmp_path: Path) -> None:
    assert await git.head_commit(repo) == run_git(repo, "rev-parse", "HEAD").strip()
    empty = init_repo(tmp_path / "empty", commit=False)
    assert await git.head_commit(empty) is None


async def test_create_worktree_makes_branch_and_directory_and_is_idempotent(
    repo: Path, tmp_path: Path
) -> None:
    wt = tmp_path / "wt"
    await git.create_worktree(repo, wt, "peerd/run-1", None)
    assert (wt / "README.md").read_text() == "hello\n"
    assert "peerd/run-1" in branches(repo)
    assert run_git(wt, "branch", "--show-current").strip() == "peerd/run-1"

    (wt / "work.txt").write_text("in progress\n")
    await git.create_worktree(repo, wt, "peerd/run-1", None)  # again: nothing changes
    assert (wt / "work.txt").read_text() == "in progress\n"

    with pytest.raises(GitError, match="already a worktree"):
        await git.create_worktree(repo, wt, "peerd/other", None)


async def test_create_worktree_from_a_base(repo: Path, tmp_path: Path) -> None:
    first = run_git(repo, "rev-parse", "HEAD").strip()
    (repo / "later.txt").write_text("later\n")
    run_git(repo, "add", "later.txt")
    run_git(repo, "commit", "-q", "-m", "later")
    wt = tmp_path / "wt"
    await git.create_worktree(repo, wt, "from-base", first)
    assert run_git(wt, "rev-parse", "HEAD").strip() == first
    assert not (wt / "later.txt").exists()

    with pytest.raises(GitError, match="is not a commit"):
        await git.create_worktree(repo, tmp_path / "wt2", "b2", "no-such-rev")
    with pytest.raises(InvalidRequest):
        await git.create_worktree(repo, tmp_path / "wt3", "b3", "--orphan")
    with pytest.raises(InvalidRequest, match="Invalid branch name"):
        await git.create_worktree(repo, tmp_path / "wt4", "bad..name", None)
    with pytest.raises(InvalidRequest, match="Invalid branch name"):
        await git.create_worktree(repo, tmp_path / "wt5", "-f", None)


async def test_create_worktree_again_after_its_directory_was_deleted(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    await git.create_worktree(repo, wt, "peerd/run-2", None)
    (wt / "committed.txt").write_text("kept on the branch\n")
    run_git(wt, "add", "committed.txt")
    run_git(wt, "commit", "-q", "-m", "agent work")
    shutil.rmtree(wt)  # a crash or a cleanup lost the directory; the branch survives

    await git.create_worktree(repo, wt, "peerd/run-2", None)
    assert (wt / "committed.txt").read_text() == "kept on the branch\n"
    assert run_git(wt, "branch", "--show-current").strip() == "peerd/run-2"

    # The same recovery at another path: the branch exists, no worktree is registered for it.
    await git.remove_worktree(repo, wt, delete_branch=None)
    other = tmp_path / "wt-other"
    await git.create_worktree(repo, other, "peerd/run-2", None)
    assert (other / "committed.txt").exists()


async def test_create_worktree_in_a_repository_without_commits(tmp_path: Path) -> None:
    empty = init_repo(tmp_path / "empty", commit=False)
    with pytest.raises(GitError, match=r"has no commits yet.*--in-place"):
        await git.create_worktree(empty, tmp_path / "wt", "peerd/run-3", None)
    assert not (tmp_path / "wt").exists()


async def test_remove_worktree_is_idempotent_and_deletes_the_branch(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    await git.create_worktree(repo, wt, "peerd/run-4", None)
    (wt / "dirty.txt").write_text("uncommitted\n")
    (wt / "README.md").write_text("changed\n")

    await git.remove_worktree(repo, wt, delete_branch="peerd/run-4")
    assert not wt.exists()
    assert "peerd/run-4" not in branches(repo)
    assert str(wt) not in run_git(repo, "worktree", "list")

    await git.remove_worktree(repo, wt, delete_branch="peerd/run-4")  # again: fine


async def test_remove_worktree_whose_directory_is_gone(repo: Path, tmp_path: Path) -> None:
    wt = tmp_path / "wt"
    await git.create_worktree(repo, wt, "peerd/run-5", None)
    shutil.rmtree(wt)
    await git.remove_worktree(repo, wt, delete_branch=None)
    assert "peerd/run-5" in branches(repo)
    assert str(wt) not in run_git(repo, "worktree", "list")


async def test_remove_worktree_leaves_a_directory_git_does_not_own(repo: Path, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("not ours\n")
    await git.remove_worktree(repo, stranger, delete_branch=None)
    assert (stranger / "keep.txt").exists()


async def test_diff_shows_modified_and_untracked_files_without_touching_the_index(repo: Path) -> None:
    (repo / "README.md").write_text("hello\nworld\n")
    (repo / "new dir").mkdir()
    (repo / "new dir" / "new.txt").write_text("brand new\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "noise.log").write_text("ignored\n")
    index_before = (repo / ".git" / "index").read_bytes()

    patch = await git.diff(repo)

    assert "diff --git a/README.md b/README.md" in patch
    assert "+world" in patch
    assert "+++ b/new dir/new.txt" in patch
    assert "+brand new" in patch
    assert "+*.log" in patch  # the untracked .gitignore itself
    assert "noise.log" not in patch
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert run_git(repo, "diff", "--cached", "--name-only") == ""


async def test_diff_against_a_base_and_from_a_subdirectory(repo: Path) -> None:
    first = run_git(repo, "rev-parse", "HEAD").strip()
    (repo / "second.txt").write_text("second\n")
    run_git(repo, "add", "second.txt")
    run_git(repo, "commit", "-q", "-m", "second")
    sub = repo / "sub"
    sub.mkdir()
    (sub / "x.txt").write_text("x\n")

    assert "second.txt" not in await git.diff(sub)
    patch = await git.diff(sub, base=first)
    assert "+++ b/second.txt" in patch
    assert "+++ b/sub/x.txt" in patch


async def test_diff_of_a_clean_tree_and_of_a_repository_without_commits(repo: Path, tmp_path: Path) -> None:
    assert await git.diff(repo) == ""
    empty = init_repo(tmp_path / "empty", commit=False)
    (empty / "a.txt").write_text("a\n")
    (empty / "staged.txt").write_text("s\n")
    run_git(empty, "add", "staged.txt")
    patch = await git.diff(empty)
    assert "+++ b/a.txt" in patch
    assert "+++ b/staged.txt" in patch


async def test_status_porcelain(repo: Path, tmp_path: Path) -> None:
    assert await git.status_porcelain(repo) == []
    (repo / "README.md").write_text("changed\n")
    (repo / "d").mkdir()
    (repo / "d" / "u.txt").write_text("u\n")
    assert await git.status_porcelain(repo) == [" M README.md", "?? d/u.txt"]
    with pytest.raises(InvalidRequest):
        await git.status_porcelain(tmp_path)


async def test_network_transports_are_refused_and_errors_carry_no_credentials(repo: Path) -> None:
    # peerd's git reaches no network: the transport is refused before any connection.
    with pytest.raises(GitError) as caught:
        await git.run(repo, "ls-remote", "https://user:hunter2@127.0.0.1:9/o/r.git")
    message = caught.value.message
    assert "hunter2" not in message
    assert "transport 'https' not allowed" in message  # git's own explanation is kept
    assert caught.value.code == "git_error"


async def test_symlinked_path_to_an_origin_gives_the_same_key(tmp_path: Path) -> None:
    seed = init_repo(tmp_path / "seed")
    run_git(tmp_path, "clone", "-q", "--bare", str(seed), "origin.git")
    (tmp_path / "link").symlink_to(tmp_path)
    run_git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), "direct")
    run_git(tmp_path, "clone", "-q", str(tmp_path / "link" / "origin.git"), "via-link")
    assert await git.repository_key(tmp_path / "direct") == await git.repository_key(tmp_path / "via-link")


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("fatal: 'https://u:p@h/o/r' not found", "fatal: 'https://h/o/r' not found"),
        ("https://tok@h/r and ssh://u:p@w@h:22/r", "https://h/r and ssh://h:22/r"),
        ("no url here: git@github.com:o/r", "no url here: git@github.com:o/r"),
    ],
)
def test_scrub_removes_userinfo(text: str, scrubbed: str) -> None:
    assert runner._scrub(text) == scrubbed
