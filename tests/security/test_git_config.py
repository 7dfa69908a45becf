"""peerd's git runner against repositories set up to make git run a program (no daemon): each test
poisons one thing git reads - the repository's own config (as an in-place run that got write access
to it would), the user's global config, the inherited environment, a nested repository, a
worktree's `.git` file - runs the peerd function that would trip it, and checks the program never
ran (its marker file does not exist)."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from peerd.errors import GitError, NotFound
from peerd.orchestrate import containment
from peerd.runtime import git
from tests.helpers import git as run_git
from tests.helpers import make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


def shell(marker: Path) -> str:
    """A command line that leaves `marker` and copies stdin to stdout (so it also works as a filter)."""
    return f"sh -c 'touch {marker}; cat'"


def configure(repo: Path, *settings: tuple[str, str]) -> None:
    for key, value in settings:
        subprocess.run(["git", "config", key, value], cwd=repo, check=True)


def hook(directory: Path, name: str, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(0o755)


async def commit_something(repo: Path) -> None:
    changes = repo / "change.txt"
    changes.write_text((changes.read_text() if changes.exists() else "") + "change\n")
    assert await git.commit_all(repo, "a change") is not None


# --- the repository's own config ----------------------------------------------------------------


async def test_core_fsmonitor_never_runs(repo: Path, marker: Path) -> None:
    configure(repo, ("core.fsmonitor", f"touch {marker}"))
    (repo / "README.md").write_text("changed\n")
    assert await git.status_porcelain(repo) == [" M README.md"]
    await commit_something(repo)
    assert not marker.exists()


async def test_hooks_never_run_from_the_hooks_dir_or_a_hooks_path(
    repo: Path, marker: Path, tmp_path: Path
) -> None:
    for name in ("reference-transaction", "post-checkout", "post-commit", "pre-commit", "post-index-change"):
        hook(repo / ".git" / "hooks", name, marker)
    await git.create_worktree(repo, tmp_path / "wt", "peerd/t1", None)  # post-checkout, ref updates
    await commit_something(repo)  # update-ref: reference-transaction
    assert not marker.exists()
    configure(repo, ("core.hooksPath", str(tmp_path / "elsewhere")))
    hook(tmp_path / "elsewhere", "reference-transaction", marker)
    await commit_something(repo)
    assert not marker.exists()


async def test_an_external_diff_is_refused_not_run(repo: Path, marker: Path) -> None:
    configure(repo, ("diff.external", f"touch {marker}"))
    (repo / "README.md").write_text("changed\n")
    assert "+changed" in await git.diff(repo)
    # A diff that did not say --no-ext-diff: git refuses to run the empty command peerd sets.
    with pytest.raises(GitError):
        await git.run(repo, "diff")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("protocol", "url", "extra"),
    [
        ("ext", "ext::touch% {marker}", ()),
        ("ssh", "ssh://example.invalid/r.git", (("core.sshCommand", "sh -c 'touch {marker}' --"),)),
    ],
)
async def test_transports_that_run_a_program_are_refused(
    repo: Path, marker: Path, protocol: str, url: str, extra: tuple[tuple[str, str], ...]
) -> None:
    # The repository allows the transport itself: peerd's -c overrides win.
    configure(repo, (f"protocol.{protocol}.allow", "always"), ("remote.evil.url", url.format(marker=marker)))
    configure(repo, *((k, v.format(marker=marker)) for k, v in extra))
    with pytest.raises(GitError, match=f"transport '{protocol}' not allowed"):
        await git.run(repo, "fetch", "evil")
    assert not marker.exists()


async def test_signing_never_runs_a_gpg_program(repo: Path, marker: Path) -> None:
    configure(repo, ("commit.gpgSign", "true"), ("gpg.program", f"touch {marker}"), ("gpg.format", "openpgp"))
    await commit_something(repo)
    assert not marker.exists()


# --- the user's global config and peerd's own environment ---------------------------------------


def filtered(repo: Path) -> None:
    """Every file of `repo` names the filter `evil` (which some config then defines)."""
    (repo / ".gitattributes").write_text("* filter=evil\n")


async def test_global_config_is_never_read(
    repo: Path, marker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[filter "evil"]\n\tclean = "{shell(marker)}"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    filtered(repo)
    await commit_something(repo)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GIT_CONFIG_PARAMETERS", "'filter.evil.clean'='touch {marker}'"),
        ("GIT_CONFIG_COUNT", "1"),
        ("GIT_EXTERNAL_DIFF", "{shell}"),
        ("GIT_DIR", "{elsewhere}"),
    ],
)
async def test_inherited_git_variables_are_dropped(
    repo: Path, marker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    elsewhere = make_repo(tmp_path / "elsewhere")
    monkeypatch.setenv(name, value.format(shell=shell(marker), marker=marker, elsewhere=elsewhere / ".git"))
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "filter.evil.clean")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", shell(marker))
    filtered(repo)
    await commit_something(repo)  # a clean filter, in the repository at `repo`
    await git.run(repo, "diff", "HEAD~1", "--no-ext-diff")
    with pytest.raises(GitError):
        await git.run(repo, "diff", "HEAD~1")  # GIT_EXTERNAL_DIFF would run here
    assert not marker.exists()
    monkeypatch.delenv(name)
    assert run_git(elsewhere, "rev-list", "--count", "HEAD").strip() == "1"


# --- nested repositories and a worktree's `.git` -------------------------------------------------


async def test_a_nested_repository_is_never_entered(repo: Path, marker: Path) -> None:
    nested = repo / "vendor"
    nested.mkdir()
    run_git(nested, "init", "-q")
    (nested / "lib.txt").write_text("one\n")
    filtered(nested)
    run_git(nested, "add", ".")
    run_git(nested, "commit", "-q", "-m", "nested")
    configure(nested, ("filter.evil.clean", shell(marker)), ("core.fsmonitor", f"touch {marker}"))
    (repo / ".gitmodules").write_text('[submodule "v"]\n\tpath = vendor\n\turl = ./vendor\n\tignore = none\n')
    actions: list[Callable[[], Awaitable[object]]] = [
        lambda: git.commit_all(repo, "vendor"),
        lambda: git.status_porcelain(repo),
        lambda: git.diff(repo),
        lambda: containment.dirty_paths(repo),
        lambda: git.commit_all(repo, "again"),
    ]
    for i, action in enumerate(actions):
        (nested / "lib.txt").write_text(f"{i}{i}{i}\n")  # same size, new text: git would re-read it
        await action()
        assert not marker.exists(), action
    assert "vendor" in run_git(repo, "ls-tree", "--name-only", "HEAD")


async def test_a_worktree_is_found_by_its_record_and_its_gitfile_put_back(repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    await git.create_worktree(repo, worktree, "peerd/t1", None)
    recorded = (worktree / ".git").read_text()
    fake = make_repo(tmp_path / "fake")
    (worktree / ".git").write_text(f"gitdir: {fake / '.git'}\n")

    location = await git.locate_worktree(repo, worktree)

    assert location.git_dir == (repo / ".git" / "worktrees" / "wt").resolve()
    assert location.work_tree == worktree.resolve()
    assert (worktree / ".git").read_text() == recorded
    with pytest.raises(NotFound):
        await git.locate_worktree(repo, repo)  # the main checkout has no worktree record
    with pytest.raises(NotFound):
        await git.locate_worktree(repo, fake)


async def test_a_worktree_whose_gitfile_was_rewritten_is_still_removed(repo: Path, tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    await git.create_worktree(repo, worktree, "peerd/t1", None)
    (worktree / ".git").unlink()
    (worktree / ".git").mkdir()  # a directory now, of the agent's making
    await git.remove_worktree(repo, worktree, delete_branch=None)
    assert not worktree.exists()
    assert "wt" not in run_git(repo, "worktree", "list")
