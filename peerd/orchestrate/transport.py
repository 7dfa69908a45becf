"""Moving commits between a laptop and a box through the link, for orchestration packets.

A packet that runs on a box starts from the laptop's exact base commit, which the box may not
have (unpushed work): the laptop asks for the box's ref tips, bundles `base --not <tips it also
has>` and uploads it. When the packet's run ends, the box commits the worktree on the packet's
branch and the laptop downloads `branch --not base` as a bundle and fetches it into its own
repository under the same branch name. Bundles travel base64 in JSON, inside the API's body limit.

The box side enforces the link fence (a link may commit or read only threads it started) through
`Operations`; reading a project's tips or receiving a base bundle needs write access. A commit takes
only the thread's own worktree, through its recorded git dir (`locate_worktree`): nothing is moved
in from the box owner's checkout on request (a `scope` is refused), and the worktree's own `.git`
file, which its agent could rewrite, is never followed.

Base bundles from a link are counted against a quota per link (`BundleQuota`: at most
`BUNDLE_UPLOADS_PER_DAY` uploads and `BUNDLE_BYTES_PER_DAY` decoded bytes in any 24 hours; kept in
memory, so a restart of the box starts afresh, which a link cannot cause). A bad bundle (not base64,
not a bundle, another head than the announced tip, prerequisites the box lacks, damaged objects)
answers 400 `invalid_request` and stores nothing: no ref and no objects (see `fetch_bundle`).
"""

from __future__ import annotations

import base64
import contextlib
import tempfile
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from pydantic import Field

from peerd import contracts as c
from peerd.core.access import require_write
from peerd.core.ownership import Owner, orchestration_of_branch
from peerd.core.text import path_segment
from peerd.errors import CapabilityDenied, InvalidRequest, NotYours, PayloadTooLarge
from peerd.operations import Caller, Operations
from peerd.runtime import git
from peerd.store import ownership, projects, threads

# Base64 inflates by 4/3: this keeps a bundle inside the API's 2 MiB body limit.
MAX_BUNDLE_BYTES = 1_400_000
# Per link, in any QUOTA_WINDOW_S: an orchestration sends one base bundle per packet on a new base.
BUNDLE_UPLOADS_PER_DAY = 200
BUNDLE_BYTES_PER_DAY = 64 * 1024 * 1024
QUOTA_WINDOW_S = 86_400.0


class ThreadCommit(c.Input):
    message: str = Field(min_length=1, max_length=2000)
    # Refused when not empty: it once named files to move in from this machine's own checkout,
    # which let a link take the owner's uncommitted work. Kept so the refusal is a typed one.
    scope: list[str] = Field(default_factory=list, max_length=500)


class ThreadCommitResult(c.Wire):
    thread_id: str
    branch: str | None
    base_commit: str | None
    commit: str | None  # the branch tip after committing (the base when nothing changed)
    created: bool  # whether a new commit was made


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


class BundleQuota:
    """Base-bundle uploads per link in a rolling window: (time, decoded bytes) of each upload."""

    def __init__(self) -> None:
        self._used: dict[str, deque[tuple[float, int]]] = {}

    def charge(self, client_id: str, label: str, size: int, now: float) -> None:
        used = self._used.setdefault(client_id, deque())
        while used and used[0][0] <= now - QUOTA_WINDOW_S:
            used.popleft()
        total = sum(n for _, n in used)
        if len(used) >= BUNDLE_UPLOADS_PER_DAY or total + size > BUNDLE_BYTES_PER_DAY:
            raise PayloadTooLarge(
                f"The link {label!r} is over its bundle quota ({BUNDLE_UPLOADS_PER_DAY} uploads and "
                f"{BUNDLE_BYTES_PER_DAY} bytes in 24 hours; used {len(used)} and {total}): push the "
                "base commits to the shared origin and fetch them on this machine, or wait."
            )
        used.append((now, size))


# One quota per daemon (its Operations), shared by the socket and the network listener.
_QUOTAS: weakref.WeakKeyDictionary[Operations, BundleQuota] = weakref.WeakKeyDictionary()


def _decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidRequest(f"{what}: not valid base64.") from None


class GitTransport:
    """Both ends: the box serves `commit`, `bundle`, `tips`, `receive`; the laptop calls them."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self.quota = _QUOTAS.setdefault(ops, BundleQuota())

    # --- box side -----------------------------------------------------------------------------

    async def _own_thread(self, caller: Caller, thread_id: str, what: str) -> c.Thread:
        thread = await threads.get_thread(self.ops.db, thread_id)
        await self.ops.check_can_change(caller, thread, what)
        if thread.in_place or not thread.branch:
            raise InvalidRequest(
                f"Thread {thread_id} works in the checkout itself; it has no branch to send."
            )
        return thread

    async def _location(self, thread: c.Thread) -> git.GitLocation:
        """The thread's worktree as peerd recorded it (never its own `.git` file), still on the
        thread's own branch: an agent that checked out another branch in its worktree (the
        owner's, another thread's) gets nothing committed onto it or read from it."""
        project = await projects.get(self.ops.db, thread.project_id)
        where = await git.locate_worktree(Path(project.path), Path(thread.worktree_path))
        on = await git.current_branch(where)
        if on != thread.branch:
            raise NotYours(
                f"Thread {thread.id}'s worktree is on {on or 'a detached HEAD'}, not on its own branch "
                f"{thread.branch}: peerd commits and sends only the thread's own branch. Check the branch "
                "out again in the worktree, or start a new thread."
            )
        return where

    async def commit(self, caller: Caller, thread_id: str, req: ThreadCommit) -> ThreadCommitResult:
        if req.scope:
            raise CapabilityDenied(
                "A commit takes only the thread's own worktree: peerd does not move files in from "
                "this machine's checkout on request. Send the commit without `scope`."
            )
        thread = await self._own_thread(caller, thread_id, "commit a thread's work")
        worktree = await self._location(thread)
        created = await git.commit_all(worktree, req.message)
        tip = created or await git.head(worktree)
        return ThreadCommitResult(
            thread_id=thread.id,
            branch=thread.branch,
            base_commit=thread.base_commit,
            commit=tip,
            created=created is not None,
        )

    async def bundle(self, caller: Caller, thread_id: str) -> BundleData:
        thread = await self._own_thread(caller, thread_id, "read a thread's commits")
        worktree = await self._location(thread)
        tip = await git.head(worktree)
        exclude = [thread.base_commit] if thread.base_commit else []
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            out = Path(scratch) / "b.bundle"
            if not await git.create_bundle(worktree, out, tip, exclude=exclude):
                return BundleData(tip=tip, bundle=None)
            return BundleData(tip=tip, bundle=_encode(out))

    async def tips(self, caller: Caller, project_id: str) -> ProjectTips:
        if caller.link is not None:
            require_write(caller.link.access, "exchange commits")
        project = await projects.get(self.ops.db, project_id)
        return ProjectTips(tips=await git.ref_tips(await git.checkout_location(Path(project.path))))

    async def receive(self, caller: Caller, project_id: str, req: BundleUpload) -> BundleReceived:
        if caller.link is not None:
            require_write(caller.link.access, "send commits")
        project = await projects.get(self.ops.db, project_id)
        # The checkout's own `.git` directory: an in-place thread's agent works in this checkout.
        repo = await git.checkout_location(Path(project.path))
        if await git.has_commit(repo, req.tip):
            return BundleReceived(commit=req.tip)
        data = _decode(req.bundle, "bundle")
        if len(data) > MAX_BUNDLE_BYTES:
            raise PayloadTooLarge(f"The bundle is {len(data)} bytes, over {MAX_BUNDLE_BYTES}.")
        if caller.link is not None:
            self.quota.charge(caller.link.client_id, caller.link.label, len(data), self.ops.clock())
        into = f"refs/peerd/base/{req.tip}"
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            path = Path(scratch) / "in.bundle"
            path.write_bytes(data)
            # Kept under refs/peerd/ so worktrees can start from it and git gc keeps it.
            commit = await git.fetch_bundle(repo, path, into, expect=req.tip)
        # Recorded once it exists (a refused bundle changes nothing, the ledger included): named by
        # its commit, it never moves; the first to send it is recorded, later ones are fine.
        uploader = Owner.person() if caller.link is None else Owner.link(caller.link.client_id)
        with contextlib.suppress(NotYours):
            await ownership.claim_one(
                self.ops.db,
                project_id=project.id,
                holding="ref",
                name=into,
                owner=uploader,
                purpose="base",
                now=self.ops.clock(),
            )
        return BundleReceived(commit=commit)

    # --- laptop side --------------------------------------------------------------------------

    async def send_base(self, env_id: str, remote_project: str, repo: Path, base: str) -> None:
        """Make sure the box's checkout has `base` (upload the missing commits when not)."""
        known: dict[str, Any] = await self.ops.forward_raw(
            env_id, "GET", f"/v1/projects/{path_segment(remote_project)}/tips"
        )
        theirs = [sha for sha in known.get("tips", []) if isinstance(sha, str)]
        if base in theirs:
            return
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            out = Path(scratch) / "base.bundle"
            if not await git.create_bundle(repo, out, base, exclude=theirs):
                return  # the box has everything below base already (reachable from its tips)
            body = {"bundle": _encode(out), "tip": base}
            await self.ops.forward_raw(
                env_id, "POST", f"/v1/projects/{path_segment(remote_project)}/bundle", body=body
            )

    async def fetch_result(
        self, env_id: str, thread_id: str, repo: Path, branch: str, message: str
    ) -> str | None:
        """Commit the box thread's worktree (only it: the box moves nothing in from its own
        checkout) and fetch its branch here; the tip (the base when nothing changed). The branch
        here (`orchestrate/<run>/<packet>`) is the orchestration's by the ledger, recorded before
        anything is fetched into it: a branch of that name someone else owns is refused."""
        await self._claim_packet_branch(repo, branch)
        body = {"message": message}
        committed = ThreadCommitResult.model_validate(
            await self.ops.forward_raw(
                env_id, "POST", f"/v1/threads/{path_segment(thread_id)}/commit", body=body
            )
        )
        data = BundleData.model_validate(
            await self.ops.forward_raw(env_id, "GET", f"/v1/threads/{path_segment(thread_id)}/bundle")
        )
        if data.bundle is None:
            return committed.base_commit
        with tempfile.TemporaryDirectory(prefix="peerd-bundle-") as scratch:
            path = Path(scratch) / "result.bundle"
            path.write_bytes(_decode(data.bundle, "the box's bundle"))
            return await git.fetch_bundle(repo, path, f"refs/heads/{branch}", expect=data.tip)

    async def _claim_packet_branch(self, repo: Path, branch: str) -> None:
        owner = orchestration_of_branch(branch)
        project = await projects.by_path(self.ops.db, str(repo))
        if owner is None or project is None:
            raise InvalidRequest(f"{branch} in {repo} is not an orchestration packet's branch here.")
        ref = f"refs/heads/{branch}"
        exists = await git.branch_exists(repo, branch)
        right, whose = await ownership.right_to(self.ops.db, project.id, ref, caller=owner, exists=exists)
        if right == "not_yours":
            raise NotYours(
                f"Branch {branch} belongs to {whose.describe() if whose else 'nobody'} here; the packet's "
                "commits are not fetched into it. Rename or remove that branch and resume the run."
            )
        await ownership.claim_one(
            self.ops.db,
            project_id=project.id,
            holding="ref",
            name=ref,
            owner=owner,
            purpose="packet",
            now=self.ops.clock(),
        )
