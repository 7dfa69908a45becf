"""A hostile laptop steering the box's git: fake git dirs, hooks, filters, nested repositories,
scope grabbing, bad bundles and bundle floods.

Two real daemons ("laptop" linked to "box" at `auto-accept-edits`: edits only, no commands). The
laptop launches a scripted thread on the box through its link; the files its agent could then write
in its own worktree (a `.git` file pointing at a git dir it made, `.gitattributes`, a nested
repository) are written by the test into that worktree, so the attack does not depend on how the
run is confined. Then the laptop asks the box to commit (`POST /v1/threads/{id}/commit`) or sends
bundles (`POST /v1/projects/{id}/bundle`) exactly as its orchestrator would, with `Pair.remote`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peerd.errors import PeerdError
from peerd.orchestrate import transport
from tests.helpers import Pair, git, make_repo, script, two_daemons, wait_terminal

pytestmark = pytest.mark.slow  # two daemons


@dataclass
class Box:
    pair: Pair
    repo: Path  # the box owner's checkout
    project: dict[str, Any]
    markers: Path  # where a command git was tricked into running would leave its mark

    def marks(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())

    def touch(self, name: str) -> str:
        """A shell command that leaves the mark `name`, then copies stdin (usable as a filter)."""
        return f"sh -c 'touch {self.markers / name}; cat'"


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    async with two_daemons(tmp_path) as pair:
        repo = make_repo(tmp_path / "box-repo")
        project = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
        await pair.link("auto-accept-edits")
        markers = tmp_path / "markers"
        markers.mkdir()
        yield Box(pair, repo, project, markers)


async def link_thread(box: Box) -> tuple[str, Path]:
    """A thread the laptop starts on the box whose agent writes `work.txt`; (its id, its worktree)."""
    body = {
        "projectId": box.project["id"],
        "prompt": script({"write": {"path": "work.txt", "content": "the agent's work\n"}}),
    }
    launched = await box.pair.remote("POST", "/v1/threads", body=body)
    done = await wait_terminal(box.pair.bc, launched["threadId"], launched["runId"])
    assert done["status"] == "completed", done
    thread = await box.pair.bc.call("GET", f"/v1/threads/{launched['threadId']}")
    return str(launched["threadId"]), Path(thread["worktreePath"])


def fake_git_dir(worktree: Path, config: str) -> Path:
    """What the agent makes: a git dir of its own inside the worktree, and the worktree's `.git`
    file pointed at it."""
    fake = worktree / "fakegit"
    git(worktree, "init", "-q", "--bare", str(fake))
    with (fake / "config").open("a", encoding="utf-8") as handle:
        handle.write("[core]\n\tbare = false\n" + config)
    (worktree / ".git").write_text(f"gitdir: {fake}\n")
    return fake


async def commit(box: Box, thread_id: str, **extra: Any) -> dict[str, Any]:
    body = {"message": "the packet's work", **extra}
    result: dict[str, Any] = await box.pair.remote("POST", f"/v1/threads/{thread_id}/commit", body=body)
    return result


def assert_committed_in_the_real_repository(box: Box, thread_id: str, result: dict[str, Any]) -> None:
    assert result["created"] is True
    tip = git(box.repo, "rev-parse", f"refs/heads/peerd/{thread_id}").strip()
    assert result["commit"] == tip
    assert git(box.repo, "show", f"{tip}:work.txt") == "the agent's work\n"


# --- the worktree's `.git` is never followed ------------------------------------------------------


async def test_a_fake_git_dir_with_an_fsmonitor_is_never_used(box: Box) -> None:
    thread_id, worktree = await link_thread(box)
    fake = fake_git_dir(worktree, f'\tfsmonitor = "{box.touch("fsmonitor")}"\n')

    result = await commit(box, thread_id)

    assert box.marks() == []
    assert_committed_in_the_real_repository(box, thread_id, result)
    assert git(fake, "for-each-ref") == ""  # nothing went into the agent's git dir
    # The worktree's `.git` is put back as peerd recorded it.
    assert (worktree / ".git").read_text().strip().startswith(f"gitdir: {box.repo.resolve()}/.git/worktrees/")


async def test_hooks_in_a_fake_git_dir_or_its_hooks_path_never_run(box: Box) -> None:
    thread_id, worktree = await link_thread(box)
    hooks = worktree / "myhooks"
    fake = fake_git_dir(worktree, f"\thooksPath = {hooks}\n")
    for where in (fake / "hooks", hooks):
        where.mkdir(exist_ok=True)
        for name in ("pre-commit", "commit-msg", "post-commit", "reference-transaction", "post-index-change"):
            hook = where / name
            hook.write_text(f"#!/bin/sh\ntouch {box.markers}/{where.name}-{name}\n")
            hook.chmod(0o755)

    result = await commit(box, thread_id)

    assert box.marks() == []
    assert_committed_in_the_real_repository(box, thread_id, result)


async def test_a_gitattributes_filter_never_runs(box: Box) -> None:
    thread_id, worktree = await link_thread(box)
    # The filter's commands exist only in the agent's own git dir; its `.gitattributes` names it.
    fake_git_dir(
        worktree,
        f'[filter "evil"]\n\tclean = "{box.touch("clean")}"\n\tsmudge = "{box.touch("smudge")}"\n'
        f'\tprocess = "{box.touch("process")}"\n\trequired = true\n'
        f'[diff "evil"]\n\ttextconv = "{box.touch("textconv")}"\n',
    )
    (worktree / ".gitattributes").write_text("* filter=evil diff=evil\n")

    result = await commit(box, thread_id)
    bundle = await box.pair.remote("GET", f"/v1/threads/{thread_id}/bundle")

    assert box.marks() == []
    assert_committed_in_the_real_repository(box, thread_id, result)
    assert bundle["tip"] == result["commit"] and bundle["bundle"]


async def test_a_nested_repository_in_the_worktree_runs_nothing(box: Box) -> None:
    thread_id, worktree = await link_thread(box)
    # A repository of the agent's own inside its worktree, with its own config and attributes:
    # `git commit` (and `git status`) would run `git status` inside it, under that config.
    nested = worktree / "vendor"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "lib.txt").write_text("one\n")
    (nested / ".gitattributes").write_text("* filter=evil\n")
    git(nested, "add", "lib.txt", ".gitattributes")
    git(nested, "commit", "-q", "-m", "nested")
    with (nested / ".git" / "config").open("a", encoding="utf-8") as handle:
        handle.write(
            f'[core]\n\tfsmonitor = "{box.touch("nested-fsmonitor")}"\n'
            f'[filter "evil"]\n\tclean = "{box.touch("nested-clean")}"\n'
        )
    (nested / "lib.txt").write_text("two\n")  # a change inside the nested repository's work tree
    (worktree / ".gitmodules").write_text(
        '[submodule "vendor"]\n\tpath = vendor\n\turl = ./vendor\n\tignore = none\n'
    )

    first = await commit(box, thread_id)
    (nested / "lib.txt").write_text("six\n")  # same size: git would re-read it through the filter
    second = await commit(box, thread_id)

    assert box.marks() == []
    assert_committed_in_the_real_repository(box, thread_id, first)
    assert second["created"] is False  # the nested repository's own changes are not the thread's


# --- a commit takes only the thread's worktree ----------------------------------------------------


async def test_a_commit_with_a_scope_is_refused_and_the_owners_work_stays(box: Box) -> None:
    thread_id, worktree = await link_thread(box)
    (box.repo / "README.md").write_text("# demo\n\nthe owner's uncommitted edit\n")
    (box.repo / "notes.txt").write_text("the owner's untracked notes\n")
    before = git(box.repo, "status", "--porcelain")

    with pytest.raises(PeerdError) as err:
        await commit(box, thread_id, scope=["README.md", "notes.txt"])

    assert err.value.code == "capability_denied"
    assert "scope" in err.value.message
    assert git(box.repo, "status", "--porcelain") == before == " M README.md\n?? notes.txt\n"
    assert (box.repo / "notes.txt").read_text() == "the owner's untracked notes\n"
    assert not (worktree / "notes.txt").exists()
    assert (worktree / "README.md").read_text() == "# demo\n"
    # Nothing was committed, so the bundle route has nothing of the owner's to hand over.
    assert git(box.repo, "rev-parse", f"peerd/{thread_id}") == git(box.repo, "rev-parse", "main")


# --- bundle uploads -------------------------------------------------------------------------------


@dataclass
class Laptop:
    repo: Path
    base: str  # a commit the box has
    tip: str  # a commit on top of `base` the box lacks


def laptop_clone(box: Box, tmp_path: Path) -> Laptop:
    repo = tmp_path / "laptop-repo"
    git(tmp_path, "clone", "-q", str(box.repo), str(repo))
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "big.bin").write_bytes(os.urandom(30_000))
    git(repo, "add", "big.bin")
    git(repo, "commit", "-q", "-m", "unpushed")
    return Laptop(repo, base, git(repo, "rev-parse", "HEAD").strip())


def bundle_of(repo: Path, out: Path, tip: str, *exclude: str) -> str:
    """base64 of a bundle of `tip` (under a branch: a bundle's heads are refs) minus `exclude`."""
    git(repo, "branch", "-f", out.stem, tip)
    git(repo, "bundle", "create", "-q", str(out), out.stem, *(f"^{e}" for e in exclude))
    return base64.b64encode(out.read_bytes()).decode("ascii")


def box_state(box: Box) -> tuple[str, list[str]]:
    """The box's refs and every file in its object store (what a bad bundle must not change)."""
    objects = box.repo / ".git" / "objects"
    files = sorted(str(p.relative_to(objects)) for p in objects.rglob("*") if p.is_file())
    return git(box.repo, "for-each-ref"), files


async def upload(box: Box, bundle: str, tip: str) -> dict[str, Any]:
    path = f"/v1/projects/{box.project['id']}/bundle"
    result: dict[str, Any] = await box.pair.remote("POST", path, body={"bundle": bundle, "tip": tip})
    return result


async def test_bad_bundles_are_refused_with_400_and_store_nothing(box: Box, tmp_path: Path) -> None:
    laptop = laptop_clone(box, tmp_path)
    # A commit whose parent the box lacks too: a bundle of it alone has a missing prerequisite.
    (laptop.repo / "more.txt").write_text("more\n")
    git(laptop.repo, "add", "more.txt")
    git(laptop.repo, "commit", "-q", "-m", "more")
    newer = git(laptop.repo, "rev-parse", "HEAD").strip()
    good = bundle_of(laptop.repo, tmp_path / "good.bundle", laptop.tip, laptop.base)
    raw = bytearray(base64.b64decode(good))
    start = raw.find(b"PACK")
    for i in range(start + 64, min(len(raw) - 32, start + 4000)):
        raw[i] ^= 0x5A
    damaged = base64.b64encode(bytes(raw)).decode("ascii")
    cases = {  # what is sent, the tip announced, and what the refusal says
        "not base64": ("@@ not base64 @@", laptop.tip, "not valid base64"),
        "not a bundle": (
            base64.b64encode(b"just some bytes\n" * 10).decode("ascii"),
            laptop.tip,
            "not a git bundle",
        ),
        "another head": (good, newer, "not the announced"),
        "missing prerequisites": (
            bundle_of(laptop.repo, tmp_path / "p.bundle", newer, laptop.tip),
            newer,
            "needs commits this repository does not have",
        ),
        "damaged objects": (damaged, laptop.tip, "damaged"),
    }
    before = box_state(box)
    for what, (bundle, tip, says) in cases.items():
        with pytest.raises(PeerdError) as err:
            await upload(box, bundle, tip)
        assert err.value.code == "invalid_request", (what, err.value.code, err.value.message)
        assert says in err.value.message, (what, err.value.message)
        assert box_state(box) == before, what
    # The good bundle is stored under refs/peerd/base/<tip>, and only it.
    assert (await upload(box, good, laptop.tip))["commit"] == laptop.tip
    assert git(box.repo, "rev-parse", f"refs/peerd/base/{laptop.tip}").strip() == laptop.tip


async def test_bundle_uploads_have_a_quota_per_link(
    box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "BUNDLE_UPLOADS_PER_DAY", 3)
    laptop = laptop_clone(box, tmp_path)
    junk = base64.b64encode(b"junk").decode("ascii")
    for _ in range(3):  # failed uploads count too: each cost the box the work of checking it
        with pytest.raises(PeerdError) as err:
            await upload(box, junk, laptop.tip)
        assert err.value.code == "invalid_request"
    good = bundle_of(laptop.repo, tmp_path / "good.bundle", laptop.tip, laptop.base)
    with pytest.raises(PeerdError) as err:
        await upload(box, good, laptop.tip)
    assert err.value.code == "payload_too_large"
    assert "quota" in err.value.message
    assert "refs/peerd/base" not in git(box.repo, "for-each-ref")
    # The box's owner is not counted against any link.
    path = f"/v1/projects/{box.project['id']}/bundle"
    stored = await box.pair.bc.call("POST", path, body={"bundle": good, "tip": laptop.tip})
    assert stored["commit"] == laptop.tip


async def test_bundle_bytes_have_a_quota_per_link(
    box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "BUNDLE_BYTES_PER_DAY", 20_000)
    laptop = laptop_clone(box, tmp_path)  # its bundle holds 30,000 random bytes
    good = bundle_of(laptop.repo, tmp_path / "good.bundle", laptop.tip, laptop.base)
    with pytest.raises(PeerdError) as err:
        await upload(box, good, laptop.tip)
    assert err.value.code == "payload_too_large"
    assert "refs/peerd/base" not in git(box.repo, "for-each-ref")
