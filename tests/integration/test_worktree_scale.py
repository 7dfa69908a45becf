"""Rules: creating a worktree is O(1) in the number of worktrees the repository has (two git
processes for a new one, none reading the others: not `git worktree add`), what it makes is the
worktree git makes (`worktree list`, `prune`, `status`, `remove` agree), git runs off the event
loop thread, and a cancelled git call leaves no process behind."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest

from peerd.runtime import git
from peerd.runtime.git import runner
from tests.helpers import git as run_git
from tests.helpers import make_repo


class Spy:
    """Every git command line the runner starts, and the thread that started it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[list[str], str]] = []
        real = runner._Running.run
        spy = self

        def run(
            self: runner._Running, argv: list[str], stdin: bytes | None, env: dict[str, str]
        ) -> tuple[int, bytes, bytes]:
            subcommand = [a for a in argv[1:] if not a.startswith("-") and "=" not in a and "/" not in a]
            spy.calls.append((subcommand, threading.current_thread().name))
            return real(self, argv, stdin, env)

        monkeypatch.setattr(runner._Running, "run", run)

    def subcommands(self) -> list[str]:
        return [argv[0] if argv else "?" for argv, _ in self.calls]


def add_worktrees(repo: Path, root: Path, n: int) -> None:
    for i in range(n):
        run_git(repo, "worktree", "add", "-q", "-b", f"fill/{i}", str(root / f"fill-{i}"))


@pytest.mark.slow
async def test_a_new_worktree_is_two_git_processes_whatever_the_repository_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    add_worktrees(repo, tmp_path, 40)
    assert git.direct_worktree_tested(await git.installed_version())  # asked once, before the spy
    spy = Spy(monkeypatch)
    await git.create_worktree(repo, tmp_path / "wt" / "thr_1", "peerd/thr_1", None)
    # Make the branch (new, on a commit), check the files out: no `worktree` command at all.
    assert spy.subcommands() == ["update-ref", "read-tree"]
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

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    # A git that runs until stopped (an alias the test itself passes on the command line).
    slow = asyncio.ensure_future(runner.run(repo, "-c", "alias.slow=!sleep 2", "slow"))
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


def porcelain(repo: Path) -> dict[str, dict[str, str]]:
    """`git worktree list --porcelain`, by worktree path."""
    found: dict[str, dict[str, str]] = {}
    for record in run_git(repo, "worktree", "list", "--porcelain").split("\n\n"):
        fields = dict(line.partition(" ")[::2] for line in record.splitlines() if line)
        if "worktree" in fields:
            found[fields["worktree"]] = fields
    return found


async def test_a_worktree_made_directly_is_the_one_git_worktree_add_makes(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("print('a')\n")
    run_git(repo, "add", "src")
    run_git(repo, "commit", "-q", "-m", "src")
    head = run_git(repo, "rev-parse", "HEAD").strip()
    ours, theirs = tmp_path / "wt" / "thr_1", tmp_path / "wt" / "by-git"
    await git.create_worktree(repo, ours, "peerd/thr_1", None)
    run_git(repo, "worktree", "add", "-q", "-b", "by-git", str(theirs))

    listed = porcelain(repo)
    assert listed[str(ours)] == {"worktree": str(ours), "HEAD": head, "branch": "refs/heads/peerd/thr_1"}
    admin, git_made = repo / ".git" / "worktrees" / "thr_1", repo / ".git" / "worktrees" / "by-git"
    for name in ("gitdir", "commondir", "HEAD"):  # the same files, written the same way
        expected = (git_made / name).read_text().replace(str(theirs), str(ours))
        assert (admin / name).read_text() == expected.replace("heads/by-git", "heads/peerd/thr_1"), name
    assert (ours / ".git").read_text() == f"gitdir: {admin}\n"
    assert not (admin / "locked").exists()
    assert (ours / "src" / "a.py").read_text() == "print('a')\n"
    assert run_git(ours, "status", "--porcelain") == ""  # the index matches the files
    assert run_git(ours, "branch", "--show-current").strip() == "peerd/thr_1"
    assert "branch: Created from" in run_git(repo, "reflog", "show", "peerd/thr_1")
    # git's own bookkeeping agrees: prune keeps it, a commit in it moves its branch, and it is
    # removed (and pruned once its directory is gone) like any other.
    run_git(repo, "worktree", "prune")
    assert str(ours) in porcelain(repo)
    (ours / "b.txt").write_text("b\n")
    run_git(ours, "add", "b.txt")
    run_git(ours, "commit", "-q", "-m", "b")
    assert run_git(repo, "log", "-1", "--format=%s", "peerd/thr_1").strip() == "b"
    await git.remove_worktree(repo, ours, delete_branch="peerd/thr_1")
    assert str(ours) not in porcelain(repo) and not ours.exists() and not admin.exists()
    await git.create_worktree(repo, ours, "peerd/thr_2", None)
    subprocess.run(["rm", "-rf", str(ours)], check=True)
    run_git(repo, "worktree", "prune")
    assert str(ours) not in porcelain(repo)


async def test_a_taken_admin_name_gets_a_number_as_git_gives_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    first, second = tmp_path / "a" / "thr_1", tmp_path / "b" / "thr_1"
    await git.create_worktree(repo, first, "peerd/a", None)
    await git.create_worktree(repo, second, "peerd/b", None)
    assert (repo / ".git" / "worktrees" / "thr_11" / "gitdir").read_text() == f"{second}/.git\n"
    assert porcelain(repo)[str(second)]["branch"] == "refs/heads/peerd/b"
    await git.create_worktree(repo, second, "peerd/b", None)  # found again by its record: kept


async def test_a_creation_cut_midway_is_made_again_from_its_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    wt = tmp_path / "wt" / "thr_1"
    await git.create_worktree(repo, wt, "peerd/thr_1", None)
    admin = repo / ".git" / "worktrees" / "thr_1"
    # What a crash between the admin files and the checkout leaves: `locked`, no files.
    (admin / "locked").write_text("initializing")
    (admin / "index").unlink()
    (wt / "README.md").unlink()
    await git.create_worktree(repo, wt, "peerd/thr_1", None)
    assert (wt / "README.md").exists() and run_git(wt, "status", "--porcelain") == ""
    assert porcelain(repo)[str(wt)]["branch"] == "refs/heads/peerd/thr_1"


async def test_the_directory_never_exists_without_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A creation cut by kill -9 right after the worktree's directory appears must leave a record
    start-up makes again (`locked: initializing`): a bare directory with no record is a path git
    refuses to reuse, and the run that continues the cut one failed on it."""
    repo = make_repo(tmp_path / "repo")
    wt = tmp_path / "wt" / "thr_1"
    seen: list[bool] = []
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self == wt:
            admin = repo / ".git" / "worktrees" / "thr_1"
            seen.append((admin / "locked").is_file() and (admin / "gitdir").is_file())
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", mkdir)
    await git.create_worktree(repo, wt, "peerd/thr_1", None)
    assert seen and all(seen)
    # What such a cut leaves (the record, the directory, nothing checked out) is made again.
    run_git(repo, "worktree", "remove", "--force", str(wt))
    run_git(repo, "branch", "-D", "peerd/thr_1")
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    from peerd.runtime.git import direct  # noqa: PLC0415

    run_git(repo, "branch", "peerd/thr_1")
    direct._write_admin(repo / ".git" / "worktrees", wt, "peerd/thr_1")
    await git.create_worktree(repo, wt, "peerd/thr_1", None)
    assert (wt / "README.md").exists() and run_git(wt, "status", "--porcelain") == ""


@pytest.mark.parametrize("why", ["sparse", "worktree-config", "odd-name"])
async def test_what_git_must_decide_goes_through_git_worktree_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    repo = make_repo(tmp_path / "repo")
    name = "thr 1" if why == "odd-name" else "thr_1"
    if why == "sparse":
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "sparse-checkout").write_text("/*\n")
    elif why == "worktree-config":
        (repo / ".git" / "config.worktree").write_text("")
    spy = Spy(monkeypatch)
    await git.create_worktree(repo, tmp_path / "wt" / name, "peerd/thr_1", None)
    assert spy.subcommands() == ["cat-file", "worktree"]
    assert porcelain(repo)[str(tmp_path / "wt" / name)]["branch"] == "refs/heads/peerd/thr_1"
