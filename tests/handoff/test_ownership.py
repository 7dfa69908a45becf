"""A move's landing asks the ownership ledger (issue 26, case 4): a write link moves only a branch
its own work made there, or takes a new name; an orchestration's branch and a branch the owner
made by hand are left exactly as they are, the moved work kept beside and the answer naming whose
the branch is. Real daemons on loopback, the link at `approval-required`, as in the report."""

from __future__ import annotations

from pathlib import Path

from peerd.orchestrate import store as ostore
from peerd.store import ownership
from tests.helpers import git, script, wait_terminal
from tests.support.handoff import linked


def _child_of(repo: Path, tip: str, message: str) -> str:
    """A commit on top of `tip` in `repo`, as if a link had sent it in a bundle."""
    tree = git(repo, "rev-parse", f"{tip}^{{tree}}").strip()
    return git(repo, "commit-tree", "-p", tip, "-m", message, tree).strip()


async def test_a_write_link_moves_only_what_its_own_work_made(tmp_path: Path) -> None:
    async with linked(tmp_path, access="approval-required") as pair:
        assert pair.box.db is not None and pair.laptop.peers is not None
        box_repo = tmp_path / "box-repo"
        box_project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]["id"]
        main = git(box_repo, "rev-parse", "HEAD").strip()
        # An orchestration of the box's owner, its integration branch made (as integrate.py does).
        run = await ostore.create(
            pair.box.db, project_id=box_project, task="t", request={}, base_commit=main, now=1.0
        )
        git(box_repo, "branch", run.branch, main)
        # A branch the owner made by hand, under the prefix a moved thread's branch may have.
        git(box_repo, "branch", "peerd/owner-feature", main)
        path = f"/v1/projects/{box_project}/moved-branch"

        async def land(branch: str, tip: str, n: int) -> dict[str, object]:
            body = {"moveId": f"mov_{n:020x}", "branch": branch, "tip": tip}
            assert pair.laptop.peers is not None
            answer: dict[str, object] = await pair.laptop.peers.call(pair.box_id, "POST", path, body=body)
            return answer

        for n, (branch, owner) in enumerate(
            [(run.branch, f"the orchestration {run.id}"), ("peerd/owner-feature", "this machine's owner")]
        ):
            child = _child_of(box_repo, main, f"uploaded onto {branch}")
            landed = await land(branch, child, n)
            assert landed["outcome"] == "not-yours", landed
            assert landed["branch"] is None and landed["owner"] == owner
            assert git(box_repo, "rev-parse", branch).strip() == main, f"{branch} moved"
            assert landed["keptRef"] == f"refs/peerd/moved/mov_{n:020x}"
            assert git(box_repo, "rev-parse", str(landed["keptRef"])).strip() == child
            kept = await ownership.owner_of(pair.box.db, box_project, "ref", str(landed["keptRef"]))
            assert kept is not None and kept.owner.kind == "link"

        # The link's own thread's branch there is the link's: it fast-forwards.
        launched = await pair.laptop.peers.call(
            pair.box_id,
            "POST",
            "/v1/threads",
            body={"projectId": box_project, "prompt": script({"reply": "x"})},
        )
        await wait_terminal(pair.bc, launched["threadId"])
        archive = f"/v1/threads/{launched['threadId']}/archive"
        await pair.laptop.peers.call(pair.box_id, "POST", archive, body={})  # its worktree goes
        own = f"peerd/{launched['threadId']}"
        tip = git(box_repo, "rev-parse", own).strip()
        child = _child_of(box_repo, tip, "the link's own work")
        landed = await land(own, child, 10)
        assert landed["outcome"] == "fast-forward", landed
        assert git(box_repo, "rev-parse", own).strip() == child
        # A new name is the link's to take (the thread there is launched on it).
        landed = await land("peerd/brand-new", _child_of(box_repo, main, "new"), 11)
        assert landed["outcome"] == "absent" and landed["branch"] == "peerd/brand-new"


async def test_a_links_commit_never_lands_on_a_branch_its_agent_checked_out(tmp_path: Path) -> None:
    """The commit transport (`POST /v1/threads/{id}/commit`) takes the thread's worktree onto the
    thread's own branch only: an agent that checked out the owner's branch in its worktree gets
    nothing committed onto it, nor read from it (`GET .../bundle`)."""
    async with linked(tmp_path, access="auto") as pair:
        assert pair.laptop.peers is not None
        box_repo = tmp_path / "box-repo"
        box_project = (await pair.bc.call("GET", "/v1/projects"))["items"][0]["id"]
        main = git(box_repo, "rev-parse", "HEAD").strip()
        git(box_repo, "branch", "peerd/owner-feature", main)
        launched = await pair.laptop.peers.call(
            pair.box_id,
            "POST",
            "/v1/threads",
            body={"projectId": box_project, "prompt": script({"reply": "x"})},
        )
        thread = await wait_terminal(pair.bc, launched["threadId"])
        shown = await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}")
        worktree = Path(shown["worktreePath"])
        git(worktree, "checkout", "-q", "peerd/owner-feature")  # what a hostile agent could do
        (worktree / "README.md").write_text("taken\n", encoding="utf-8")
        for method, path, body in (
            ("POST", f"/v1/threads/{launched['threadId']}/commit", {"message": "take it"}),
            ("GET", f"/v1/threads/{launched['threadId']}/bundle", None),
        ):
            try:
                await pair.laptop.peers.call(pair.box_id, method, path, body=body)
            except Exception as exc:  # the typed refusal is checked below
                assert getattr(exc, "code", None) == "not_yours", exc
            else:
                raise AssertionError(f"{method} {path} was answered")
        assert git(box_repo, "rev-parse", "peerd/owner-feature").strip() == main, thread
