"""The git mechanics of `peerd orchestrate` against real repositories: packet commits, diffs,
containment recovery from the orchestrator's checkout, integration merges, bundles between two
clones, and verification commands with timeouts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from peerd.errors import Conflict, GitError, InvalidRequest
from peerd.orchestrate import checks, containment
from peerd.runtime import git as rgit
from tests.helpers import git, make_repo


@pytest.fixture(autouse=True)
def _no_git_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """peerd's own git runs see no global or system config, so no identity: commits and merges
    must bring their own."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)


def commit_file(repo: Path, name: str, content: str, message: str | None = None) -> str:
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    git(repo, "add", "--", name)
    git(repo, "commit", "-q", "-m", message or f"write {name}")
    return git(repo, "rev-parse", "HEAD").strip()


def status(repo: Path) -> str:
    return git(repo, "status", "--porcelain=v1", "--untracked-files=all")


# --- commits and diffs --------------------------------------------------------------------------


async def test_commit_all_commits_new_modified_deleted_and_untracked_files(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "gone.txt", "bye\n")
    commit_file(repo, ".gitignore", "*.log\n")
    base = await rgit.head(repo)
    git(repo, "config", "commit.gpgsign", "true")  # must not make the commit wait for a signer

    (repo / "staged.txt").write_text("new and added\n")
    git(repo, "add", "staged.txt")
    (repo / "README.md").write_text("# changed\n")
    (repo / "gone.txt").unlink()
    (repo / "pkg").mkdir()
    (repo / "pkg" / "untracked.py").write_text("x = 1\n")
    (repo / "debug.log").write_text("ignored\n")

    sha = await rgit.commit_all(repo, "packet p1: the work")
    assert sha is not None and len(sha) == 40
    assert sha == await rgit.head(repo)
    assert git(repo, "rev-parse", "HEAD~1").strip() == base
    names = git(repo, "show", "--name-status", "--format=", sha).split("\n")
    assert sorted(filter(None, names)) == [
        "A\tpkg/untracked.py",
        "A\tstaged.txt",
        "D\tgone.txt",
        "M\tREADME.md",
    ]
    assert git(repo, "log", "-1", "--format=%an <%ae>|%s").strip() == (
        "peerd orchestrate <orchestrate@peerd.invalid>|packet p1: the work"
    )
    assert status(repo) == ""  # debug.log is ignored: neither committed nor listed


async def test_commit_all_with_nothing_to_commit_returns_none(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    before = await rgit.head(repo)
    assert await rgit.commit_all(repo, "nothing") is None
    assert await rgit.head(repo) == before


async def test_commit_all_uses_the_given_author(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("a\n")
    await rgit.commit_all(repo, "m", author="Coder Bot <bot@example.invalid>")
    assert git(repo, "log", "-1", "--format=%an <%ae>").strip() == "Coder Bot <bot@example.invalid>"
    with pytest.raises(InvalidRequest):
        await rgit.commit_all(repo, "m", author="no email here")


async def test_changed_files_diff_stat_and_diff_text(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "old.txt", "old\n")
    base = await rgit.head(repo)
    commit_file(repo, "src/new.py", "print('hi')\n")
    git(repo, "mv", "old.txt", "renamed.txt")
    (repo / "README.md").write_text("# demo\nmore\n")
    tip = await rgit.commit_all(repo, "change")
    assert tip is not None

    assert await rgit.changed_files(repo, base, tip) == [
        "README.md",
        "old.txt",
        "renamed.txt",
        "src/new.py",
    ]
    stat = await rgit.diff_stat(repo, base, tip)
    assert "src/new.py" in stat and "README.md" in stat
    assert "files changed" in stat
    text = await rgit.diff_text(repo, base, tip)
    assert "+print('hi')" in text and "diff --git a/README.md b/README.md" in text
    short = await rgit.diff_text(repo, base, tip, max_chars=50)
    assert short.startswith(text[:50]) and "diff truncated" in short
    assert await rgit.changed_files(repo, tip, tip) == []


async def test_head_of_a_repository_without_commits_raises(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(GitError, match="no commits"):
        await rgit.head(empty)


# --- containment --------------------------------------------------------------------------------


async def test_dirty_paths_lists_untracked_files_and_renames_by_new_path(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "a.txt", "a\n" * 20)
    assert await containment.dirty_paths(repo) == []
    (repo / "README.md").write_text("changed\n")
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "file.txt").write_text("u\n")
    git(repo, "mv", "a.txt", "b.txt")
    assert await containment.dirty_paths(repo) == ["README.md", "b.txt", "new/deep/file.txt"]


async def located(repo: Path, worktree: Path) -> rgit.GitLocation:
    return await rgit.locate_worktree(repo, worktree)


async def _packet_worktree(repo: Path, tmp_path: Path, name: str = "p1") -> Path:
    worktree = tmp_path / "worktrees" / name
    await rgit.create_worktree(repo, worktree, f"orchestrate/r1/{name}", await rgit.head(repo))
    return worktree


async def test_recover_escaped_moves_in_scope_edits_and_leaves_the_users_work(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "app/a.py", "a = 1\n")
    commit_file(repo, "app/b.py", "b = 1\n")
    commit_file(repo, "notes.md", "user's notes\n")
    worktree = await _packet_worktree(repo, tmp_path)

    # The coder escaped: a staged edit, a partly staged edit, and a new file in the checkout.
    (repo / "app" / "a.py").write_text("a = 2\n")
    git(repo, "add", "app/a.py")
    (repo / "app" / "b.py").write_text("b = 2\n")
    git(repo, "add", "app/b.py")
    (repo / "app" / "b.py").write_text("b = 3\n")
    (repo / "app" / "c.py").write_text("c = 1\n")
    # The user's own uncommitted work, outside the packet: tracked and untracked.
    (repo / "notes.md").write_text("user's notes, edited\n")
    (repo / "scratch.txt").write_text("user's scratch\n")
    (repo / "app" / "user_helper.py").write_text("mine\n")

    recovered = await containment.recover_escaped(
        repo, await located(repo, worktree), ["app/a.py", "app/b.py", "app/c.py"]
    )

    assert recovered == ["app/a.py", "app/b.py", "app/c.py"]
    assert (worktree / "app" / "a.py").read_text() == "a = 2\n"
    assert (worktree / "app" / "b.py").read_text() == "b = 3\n"  # the working-tree version wins
    assert (worktree / "app" / "c.py").read_text() == "c = 1\n"
    assert not (worktree / "notes.md").read_text().endswith("edited\n")
    assert not (worktree / "scratch.txt").exists()
    assert not (worktree / "app" / "user_helper.py").exists()

    # In the checkout: packet paths back at HEAD, the user's work exactly as it was.
    assert (repo / "app" / "a.py").read_text() == "a = 1\n"
    assert (repo / "app" / "b.py").read_text() == "b = 1\n"
    assert not (repo / "app" / "c.py").exists()
    assert (repo / "notes.md").read_text() == "user's notes, edited\n"
    assert (repo / "scratch.txt").read_text() == "user's scratch\n"
    assert (repo / "app" / "user_helper.py").read_text() == "mine\n"
    assert sorted(status(repo).splitlines()) == [" M notes.md", "?? app/user_helper.py", "?? scratch.txt"]

    # The recovered work commits in the worktree as the packet's result.
    sha = await rgit.commit_all(worktree, "p1")
    assert sha is not None
    assert await rgit.changed_files(worktree, await rgit.head(repo), sha) == [
        "app/a.py",
        "app/b.py",
        "app/c.py",
    ]
    # Nothing left in scope: a second recovery is a no-op.
    assert (
        await containment.recover_escaped(
            repo, await located(repo, worktree), ["app/a.py", "app/b.py", "app/c.py"]
        )
        == []
    )


async def test_recover_escaped_with_a_directory_scope(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "pkg/mod.py", "v = 1\n")
    commit_file(repo, "pkg/old.py", "old\n")
    commit_file(repo, "pkgextra.py", "x\n")
    worktree = await _packet_worktree(repo, tmp_path)

    (repo / "pkg" / "mod.py").write_text("v = 2\n")
    git(repo, "rm", "-q", "pkg/old.py")
    (repo / "pkg" / "sub" / "deeper").mkdir(parents=True)
    (repo / "pkg" / "sub" / "deeper" / "new.py").write_text("new\n")
    # Same prefix, different directory: out of scope.
    (repo / "pkgextra.py").write_text("user edit\n")
    (repo / "pkg2").mkdir()
    (repo / "pkg2" / "mine.py").write_text("mine\n")

    recovered = await containment.recover_escaped(repo, await located(repo, worktree), ["./pkg/"])

    assert recovered == ["pkg/mod.py", "pkg/old.py", "pkg/sub/deeper/new.py"]
    assert (worktree / "pkg" / "mod.py").read_text() == "v = 2\n"
    assert not (worktree / "pkg" / "old.py").exists()
    assert (worktree / "pkg" / "sub" / "deeper" / "new.py").read_text() == "new\n"
    assert (repo / "pkg" / "mod.py").read_text() == "v = 1\n"
    assert (repo / "pkg" / "old.py").read_text() == "old\n"
    assert not (repo / "pkg" / "sub").exists()  # emptied in-scope directories are removed
    assert (repo / "pkgextra.py").read_text() == "user edit\n"
    assert (repo / "pkg2" / "mine.py").read_text() == "mine\n"
    assert sorted(status(repo).splitlines()) == [" M pkgextra.py", "?? pkg2/mine.py"]


async def test_recover_escaped_merges_into_a_worktree_that_moved_on(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "f.txt", "".join(f"line {i}\n" for i in range(20)))
    worktree = await _packet_worktree(repo, tmp_path)
    # The coder also committed in its worktree, elsewhere in the same file.
    lines = (worktree / "f.txt").read_text().splitlines(keepends=True)
    lines[18] = "line 18 in the worktree\n"
    commit_file(worktree, "f.txt", "".join(lines))
    escaped = (repo / "f.txt").read_text().replace("line 1\n", "line 1 escaped\n")
    (repo / "f.txt").write_text(escaped)

    assert await containment.recover_escaped(repo, await located(repo, worktree), ["f.txt"]) == ["f.txt"]
    text = (worktree / "f.txt").read_text()
    assert "line 1 escaped\n" in text and "line 18 in the worktree\n" in text
    assert status(repo) == ""


async def test_recover_escaped_that_would_conflict_changes_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "f.txt", "one\n")
    worktree = await _packet_worktree(repo, tmp_path)
    commit_file(worktree, "f.txt", "worktree\n")
    (repo / "f.txt").write_text("checkout\n")
    (repo / "new.txt").write_text("escaped\n")
    (worktree / "new.txt").write_text("different\n")

    with pytest.raises(Conflict, match=r"new\.txt"):
        await containment.recover_escaped(repo, await located(repo, worktree), ["f.txt", "new.txt"])
    (worktree / "new.txt").unlink()
    with pytest.raises(GitError, match="without conflicts"):
        await containment.recover_escaped(repo, await located(repo, worktree), ["f.txt", "new.txt"])

    assert (repo / "f.txt").read_text() == "checkout\n"
    assert (repo / "new.txt").read_text() == "escaped\n"
    assert (worktree / "f.txt").read_text() == "worktree\n"
    assert status(worktree) == ""


async def test_recover_escaped_rejects_scopes_that_leave_or_cover_the_tree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    worktree = await _packet_worktree(repo, tmp_path)
    (repo / "README.md").write_text("user\n")
    for bad in (["."], ["../x"], ["/etc/passwd"], [""]):
        with pytest.raises(InvalidRequest):
            await containment.recover_escaped(repo, await located(repo, worktree), bad)
    with pytest.raises(InvalidRequest):
        await containment.recover_escaped(repo, rgit.GitLocation(repo / ".git", repo), ["README.md"])
    assert (repo / "README.md").read_text() == "user\n"


# --- integration --------------------------------------------------------------------------------


async def test_create_branch_is_idempotent_at_the_same_tip(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    base = await rgit.head(repo)
    await rgit.create_branch(repo, "orchestrate/r1/integration", base)
    await rgit.create_branch(repo, "orchestrate/r1/integration", base)
    assert git(repo, "rev-parse", "orchestrate/r1/integration").strip() == base
    other = commit_file(repo, "x.txt", "x\n")
    with pytest.raises(Conflict, match="already exists"):
        await rgit.create_branch(repo, "orchestrate/r1/integration", other)
    assert git(repo, "rev-parse", "orchestrate/r1/integration").strip() == base
    assert git(repo, "branch", "--show-current").strip() == "main"


@pytest.mark.slow
async def test_merge_into_merges_clean_branches_and_aborts_a_conflict(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    commit_file(repo, "shared.txt", "base\n")
    base = await rgit.head(repo)
    main_before = base

    async def packet(name: str, files: dict[str, str]) -> str:
        worktree = await _packet_worktree(repo, tmp_path, name)
        for path, content in files.items():
            (worktree / path).write_text(content)
        sha = await rgit.commit_all(worktree, name)
        assert sha is not None
        return f"orchestrate/r1/{name}"

    p1 = await packet("p1", {"shared.txt": "p1\n", "one.txt": "1\n"})
    p2 = await packet("p2", {"two.txt": "2\n"})
    p3 = await packet("p3", {"shared.txt": "p3\n"})

    await rgit.create_branch(repo, "orchestrate/r1/integration", base)
    integration = tmp_path / "worktrees" / "integration"
    await rgit.create_worktree(repo, integration, "orchestrate/r1/integration", None)

    first = await rgit.merge_into(repo, integration, p1, "Integrate p1")
    assert first.merged and first.conflicts == []
    assert first.commit == await rgit.head(integration)
    parents = git(integration, "log", "-1", "--format=%P|%s").strip()
    assert parents.split("|")[1] == "Integrate p1" and len(parents.split("|")[0].split()) == 2
    second = await rgit.merge_into(repo, integration, p2, "Integrate p2")
    assert second.merged and second.commit != first.commit
    assert (integration / "one.txt").read_text() == "1\n" and (integration / "two.txt").read_text() == "2\n"

    tip = await rgit.head(integration)
    third = await rgit.merge_into(repo, integration, p3, "Integrate p3")
    assert not third.merged and third.commit is None
    assert third.conflicts == ["shared.txt"]
    assert "<<<<<<<" in third.output and "p3" in third.output
    assert await rgit.head(integration) == tip
    assert status(integration) == ""
    assert (integration / "shared.txt").read_text() == "p1\n"

    # Merging an already merged branch changes nothing.
    again = await rgit.merge_into(repo, integration, p1, "Integrate p1 again")
    assert again.merged and again.commit == tip
    # The repository's main branch was never touched.
    assert await rgit.head(repo) == main_before
    assert git(repo, "branch", "--show-current").strip() == "main"


async def test_merge_into_refuses_the_main_checkout_and_main_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    worktree = await _packet_worktree(repo, tmp_path)
    (worktree / "x.txt").write_text("x\n")
    await rgit.commit_all(worktree, "x")
    with pytest.raises(InvalidRequest, match="own checkout"):
        await rgit.merge_into(repo, repo, "orchestrate/r1/p1", "no")
    git(repo, "checkout", "-q", "-b", "elsewhere")
    other = tmp_path / "worktrees" / "on-main"
    git(repo, "worktree", "add", "-q", str(other), "main")
    with pytest.raises(InvalidRequest, match="main branch"):
        await rgit.merge_into(repo, other, "orchestrate/r1/p1", "no")
    assert git(repo, "rev-parse", "main").strip() == git(repo, "rev-parse", "elsewhere").strip()


async def test_merge_into_refuses_a_dirty_integration_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    await _packet_worktree(repo, tmp_path, "p1")
    integration = await _packet_worktree(repo, tmp_path, "integration")
    (integration / "README.md").write_text("dirty\n")
    with pytest.raises(Conflict, match="uncommitted"):
        await rgit.merge_into(repo, integration, "orchestrate/r1/p1", "no")


# --- bundles ------------------------------------------------------------------------------------


async def test_bundle_round_trip_between_two_clones(tmp_path: Path) -> None:
    laptop = make_repo(tmp_path / "laptop")
    box = tmp_path / "box"
    git(tmp_path, "clone", "-q", str(laptop), str(box))
    base = await rgit.head(laptop)

    # Box side: a packet commits on its branch, bundles what the laptop lacks.
    worktree = tmp_path / "box-wt"
    await rgit.create_worktree(box, worktree, "orchestrate/r1/p1", base)
    (worktree / "feature.py").write_text("feature = True\n")
    result = await rgit.commit_all(worktree, "p1")
    assert result is not None
    assert not await rgit.has_commit(laptop, result)

    laptop_tips = await rgit.ref_tips(laptop)
    assert laptop_tips == [base]
    out = tmp_path / "p1.bundle"
    unknown = "0123456789abcdef0123456789abcdef01234567"
    assert await rgit.create_bundle(worktree, out, result, exclude=[*laptop_tips, unknown])
    assert out.is_file()
    assert "refs/peerd/bundle" not in git(box, "for-each-ref")  # the temporary ref is gone

    fetched = await rgit.fetch_bundle(laptop, out, "refs/heads/x")
    assert fetched == result
    assert await rgit.has_commit(laptop, result)
    assert git(laptop, "rev-parse", "x").strip() == result
    assert git(laptop, "branch", "--show-current").strip() == "main"
    # Fetching the same bundle again is fine; nothing is left to bundle once the laptop has it.
    assert await rgit.fetch_bundle(laptop, out, "refs/heads/x") == result
    assert not await rgit.create_bundle(worktree, tmp_path / "none.bundle", result, exclude=[result])
    assert not (tmp_path / "none.bundle").exists()

    # Laptop -> box: a base commit the box lacks.
    new_base = commit_file(laptop, "base.txt", "newer base\n")
    assert not await rgit.has_commit(box, new_base)
    base_bundle = tmp_path / "base.bundle"
    assert await rgit.create_bundle(laptop, base_bundle, new_base, exclude=await rgit.ref_tips(box))
    assert await rgit.fetch_bundle(box, base_bundle, f"refs/peerd/base/{new_base}") == new_base
    assert await rgit.has_commit(box, new_base)
    assert new_base in await rgit.ref_tips(box)


async def test_fetch_bundle_without_its_prerequisites_fails_clearly(tmp_path: Path) -> None:
    laptop = make_repo(tmp_path / "laptop")
    base = await rgit.head(laptop)
    tip = commit_file(laptop, "more.txt", "more\n")
    out = tmp_path / "more.bundle"
    assert await rgit.create_bundle(laptop, out, tip, exclude=[base])
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    git(stranger, "init", "-q", "-b", "main")
    commit_file(stranger, "other.txt", "unrelated history\n")
    assert not await rgit.has_commit(stranger, base)
    with pytest.raises(InvalidRequest, match="cannot be fetched"):
        await rgit.fetch_bundle(stranger, out, "refs/heads/x")
    assert "refs/heads/x" not in git(stranger, "for-each-ref")
    with pytest.raises(InvalidRequest):
        await rgit.fetch_bundle(laptop, out, "x")
    with pytest.raises(InvalidRequest):
        await rgit.create_bundle(laptop, out, tip, exclude=["--all"])


async def test_ref_tips_peel_annotated_tags(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    first = await rgit.head(repo)
    git(repo, "tag", "-a", "-m", "v1", "v1")
    second = commit_file(repo, "b.txt", "b\n")
    git(repo, "update-ref", "refs/remotes/origin/main", first)
    assert await rgit.ref_tips(repo) == sorted({first, second})


# --- verification commands ----------------------------------------------------------------------


async def test_run_check_passes_and_fails_with_combined_output(tmp_path: Path) -> None:
    passed = await checks.run_check(tmp_path, "echo out; echo err >&2; pwd")
    assert passed.passed and passed.exit_code == 0 and not passed.timed_out
    assert "out\nerr\n" in passed.output and str(tmp_path) in passed.output

    failed = await checks.run_check(tmp_path, "echo broken; exit 3")
    assert not failed.passed and failed.exit_code == 3 and failed.output == "broken\n"

    env = await checks.run_check(
        tmp_path, 'echo "$PEERD_TEST_VALUE" "${HOME:+home}"', env={"PEERD_TEST_VALUE": "v"}
    )
    assert env.output == "v home\n"


async def test_run_check_keeps_the_last_output(tmp_path: Path) -> None:
    result = await checks.run_check(
        tmp_path, "i=0; while [ $i -lt 3000 ]; do echo line-$i-padding; i=$((i+1)); done"
    )
    assert result.passed
    assert len(result.output) == 20_000
    assert result.output.endswith("line-2999-padding\n")


async def test_run_check_timeout_kills_the_group_promptly(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await checks.run_check(tmp_path, "echo started; sleep 5; echo never", timeout_s=0.3)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None and not result.passed
    assert result.output == "started\n"
    assert elapsed < 2.5 and result.seconds < 2.5


async def test_run_check_does_not_wait_for_background_processes(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await checks.run_check(tmp_path, "sleep 5 & echo done", timeout_s=10)
    assert result.passed and result.output == "done\n"
    assert time.monotonic() - started < 2.5
