"""What a snapshot takes of each kind of worktree state (`peerd.runtime.git.content_tree`):
the files' bytes, whatever the index's flags or stat data say."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from peerd.handoff.gitwork import snapshot
from peerd.runtime import git as rgit
from peerd.runtime.git import GitLocation, commit_all
from tests.helpers import GIT_ENV, git
from tests.support.handoff import loc_git, project, tree_files


async def worktree(repo: Path, tmp: Path, name: str = "wt") -> GitLocation:
    await rgit.create_worktree(repo, tmp / name, f"peerd/{name}", "HEAD")
    return await rgit.locate_worktree(repo, tmp / name)


async def taken(repo: Path, where: GitLocation) -> dict[str, tuple[str, bytes]]:
    commit, _ = await snapshot(where, move_id=f"mov_{os.urandom(4).hex()}", message="m")
    return tree_files(repo, commit)


async def test_an_assume_unchanged_file_is_read_anyway(tmp_path: Path) -> None:
    repo = project(tmp_path)
    where = await worktree(repo, tmp_path)
    loc_git(where, "update-index", "--assume-unchanged", "calc.py")
    (where.work_tree / "calc.py").write_text("a * b * c\n")
    assert (await taken(repo, where))["calc.py"] == ("100644", b"a * b * c\n")


async def test_a_skip_worktree_entry_absent_from_disk_is_kept(tmp_path: Path) -> None:
    repo = project(tmp_path)
    where = await worktree(repo, tmp_path)
    loc_git(where, "update-index", "--skip-worktree", "calc.py")
    (where.work_tree / "calc.py").unlink()  # what a sparse checkout leaves out
    (where.work_tree / "README.md").write_text("# edited\n")
    files = await taken(repo, where)
    assert files["calc.py"] == ("100644", b"a - b\n")
    assert files["README.md"] == ("100644", b"# edited\n")


async def test_a_conflicted_file_is_taken_as_the_worktree_holds_it(tmp_path: Path) -> None:
    repo = project(tmp_path)
    git(repo, "switch", "-q", "-c", "other")
    (repo / "calc.py").write_text("a / b\n")
    git(repo, "commit", "-q", "-am", "other")
    git(repo, "switch", "-q", "main")
    where = await worktree(repo, tmp_path)
    (where.work_tree / "calc.py").write_text("a % b\n")
    loc_git(where, "commit", "-q", "-am", "mine")
    merged = subprocess.run(
        ["git", f"--git-dir={where.git_dir}", f"--work-tree={where.work_tree}", "merge", "-q", "other"],
        cwd=where.work_tree,
        capture_output=True,
        check=False,
        env={**os.environ, **GIT_ENV},
    )
    assert merged.returncode == 1  # a conflict: stages 1-3 in the index
    on_disk = (where.work_tree / "calc.py").read_bytes()
    assert b"<<<<<<<" in on_disk
    assert (await taken(repo, where))["calc.py"] == ("100644", on_disk)


async def test_a_worktree_without_an_index_starts_from_head(tmp_path: Path) -> None:
    repo = project(tmp_path)
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "kept.log").write_text("tracked although ignored\n")
    git(repo, "add", "-f", ".gitignore", "kept.log")
    git(repo, "commit", "-q", "-m", "ignored but tracked")
    where = await worktree(repo, tmp_path)
    (where.git_dir / "index").unlink()
    (where.work_tree / "calc.py").write_text("a + b\n")
    (where.work_tree / "new.log").write_text("ignored\n")
    files = await taken(repo, where)
    assert files["calc.py"] == ("100644", b"a + b\n")
    assert files["kept.log"] == ("100644", b"tracked although ignored\n")
    assert "new.log" not in files


async def test_a_nested_repository_is_its_commit_and_staged_work_is_taken(tmp_path: Path) -> None:
    repo = project(tmp_path)
    where = await worktree(repo, tmp_path)
    nested = where.work_tree / "vendor"
    nested.mkdir()
    git(nested, "init", "-q", "-b", "main")
    (nested / "lib.py").write_text("x = 1\n")
    git(nested, "add", "lib.py")
    git(nested, "commit", "-q", "-m", "lib")
    (nested / "lib.py").write_text("x = 2\n")  # its own uncommitted edit stays its own
    (where.work_tree / "staged.txt").write_text("staged\n")
    (where.work_tree / "gone.txt").write_text("staged, then deleted\n")
    loc_git(where, "add", "staged.txt", "gone.txt")
    (where.work_tree / "gone.txt").unlink()
    (where.work_tree / "calc.py").write_text("a + b\n")
    loc_git(where, "add", "calc.py")  # staged only: the worktree holds the same
    listing = loc_git(where, "ls-tree", "HEAD")  # before
    files = await taken(repo, where)
    assert files["vendor"] == ("160000", git(nested, "rev-parse", "HEAD").strip().encode())
    assert "vendor/lib.py" not in files
    assert files["staged.txt"] == ("100644", b"staged\n")
    assert files["calc.py"] == ("100644", b"a + b\n")
    assert "gone.txt" not in files
    assert loc_git(where, "ls-tree", "HEAD") == listing  # the branch did not move


async def test_commit_all_sets_the_index_to_the_commit_and_keeps_unchanged_stat_data(tmp_path: Path) -> None:
    repo = project(tmp_path)
    where = await worktree(repo, tmp_path)
    loc_git(where, "update-index", "--refresh")
    before = loc_git(where, "ls-files", "--debug", "--", "README.md")
    (where.work_tree / "calc.py").write_text("a + b + c\n")
    (where.work_tree / "new.txt").write_text("new\n")
    sha = await commit_all(where, "work")
    assert sha is not None
    assert loc_git(where, "status", "--porcelain") == ""
    assert loc_git(where, "ls-files", "--debug", "--", "README.md") == before
    assert await commit_all(where, "nothing more") is None
