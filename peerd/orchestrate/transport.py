"""Moving commits between a laptop and a box through the link, for orchestration packets.

A packet that runs on a box starts from the laptop's exact base commit, which the box may not
have (unpushed work): the laptop asks for the box's ref tips, bundles `base --not <tips it also
has>` and uploads it. When the packet's run ends, the box commits the worktree on the packet's
branch and the laptop downloads `branch --not base` as a bundle and fetches it into its own
repository under the same branch name. Bundles travel base64 in JSON, inside the API's body limit.

The box side enforces the link fence (a link may commit or read only threads it started) through
`Operations`; reading a project's tips or receiving a base bundle needs write access.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from peerd import contracts as c
from peerd.core.access import require_write
from peerd.errors import InvalidRequest, PayloadTooLarge
from peerd.operations import Caller, Operations
from peerd.orchestrate import gitops
from peerd.store import projects, threads

# Base64 inflates by 4/3: this keeps a bundle inside the API's 2 MiB body limit.
MAX_BUNDLE_BYTES = 1_400_000


class ThreadCommit(c.Input):
    message: str = Field(min_length=1, max_length=2000)
    # The packet's files: edits a coder left in this machine's own checkout of the project, inside
    # this scope only, are moved into the thread's worktree before the commit (containment).
    scope: list[str] = Field(default_factory=list, max_length=500)


class ThreadCommitResult(c.Wire):
    thread_id: str
    branch: str | None
    base_commit: str | None
    commit: str | None  # the branch tip after committing (the base when nothing changed)
    created: bool  # whether a new commit was made
    recovered: list[str] = Field(default_factory=list)  # paths moved in from the project's checkout


class BundleData(c.Wire):
    tip: str | None
    bundle: str | None  # base64 of a git bundle; None when there is nothing to send


class ProjectTips(c.Wire):
    tips: list[str]


class BundleUpload(c.Input):
    bundle: str = Field(min_length=1)
    tip: str = Field(pattern=r"^[0-9a-f]{40,64}$")


class BundleReceived(c.Wire):
    commit: str


def _encode(path: Path) -> str:
    data = path.read_bytes()
    if len(data) > MAX_BUNDLE_BYTES:
        raise PayloadTooLarge(
            f"The commits to send are {len(data)} bytes, over {MAX_BUNDLE_BYTES}: push the base commit to "
            "the shared origin and fetch it on the other machine first."
        )
    return base64.b64encode(data).decode("ascii")


class GitTransport:
    """Both ends: the box serves `commit`, `bundle`, `tips`, `receive`; the laptop calls them."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops

    # --- box side -----------------------------------------------------------------------------

    async def _own_thread(self, caller: Caller, thread_id: str, what: str) -> c.Thread:
        thread = await threads.get_thread(self.ops.db, thread_id)
        await self.ops.check_can_change(caller, thread, what)
        if thread.in_place or not thread.branch:
            raise InvalidRequest(
                f"Thread {thread_id} works in the checkout itself; it has no branch to send."
            )
        return thread

    async def commit(self, caller: Caller, thread_id: str, req: ThreadCommit) -> ThreadCommitResult:
        thread = await self._own_thread(caller, thread_id, "commit a thread's work")
        worktree = Path(thread.worktree_path)
        recovered: list[str] = []
        if req.scope:
            checkout = Path((await projects.get(self.ops.db, thread.project_id)).path)
            if await gitops.dirty_paths(checkout):
                recovered = await gitops.recover_escaped(checkout, worktree, req.scope)
        created = await gitops.commit_all(worktree, req.message)
        tip = created or await gitops.head(worktree)
        return ThreadCommitResult(
            thread_id=thread.id,
            branch=thread.branch,
            base_commit=thread.base_commit,
            commit=tip,
            created=created is not None,
            recovered=recovered,
        )

    async def bundle(self, caller: Caller, thread_id: str) -> BundleData:
        thread = await self._own_thread(caller, thread_id, "read a thread's commits")
        worktree = Path(thread.worktree_path)
        tip = await gitops.head(worktree)
        exclude = [thread.base_commit] if thread.base_commit else []
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            out = Path(scratch) / "b.bundle"
            if not await gitops.create_bundle(worktree, out, tip, exclude=exclude):
                return BundleData(tip=tip, bundle=None)
            return BundleData(tip=tip, bundle=_encode(out))

    async def tips(self, caller: Caller, project_id: str) -> ProjectTips:
        if caller.link is not None:
            require_write(caller.link.access, "exchange commits")
        project = await projects.get(self.ops.db, project_id)
        return ProjectTips(tips=await gitops.ref_tips(Path(project.path)))

    async def receive(self, caller: Caller, project_id: str, req: BundleUpload) -> BundleReceived:
        if caller.link is not None:
            require_write(caller.link.access, "send commits")
        project = await projects.get(self.ops.db, project_id)
        repo = Path(project.path)
        if await gitops.has_commit(repo, req.tip):
            return BundleReceived(commit=req.tip)
        try:
            data = base64.b64decode(req.bundle, validate=True)
        except ValueError:
            raise InvalidRequest("bundle: not valid base64.") from None
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            path = Path(scratch) / "in.bundle"
            path.write_bytes(data)
            # Kept under refs/peerd/ so worktrees can start from it and git gc keeps it.
            commit = await gitops.fetch_bundle(repo, path, f"refs/peerd/base/{req.tip}")
        if commit != req.tip:
            raise InvalidRequest(f"The bundle's head is {commit}, not the announced {req.tip}.")
        return BundleReceived(commit=commit)

    # --- laptop side --------------------------------------------------------------------------

    async def send_base(self, env_id: str, remote_project: str, repo: Path, base: str) -> None:
        """Make sure the box's checkout has `base` (upload the missing commits when not)."""
        known: dict[str, Any] = await self.ops.forward_raw(
            env_id, "GET", f"/v1/projects/{remote_project}/tips"
        )
        theirs = [sha for sha in known.get("tips", []) if isinstance(sha, str)]
        if base in theirs:
            return
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            out = Path(scratch) / "base.bundle"
            if not await gitops.create_bundle(repo, out, base, exclude=theirs):
                return  # the box has everything below base already (reachable from its tips)
            body = {"bundle": _encode(out), "tip": base}
            await self.ops.forward_raw(env_id, "POST", f"/v1/projects/{remote_project}/bundle", body=body)

    async def fetch_result(
        self, env_id: str, thread_id: str, repo: Path, branch: str, message: str, scope: list[str]
    ) -> tuple[str | None, list[str]]:
        """Commit the box thread's work (after containment there, in `scope`) and fetch its branch
        here; (the tip, the paths recovered from the box's own checkout)."""
        body = {"message": message, "scope": scope}
        committed = ThreadCommitResult.model_validate(
            await self.ops.forward_raw(env_id, "POST", f"/v1/threads/{thread_id}/commit", body=body)
        )
        data = BundleData.model_validate(
            await self.ops.forward_raw(env_id, "GET", f"/v1/threads/{thread_id}/bundle")
        )
        if data.bundle is None:
            return committed.base_commit, committed.recovered
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            path = Path(scratch) / "result.bundle"
            path.write_bytes(base64.b64decode(data.bundle))
            tip = await gitops.fetch_bundle(repo, path, f"refs/heads/{branch}")
        return tip, committed.recovered
