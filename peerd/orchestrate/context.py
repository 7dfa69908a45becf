"""What every orchestration hop shares: the run's settings, the packet store, the receipt gate, and
the coder threads (launch, send, wait, read the reply) here or on a linked box.

The hops (`implement.py`, `review.py`) and the engine take one `OrchestrationContext`; none of them
keeps state of its own, so any hop can be repeated after a restart from what the store holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd import contracts as c
from peerd.core.backoff import Backoff
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.runs import DAEMON_STOPPED
from peerd.core.text import path_segment
from peerd.core.usage import Budget
from peerd.errors import InvalidRequest, PeerdError, PeerUnreachable, ReceiptMissing
from peerd.operations import Caller, Operations
from peerd.orchestrate import store as ostore
from peerd.orchestrate.models import CoderChoice
from peerd.orchestrate.states import PacketState
from peerd.orchestrate.transport import GitTransport
from peerd.runtime.feed import ChangeFeed
from peerd.store import projects
from peerd.store.db import Database

WAIT_CHUNK_S = 50.0
# A box that is away while a coder's run is waited for: 2 s, 4 s ... a minute, for as long as it takes.
UNREACHABLE_BACKOFF = Backoff(first=2.0, cap=60.0)
OUTPUT_TAIL = 20_000
TIMED_OUT = "timed_out"  # what `wait` answers at its deadline (not a run status)
RETRY_LIMIT = 1  # per class: content, environmental, redispatch, changes, plan, review answer


def feed_key(run_id: str) -> str:
    return f"orch:{run_id}"


def _access(value: Any) -> c.RuntimeMode:
    """The recorded --access (an older run recorded none: auto, as it ran)."""
    return value if value in ("approval-required", "auto-accept-edits", "auto", "full-access") else "auto"


@dataclass(frozen=True)
class Settings:
    """What one orchestration was asked to do, as recorded with it."""

    coders: list[CoderChoice]
    assignment: dict[str, CoderChoice]
    reviewers: dict[str, CoderChoice]
    concurrency: int
    packet_timeout_s: float | None  # a coder's turn longer than this is stopped: the timeout class
    verify: str | None
    workarounds: list[str]
    planner: CoderChoice
    keep: bool = False  # --keep: leave worktrees and thread branches for a look
    push: str | None = None  # --push REMOTE (or --pr's default remote)
    pr: bool = False
    ready: bool = False  # --ready: the pull request is not a draft
    user_work: dict[str, str] | None = None  # the user's dirty paths at the start -> content hash
    user_branch: str | None = None  # the branch the user's checkout was on at the start
    budget: Budget | None = None  # --budget: the whole orchestration's (every run, the planner's too)
    packet_budget: Budget | None = None  # --packet-budget: each packet's (its runs, every hop)
    access: c.RuntimeMode = "auto"  # --access: the implementers' runtime mode (reviewers stay read-only)
    until: str | None = None  # --until checks|review|merged: wait on the pull request (`prwait.py`)

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Settings:
        return cls(
            coders=[CoderChoice.model_validate(x) for x in request["coders"]],
            assignment={k: CoderChoice.model_validate(v) for k, v in request.get("assignment", {}).items()},
            reviewers={k: CoderChoice.model_validate(v) for k, v in request.get("reviewers", {}).items()},
            concurrency=int(request.get("concurrency", 3)),
            packet_timeout_s=request.get("packetTimeoutS"),
            verify=request.get("verify"),
            workarounds=list(request.get("workarounds", [])),
            planner=CoderChoice.model_validate(request.get("planner") or request["coders"][0]),
            keep=bool(request.get("keep")),
            push=request.get("push"),
            pr=bool(request.get("pr")),
            ready=bool(request.get("ready")),
            user_work=request.get("userWork"),
            user_branch=request.get("userBranch"),
            budget=_budget(request.get("budget")),
            packet_budget=_budget(request.get("packetBudget")),
            access=_access(request.get("access")),
            until=request.get("until"),
        )


def _budget(data: object) -> Budget | None:
    rule = Budget.from_json(data) if isinstance(data, dict) else None
    return None if rule is None or rule.empty else rule


@dataclass(frozen=True)
class RunOutcome:
    """What a coder's run said: its last reply, and what went wrong in it, quoted from its items."""

    reply: str
    problems: list[str]  # error items, failed or declined steps, notices: one line each
    denials: list[str]  # steps the coder's own sandbox or policy declined (structured: status "declined")


MAX_PROBLEMS = 20
PROBLEM_CHARS = 600
FAILED_OUTPUT_CHARS = 300  # the tail of a failed command's output quoted in its problem line
_READ_PAGES = 50


def _problem(item: c.Item) -> tuple[str | None, bool]:
    """One item as a quoted problem line (or None), and whether it is a sandbox denial."""
    data = item.data
    status = data.get("status") if isinstance(data.get("status"), str) else None
    text = item.text.strip()
    if item.kind == "error":
        return f"error: {text}"[:PROBLEM_CHARS], False
    if item.kind == "notice":
        return f"notice: {text}"[:PROBLEM_CHARS], False
    exit_code = data.get("exit_code")
    exited = isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0
    if item.kind in ("command", "file_change", "tool_call") and (
        status in ("failed", "declined") or data.get("error") or (item.kind == "command" and exited)
    ):
        # A command that exited non-zero failed, whatever status its CLI gave it (the scripted
        # coder gives none): quoted with its exit code and the tail of its output.
        detail = data.get("error") or data.get("output") or ""
        line = f"{item.kind.replace('_', ' ')} {text} {status if status == 'declined' else 'failed'}"
        if exited:
            line += f" (exit {exit_code})"
        if isinstance(detail, str) and detail.strip():
            line += ": " + detail.strip()[-FAILED_OUTPUT_CHARS:]
        return line[:PROBLEM_CHARS], status == "declined"
    return None, False


class OrchestrationContext:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        ops: Operations,
        *,
        worktrees_dir: Path,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.db = db
        self.feed = feed
        self.ops = ops
        self.transport = GitTransport(ops)
        self.worktrees_dir = worktrees_dir
        self.clock = clock

    def changed(self, run_id: str) -> None:
        self.feed.changed(feed_key(run_id))

    def caller(self, run_id: str) -> Caller:
        return Caller(namespace=f"orchestrate:{run_id}")

    async def set(
        self, orch_id: str, packet_id: str, *, expect: PacketState | None = None, **changes: Any
    ) -> None:
        """Record a packet's change by compare-and-set (`ostore.update_packet`): a state change
        follows the state machine (`orchestrate/states.py`), and lands only while the packet is in
        `expect` (the state the caller decided from; `StateChanged` otherwise)."""
        await ostore.update_packet(self.db, orch_id, packet_id, now=self.clock(), expect=expect, **changes)
        self.changed(orch_id)

    async def park(self, run_id: str, packet_id: str, why: str, *, expect: PacketState | None = None) -> None:
        await self.set(run_id, packet_id, expect=expect, state="parked", failure=why)

    async def gate(self, run_id: str, packet_id: str | None, kind: str, **expect: Any) -> dict[str, Any]:
        """A hop starts only with the previous hop's receipt, and only one that lets it start."""
        receipt = await ostore.latest_receipt(self.db, run_id, packet_id, kind)
        if receipt is None or any(_dig(receipt, key) != value for key, value in expect.items()):
            raise ReceiptMissing(f"Packet {packet_id}: no {kind} receipt allows this hop ({expect}).")
        return receipt

    async def launch(
        self,
        run: ostore.RunRow,
        coder: CoderChoice,
        prompt: str,
        *,
        key: str,
        runtime_mode: str,
        base: str,
        role: str,
        packet_id: str | None = None,
        branch: str | None = None,
        budget: c.Budget | None = None,
    ) -> c.ThreadLaunchResult:
        project = await projects.get(self.db, run.project_id)
        project_id = project.id
        if coder.environment is not None:
            project_id = await self.remote_project(coder.environment, project)
            await self.transport.send_base(coder.environment, project_id, Path(project.path), base)
        req = c.ThreadLaunch(
            project_id=project_id,
            prompt=prompt,
            provider=coder.backend,
            model=coder.model,
            title=f"{run.id} {key}"[:200],
            runtime_mode=runtime_mode,
            client_request_id=f"{run.id}:{key}",
            environment_id=coder.environment,
            branch=branch,
            base_commit=base,
            budget=budget,
        )
        launched = await self.ops.thread_launch(self.caller(run.id), req)
        await self.remember_thread(run.id, packet_id, launched.thread_id, coder.environment, role, coder)
        return launched

    async def remote_project(self, env: str, project: c.Project) -> str:
        cursor: str | None = None
        while True:
            page = await self.ops.project_list(
                self.caller("remote"), c.ProjectList(environment_id=env, cursor=cursor)
            )
            for remote in page.items:
                if remote.repository_key and remote.repository_key == project.repository_key:
                    return remote.id
            cursor = page.next_cursor
            if cursor is None:
                break
        raise InvalidRequest(
            f"{env} has no checkout of {project.repository_key or project.name}: clone it there and "
            "`peerd project add` it."
        )

    async def archive(self, run_id: str, thread_id: str, env: str | None) -> None:
        """Remove a finished thread's worktree (its branch stays), here or on the box through the link
        that started it; a box that is away keeps it, which costs only disk."""
        with contextlib.suppress(PeerdError):
            # The work that counts is committed on the branch; the rest of the worktree may go.
            if env is None:
                await self.ops.thread_archive(self.caller(run_id), thread_id, c.ThreadArchive(force=True))
            else:
                body = {"force": True}
                await self.ops.forward_raw(
                    env, "POST", f"/v1/threads/{path_segment(thread_id)}/archive", body=body
                )

    async def send(
        self,
        run_id: str,
        thread_id: str,
        env: str | None,
        text: str,
        *,
        key: str,
        budget: c.Budget | None = None,
    ) -> str:
        req = c.ThreadSend(text=text, client_request_id=f"{run_id}:{key}", environment_id=env, budget=budget)
        return (await self.ops.thread_send(self.caller(run_id), thread_id, req)).run_id

    async def wait(
        self, run_id: str, thread_id: str, run_ref: str, env: str | None, *, deadline: float | None = None
    ) -> str:
        """Wait for a run to end, in long-poll chunks; a box that is away is waited for. With a
        `deadline` (epoch seconds, kept in the store so a restart keeps it) returns TIMED_OUT there."""
        failures = 0
        while True:
            chunk = WAIT_CHUNK_S
            if deadline is not None:
                chunk = min(chunk, deadline - self.clock())
                if chunk <= 0:
                    return TIMED_OUT
            try:
                result = await self.ops.thread_wait(
                    self.caller(run_id),
                    thread_id,
                    c.ThreadWait(run_id=run_ref, timeout=chunk, environment_id=env),
                )
            except PeerUnreachable:
                failures += 1
                await self.clock.sleep(UNREACHABLE_BACKOFF.delay(failures))
                continue
            failures = 0
            if result.terminal:
                return str(result.status)
            if self.ops.feed.closed:
                # This daemon is stopping (a local wait returns at once now): the engine cancels
                # this wait, and the next start resumes it from the store. Asking again would spin.
                await asyncio.Event().wait()

    async def stopped_by_shutdown(self, run_id: str, thread_id: str, env: str | None) -> bool:
        """Was the coder's last run cut by a stop or crash of its daemon (here or on the box)? The
        cut run's error item carries the code `daemon_stopped` (never decided on the reason's text,
        which names the environment)."""
        thread = await self.ops.thread_show(self.caller(run_id), thread_id, env)
        latest = thread.latest_run
        if latest is None or latest.status != "interrupted":
            return False
        after: int | None = None
        while True:
            read = c.ThreadRead(
                run_id=latest.id, after_position=after, limit=100, max_chars_per_item=1, environment_id=env
            )
            page = await self.ops.thread_read(self.caller(run_id), thread_id, read)
            if any(i.kind == "error" and i.data.get("code") == DAEMON_STOPPED for i in page.items):
                return True
            if not page.has_more or page.next_position is None:
                return False
            after = page.next_position

    async def outcome(self, run_id: str, thread_id: str, run_ref: str, env: str | None) -> RunOutcome:
        """Every item of one run, read page by page: its last reply and its problems."""
        texts: list[str] = []
        problems: list[str] = []
        denials: list[str] = []
        after: int | None = None
        for _ in range(_READ_PAGES):
            read = c.ThreadRead(run_id=run_ref, after_position=after, limit=100, environment_id=env)
            page = await self.ops.thread_read(self.caller(run_id), thread_id, read)
            for item in page.items:
                if item.kind == "assistant_message" and item.text.strip():
                    texts.append(item.text)
                line, denied = _problem(item)
                if line is not None and line not in problems and len(problems) < MAX_PROBLEMS:
                    problems.append(line)
                if denied:
                    denials.append(line or item.text)
            if not page.has_more or page.next_position is None:
                break
            after = page.next_position
        errors = [p.removeprefix("error: ") for p in problems if p.startswith("error: ")]
        return RunOutcome(texts[-1] if texts else ("\n".join(errors) or ""), problems, denials)

    async def reply(self, run_id: str, thread_id: str, run_ref: str, env: str | None) -> str:
        return (await self.outcome(run_id, thread_id, run_ref, env)).reply

    async def remember_thread(
        self,
        run_id: str,
        packet_id: str | None,
        thread_id: str,
        env: str | None,
        role: str,
        coder: CoderChoice | None = None,
    ) -> None:
        """Every thread a run starts is recorded (a `thread` receipt) the moment its launch
        returns, so the clean-up finds it, here or on a box, whatever happens next. A replayed
        launch (same key, same thread) records it again; readers keep the first. `coder` is the
        coder as it was placed (`--on auto`: where it runs), which the run's view shows."""
        body: dict[str, Any] = {"threadId": thread_id, "environment": env, "role": role}
        if coder is not None:
            body["coder"] = coder.model_dump(mode="json")
        await ostore.add_receipt(self.db, run_id, packet_id, "thread", body, now=self.clock())

    async def threads_of(self, run_id: str) -> list[tuple[str, str | None, str]]:
        """The threads this run started: (thread id, environment, role), each once, in order."""
        seen: dict[str, tuple[str, str | None, str]] = {}
        for receipt in await ostore.receipts(self.db, run_id):
            if receipt["kind"] == "thread":
                body = receipt["body"]
                seen.setdefault(body["threadId"], (body["threadId"], body.get("environment"), body["role"]))
        return list(seen.values())


def _dig(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
