"""The approvals shell: each run's gate, decisions, the deadline timer, and who hears of them.

A question goes: the CLI asks -> `RunGate.ask` -> a standing grant of the run, or a decision owed
to the thread (a restart cut the run that asked first), answers at once; a link whose policy is
`deny` is answered at once; otherwise the record is committed (`approvals` table), watchers and
notifications hear of it, and the gate waits for the first decision or the deadline. A decision
(`decide`) is one conditional update; it wakes the waiting gate, which marks it delivered. A
decision whose run is gone (the daemon restarted meanwhile) stays owed: the thread's next run
inherits it when it asks the same again, and if nothing is queued on the thread a continuation is
queued so it does.

Change keys on the `ChangeFeed`: `approvals` (anything), `approvals:link:<client id>` (that link's
work), and the thread's own id.

What the run manager sees of it is `RunGates`, its `RunApprovals` (`peerd/runtime/gate.py`):
the gate of each run at approval-required, and each run's end. A continuation is queued here
(`continuation`) and started by the run manager, told by the event `RunQueued`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from peerd.approvals import rules
from peerd.approvals import store as approvals_store
from peerd.approvals.notify import Notifier
from peerd.approvals.rules import Approval, Decision, LinkPolicy
from peerd.contracts import Thread
from peerd.errors import ApprovalDecided, ApprovalNotAllowed, ApprovalNotFound, ApprovalWithdrawn
from peerd.events import Events, RunQueued
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.gate import ApprovalAnswer, ApprovalAsk, ApprovalGate
from peerd.store.db import Database

log = structlog.get_logger(__name__)

ANY_KEY = "approvals"


def link_key(client_id: str) -> str:
    return f"approvals:link:{client_id}"


def new_id() -> str:
    return "ap_" + secrets.token_hex(8)


@dataclass(frozen=True)
class RunContext:
    """Who a run's questions are from: the run, its thread, the link that started it (if any) and
    the task that delegated it here (if any)."""

    run_id: str
    thread_id: str
    link_origin: str | None = None
    link_label: str | None = None
    parent_task_id: str | None = None
    parent_thread_id: str | None = None


# Queue a run on the thread (a continuation after a restart) when nothing is queued there and the
# run that asked is still the thread's latest: (thread id, that run's id, prompt) -> queued or not.
Continue = Callable[[str, str, str], Awaitable[bool]]


def continuation(db: Database, events: Events, *, clock: Callable[[], float]) -> Continue:
    """The continuation of an owed decision: queued in the store (`queue_continuation`), then
    announced (`RunQueued`: the run manager starts it if the thread's queue flows)."""

    async def continue_thread(thread_id: str, asked_in: str, prompt: str) -> bool:
        queued = await approvals_store.queue_continuation(db, thread_id, asked_in, prompt, now=clock())
        if queued:
            await events.publish(RunQueued(thread_id))
        return queued

    return continue_thread


class ApprovalService:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        *,
        clock: Callable[[], float],
        deadline_s: float = rules.DEFAULT_DEADLINE_S,
        link_policy: Callable[[str, str | None], LinkPolicy] = lambda _client, _label: "ask",
        notifier: Notifier | None = None,
        continue_thread: Continue | None = None,
    ) -> None:
        self.db = db
        self.feed = feed
        self.clock = clock
        self.deadline_s = deadline_s
        self.link_policy = link_policy
        self.notifier = notifier
        self.continue_thread = continue_thread
        self._waiting: dict[str, asyncio.Event] = {}  # approval id -> set when decided
        self._timer: asyncio.Task[None] | None = None
        self._timer_wake = asyncio.Event()
        self._closing = False

    # --- life ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.create_task(self._deadlines())

    async def stop(self) -> None:
        """Shutdown: waiting gates stop waiting (their runs are being cut); records stay pending."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        if self.notifier is not None:
            await self.notifier.close()

    def gate_for(self, context: RunContext) -> RunGate:
        return RunGate(self, context)

    # --- asking --------------------------------------------------------------------------------------

    async def ask(self, context: RunContext, ask: ApprovalAsk) -> ApprovalAnswer:
        digest = rules.digest(ask.kind, ask.tool, ask.detail)
        now = self.clock()
        granted = rules.standing_grant(digest, await approvals_store.of_run(self.db, context.run_id))
        if granted is not None:
            return ApprovalAnswer(True, "", granted.id)
        owed = await approvals_store.owed_on_thread(self.db, context.thread_id, digest)
        inherited = rules.owed_to(digest, owed)
        if inherited is not None and await approvals_store.delivered(self.db, inherited.id, now=now):
            self._changed(inherited)
            return inherited.answer()
        if context.link_origin is not None and not rules.ask_waits(
            self.link_policy(context.link_origin, context.link_label), context.link_origin
        ):
            return ApprovalAnswer(False, rules.LINK_DENIES)
        still = next((a for a in owed if a.pending and a.id not in self._waiting), None)
        if still is not None:
            # Asked again by the thread's next run after a restart: the same question, one record.
            await approvals_store.rebind(self.db, still.id, run_id=context.run_id, ask_key=ask.key)
            approval = still
        else:
            approval = Approval(
                id=new_id(),
                run_id=context.run_id,
                thread_id=context.thread_id,
                ask_key=ask.key,
                kind=ask.kind,
                tool=ask.tool,
                summary=ask.summary,
                detail=dict(ask.detail),
                digest=digest,
                created_at=now,
                deadline_at=now + self.deadline_s,
                link_origin=context.link_origin,
                link_label=context.link_label,
                parent_task_id=context.parent_task_id,
                parent_thread_id=context.parent_thread_id,
            )
            await approvals_store.insert(self.db, approval)  # durable before anyone hears of it
            self._timer_wake.set()
            if self.notifier is not None:
                self.notifier.announce(approval)
        return await self._await(approval)

    async def _await(self, approval: Approval) -> ApprovalAnswer:
        decided = self._waiting.setdefault(approval.id, asyncio.Event())
        self._changed(approval)
        try:
            while True:
                decided.clear()  # before the read: a decision landing during it is not missed
                current = await approvals_store.get(self.db, approval.id)
                if current is None:
                    return ApprovalAnswer(False, "Not allowed: the question was withdrawn.")
                if not current.pending:
                    if await approvals_store.delivered(self.db, current.id, now=self.clock()):
                        self._changed(current)
                    return current.answer()
                await decided.wait()
        finally:
            self._waiting.pop(approval.id, None)

    # --- deciding ------------------------------------------------------------------------------------

    async def decide(
        self,
        approval_id: str,
        decision: Decision,
        *,
        link_client: str | None = None,
        link_runtime: str | None = None,
    ) -> Approval:
        """The first decision wins; a retry of it (same decision id) is answered as it was."""
        approval = await approvals_store.get(self.db, approval_id)
        if approval is None or (link_client is not None and approval.link_origin != link_client):
            raise ApprovalNotFound(
                f"No approval {approval_id!r} here. `peerd approval list --all` shows the approvals you can see."
            )
        if (
            why := rules.may_decide(approval, link_client=link_client, link_runtime=link_runtime)
        ) is not None:
            raise ApprovalNotAllowed(why)
        for _ in range(2):
            try:
                decided = rules.decide(approval, decision, now=self.clock())
            except rules.Withdrawn as gone:
                raise _withdrawn_error(gone.approval) from None
            except rules.AlreadyDecided as first:
                raise _decided_error(first.approval) from None
            if decided is approval:
                return approval  # the same decision, retried
            written = await approvals_store.settle(self.db, decided)
            if written is not None:
                await self._settled(written)
                return written
            # Another decision got there first, between our read and our write: read it again.
            again = await approvals_store.get(self.db, approval_id)
            if again is None:
                break
            approval = again
        if approval.status == "cancelled":
            raise _withdrawn_error(approval)
        raise _decided_error(approval)

    async def _settled(self, approval: Approval) -> None:
        event = self._waiting.get(approval.id)
        if event is not None:
            event.set()  # its gate answers the CLI and marks it delivered
        else:
            await self._owed(approval)
        self._changed(approval)

    async def _owed(self, approval: Approval) -> None:
        """Nobody waits for this decision (its run is gone): the thread's next run inherits it
        when it asks again; make sure one will."""
        if self.continue_thread is None or self._closing:
            return
        if approval.status not in ("approved", "denied"):
            return  # a deadline or a withdrawal: nobody decided, nothing to tell a new run
        if approval.status == "approved":
            note = (
                f"peerd: while you waited for approval to {approval.summary}, this machine's peerd "
                "restarted. The person has approved it since: ask for exactly the same again and it "
                "will be allowed, then carry on."
            )
        else:
            note = (
                f"peerd: while you waited for approval to {approval.summary}, this machine's peerd "
                f"restarted. {rules.denial_message(approval)}"
            )
        try:
            await self.continue_thread(approval.thread_id, approval.run_id, note)
        except Exception:
            log.warning(
                "could not queue the continuation for an owed approval", approval=approval.id, exc_info=True
            )

    async def run_ended(self, run_id: str, *, cut: bool) -> None:
        """A run ended. Its open questions are withdrawn, unless a daemon stop cut it (`cut`):
        those stay pending for the person and for the thread's next run."""
        if cut or self._closing:
            return
        for approval in await approvals_store.of_run(self.db, run_id):
            if approval.pending and approval.id not in self._waiting:
                done = rules.cancel(approval, "the run ended before anyone decided", now=self.clock())
                if (written := await approvals_store.settle(self.db, done)) is not None:
                    self._changed(written)

    async def withdraw(self, approval_id: str, reason: str) -> Approval | None:
        """Withdraw a pending question nothing waits on (the sweep found its run gone); None when
        it was decided or waited on meanwhile."""
        approval = await approvals_store.get(self.db, approval_id)
        if approval is None or not approval.pending or approval.id in self._waiting:
            return None
        written = await approvals_store.settle(self.db, rules.cancel(approval, reason, now=self.clock()))
        if written is not None:
            self._changed(written)
        return written

    def waiting(self) -> frozenset[str]:
        """The questions a live run's gate waits on now (the sweep's owners of questions)."""
        return frozenset(self._waiting)

    # --- deadlines -----------------------------------------------------------------------------------

    async def _deadlines(self) -> None:
        while True:
            self._timer_wake.clear()
            try:
                await self.expire_due()
                upcoming = await approvals_store.next_deadline(self.db)
            except Exception:
                log.warning("approval deadlines could not be checked", exc_info=True)
                upcoming = self.clock() + 5.0
            wait = None if upcoming is None else max(0.0, upcoming - self.clock()) + 0.01
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wake.wait(), wait)

    async def expire_due(self) -> list[Approval]:
        now = self.clock()
        expired: list[Approval] = []
        for approval in await approvals_store.due(self.db, now):
            done = rules.expire(approval, now=now)
            if done is not None and (written := await approvals_store.settle(self.db, done)) is not None:
                expired.append(written)
                await self._settled(written)
        return expired

    # --- who hears ----------------------------------------------------------------------------------

    def _changed(self, approval: Approval) -> None:
        self.feed.changed(ANY_KEY)
        self.feed.changed(approval.thread_id)
        if approval.link_origin is not None:
            self.feed.changed(link_key(approval.link_origin))


# Who delegated a thread here: (task id, parent thread id) of its open local task, or None.
DelegatedBy = Callable[[str], Awaitable[tuple[str, str] | None]]


class RunGates:
    """The run manager's `RunApprovals` (`peerd/runtime/gate.py`): each run's gate, with
    who it is from (the link, the task that delegated it here), and each run's end."""

    def __init__(self, service: ApprovalService, delegated_by: DelegatedBy) -> None:
        self.service = service
        self.delegated_by = delegated_by  # the tasks' store, given by the daemon (tasks sit above approvals)

    async def gate_for(self, thread: Thread, run_id: str) -> ApprovalGate | None:
        parent_task = await self.delegated_by(thread.id)
        context = RunContext(
            run_id=run_id,
            thread_id=thread.id,
            link_origin=thread.link_origin,
            link_label=thread.link_label,
            parent_task_id=None if parent_task is None else parent_task[0],
            parent_thread_id=None if parent_task is None else parent_task[1],
        )
        return self.service.gate_for(context)

    async def run_ended(self, run_id: str, *, cut: bool) -> None:
        await self.service.run_ended(run_id, cut=cut)


class RunGate:
    """One run's `ApprovalGate`."""

    def __init__(self, service: ApprovalService, context: RunContext) -> None:
        self.service = service
        self.context = context

    async def ask(self, ask: ApprovalAsk) -> ApprovalAnswer:
        return await self.service.ask(self.context, ask)


def _withdrawn_error(approval: Approval) -> ApprovalWithdrawn:
    return ApprovalWithdrawn(
        f"That question was withdrawn before anyone decided: {approval.reason or 'its run ended'}. "
        "Nothing is waiting for this decision; if the work goes on it asks again, as a new question."
    )


def _decided_error(first: Approval) -> ApprovalDecided:
    who = {"deadline": "its deadline", "run_ended": "the run's end"}.get(first.decided_by or "")
    if who is None:
        who = "this machine's owner" if first.decided_by == rules.OWNER else f"{first.decided_by}"
        if (first.decided_by or "").startswith("link:"):
            who = "the linked machine that started the work"
    return ApprovalDecided(
        f"That approval was already decided ({first.status}) by {who}; the first decision stands."
    )
