"""The run manager: starts queued runs, streams provider events into the store, interrupts.

One thread runs at most one run at a time; the next queued run starts when the live one ends,
unless the thread's queue is held (a Stop). Every status change and item is committed before the
run moves on, so a crash leaves a store that startup recovery can finish. At most `start_slots`
runs start at once (peerd/runtime/slots.py): a launch is answered once its run is `starting`, and
the worktree, sandbox and process wait for a slot in the run's own task.

A store that cannot be written (disk full, read-only, locked: `storage_unavailable`) does not end
a run: the write is retried with backoff (`STORE_RETRY`) until the store works again, so no run
stays `running` because its last write failed. At shutdown every live run is cut: recorded with
`store.threads.recover` (interrupted, and continued after the restart where the run rules say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import secrets
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import structlog

from peerd.config import LinksConfig
from peerd.contracts import Thread
from peerd.core.access import runtime_rank
from peerd.core.backoff import Backoff
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.runs import (
    CONFINED,
    INTERRUPT_REASONS,
    RUN_INTERRUPTED,
    SHUTDOWN_REASON,
    interrupted_notice,
    is_live,
    plan_interrupt,
)
from peerd.core.tool_items import task_reference
from peerd.errors import (
    CapabilityDenied,
    ConfinementUnavailable,
    PeerdError,
    ProviderPathUnreachable,
    StorageUnavailable,
)
from peerd.events import Events, RunEnded, RunStarting
from peerd.paths import Paths
from peerd.runtime import git, sandbox, sandbox_profile
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.gate import ApprovalGate, RunApprovals
from peerd.runtime.meter import RunMeter
from peerd.runtime.provider import (
    ItemProduced,
    Provider,
    ProviderRun,
    RunFinished,
    RunSpec,
    SessionStarted,
    UsageReported,
)
from peerd.runtime.sandbox import Confinement
from peerd.runtime.slots import Slot, StartSlots, default_start_slots
from peerd.store import projects
from peerd.store import threads as store
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store

log = structlog.get_logger(__name__)

SHUTDOWN_GRACE_S = 10.0
# A live run's store write that failed: 0.5 s, 1 s, 2 s ... 30 s (a local store: no jitter).
STORE_RETRY = Backoff(first=0.5, cap=30.0)
# SQLite's own codes for a store that cannot be written now (its message text is never read).
_STORE_FAULTS = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR")
T = TypeVar("T")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def is_storage_fault(exc: BaseException) -> bool:
    """The store cannot be written now, but may be later: typed by the store layer, or SQLite's
    own error name, also as the cause of another error (a ROLLBACK after SQLite undid the
    transaction itself)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, StorageUnavailable):
            return True
        name = getattr(seen, "sqlite_errorname", None)
        if (
            isinstance(seen, sqlite3.OperationalError)
            and isinstance(name, str)
            and name.startswith(_STORE_FAULTS)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _KickLock:
    """A thread's kick lock and how many hold it or wait for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class RunManager:
    def __init__(
        self,
        db: Database,
        feed: ChangeFeed,
        providers: Mapping[str, Provider],
        *,
        state_dir: Path,
        tool_env: Mapping[str, str],
        clock: Clock = SYSTEM_CLOCK,
        home: Path | None = None,
        links: LinksConfig | None = None,
        label: str | None = None,
        continue_cut_runs: bool = True,
        start_slots: int | None = None,
        approvals: RunApprovals | None = None,
        events: Events | None = None,
    ) -> None:
        self._db = db
        # How many runs may be starting at once (peerd/runtime/slots.py; `[runs] start_slots`).
        self.start_slots = StartSlots(start_slots or default_start_slots())
        self._label = label  # this environment's name, in the reason of a run a stop cuts
        self._continue_cut_runs = continue_cut_runs
        # peerd's home (hidden from confined runs); by default the one state_dir lies in.
        self._home = home or state_dir.parent
        self._links = links or LinksConfig()
        self._feed = feed
        self._providers = providers
        self._state_dir = state_dir
        self._tool_env = dict(tool_env)
        self._clock = clock
        self._locks: dict[str, _KickLock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._live: dict[str, ProviderRun] = {}
        self._interrupts: dict[str, str] = {}  # run id -> why it is being interrupted
        self._cut: set[str] = set()  # runs the shutdown interrupts (not a person): recorded as cut
        self._over_budget: dict[str, str] = {}  # run id -> "budget exceeded: ..." (it fails with that)
        self._background: set[asyncio.Task[None]] = set()
        self._closing = False
        self._closed = asyncio.Event()
        # Store writes that failed and were retried; set while one waits (tests wait on it).
        self.store_retries = 0
        self.store_fault = asyncio.Event()
        # Who decides a run's guarded actions at approval-required, told first when a run ends
        # (peerd/runtime/gate.py; the daemon gives it peerd/approvals/service.py:RunGates).
        self._approvals = approvals
        # `RunEnded` goes out here once a run ended (delegated tasks whose child it is may settle).
        self._events = events or Events()

    def providers(self) -> list[str]:
        return sorted(self._providers)

    @property
    def links(self) -> LinksConfig:
        """What links' runs may use here (the per-link ceilings included)."""
        return self._links

    @contextlib.asynccontextmanager
    async def _lock(self, thread_id: str) -> AsyncIterator[None]:
        """The thread's kick lock. Its entry lives only while someone holds or waits for it: kept
        for every thread ever kicked, it grew the daemon by each thread (issue 26 case 11)."""
        entry = self._locks.setdefault(thread_id, _KickLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[thread_id]

    def _spawn(self, coro: object, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def kick(self, thread_id: str) -> None:
        """Start the thread's next queued run if nothing is live and the queue flows."""
        if self._closing:
            return
        async with self._lock(thread_id):
            token = secrets.token_urlsafe(32)
            started = await store.start_next(
                self._db, thread_id, now=self._clock(), token_hash=token_hash(token)
            )
            if started is None:
                return
            thread, run_id = started
            self._feed.changed(thread_id)
            self._tasks[run_id] = asyncio.create_task(
                self._execute(thread, run_id, token), name=f"run:{run_id}"
            )

    async def _notify_end(self, thread_id: str) -> None:
        try:
            await self._events.publish(RunEnded(thread_id))
        except Exception:
            log.exception("run.end_hook_failed", thread_id=thread_id)

    async def _kick_logged(self, thread_id: str) -> None:
        try:
            await self.kick(thread_id)
        except Exception:
            log.exception("run.kick_failed", thread_id=thread_id)

    async def kick_all(self) -> None:
        for thread_id in await store.queued_threads(self._db):
            await self.kick(thread_id)

    async def _workspace(self, thread: Thread) -> Path:
        worktree = Path(thread.worktree_path)
        if thread.in_place:
            return worktree
        project = await projects.get(self._db, thread.project_id)
        branch = thread.branch or f"peerd/{thread.id}"
        await git.create_worktree(Path(project.path), worktree, branch, thread.base_commit)
        return worktree

    async def _execute(self, thread: Thread, run_id: str, token: str) -> None:
        log.info("run.start", thread_id=thread.id, run_id=run_id, provider=thread.provider)
        try:
            # The launch was answered when the run was recorded `starting`; its start waits here
            # for a slot, so a burst of launches never starts a burst of processes at once.
            async with self.start_slots.slot() as slot:
                await self._drive(thread, run_id, token, slot)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("run.crashed", run_id=run_id)
            await self._finish(run_id, "failed", reason=f"peerd failed while running this run: {exc}")
        finally:
            self._live.pop(run_id, None)
            self._interrupts.pop(run_id, None)
            self._over_budget.pop(run_id, None)
            self._tasks.pop(run_id, None)
            self._feed.changed(thread.id)
            if not self._closing:
                self._spawn(self._kick_logged(thread.id), f"kick:{thread.id}")
                if self._events.subscribers(RunEnded):
                    self._spawn(self._notify_end(thread.id), f"ended:{thread.id}")

    async def _drive(self, thread: Thread, run_id: str, token: str, slot: Slot) -> None:
        if run_id in self._interrupts:  # asked while it waited for its start slot
            await self._finish(run_id, "interrupted", reason=self._interrupts[run_id])
            return
        provider = self._providers.get(thread.provider)
        if provider is None:
            known = ", ".join(self.providers())
            await self._finish(
                run_id, "failed", reason=f"Unknown provider {thread.provider!r}; known: {known}."
            )
            return
        try:
            cwd = await self._workspace(thread)
        except PeerdError as exc:
            await self._finish(run_id, "failed", reason=exc.message)
            return
        if run_id in self._interrupts:
            await self._finish(run_id, "interrupted", reason=self._interrupts[run_id])
            return
        by_link = thread.link_origin is not None
        if by_link and not self._links.allows(thread.provider):
            await self._refuse(
                thread.id,
                run_id,
                CapabilityDenied(
                    f"This machine's owner does not let linked machines use provider {thread.provider!r} "
                    "(links.providers in config.toml)."
                ),
            )
            return
        decision = sandbox.decide(
            by_link=by_link,
            runtime_mode=thread.runtime_mode,
            available=await asyncio.to_thread(sandbox.available),
            allow_unconfined=self._links.allow_unconfined,
        )
        if decision.refusal is not None:
            await self._refuse(thread.id, run_id, ConfinementUnavailable(decision.refusal))
            return
        current = await store.get_thread(self._db, thread.id)  # the session may have changed
        tool_env = {
            **self._tool_env,
            "PEERD_RUN_TOKEN": token,
            "PEERD_THREAD_ID": thread.id,
            "PEERD_RUN_ID": run_id,
        }
        state_dir = self._state_dir / thread.provider
        confinement = None
        if decision.confine:
            confinement = await self._confinement(thread, cwd, state_dir / "runs" / run_id, tool_env)
        notices = [n for n in (decision.notice,) if n]
        if confinement is not None:
            # Typed, for who must know whether this run could write outside its worktree
            # (orchestrate's attribution of a change in the user's checkout): `data.code`.
            await self._item(thread.id, run_id, "notice", confinement.describe(), {"code": CONFINED})
        runtime_mode = thread.runtime_mode
        if (
            by_link
            and thread.provider == "script"
            and runtime_rank(runtime_mode) >= runtime_rank("auto")
            and not (self._links.script_run and confinement is not None)
        ):
            runtime_mode = "auto-accept-edits"
            why = "links.script_run = false" if not self._links.script_run else "this run is not confined"
            notices.append(
                f"The scripted provider's run steps are refused for this linked machine's run ({why})."
            )
        for notice in notices:
            await self._item(thread.id, run_id, "notice", notice)
        gate: ApprovalGate | None = None
        if self._approvals is not None and runtime_mode == "approval-required":
            gate = await self._approvals.gate_for(thread, run_id)
        spec = RunSpec(
            thread_id=thread.id,
            run_id=run_id,
            prompt=await store.run_prompt(self._db, run_id),
            cwd=cwd,
            model=thread.model,
            runtime_mode=runtime_mode,
            interaction_mode=thread.interaction_mode,
            resume_session=current.provider_session,
            state_dir=state_dir,
            tool_env=tool_env,
            confinement=confinement,
            approvals=gate,
            # What this session spent before (a CLI that reports its session's running total).
            usage_before=await usage_store.thread_usage(self._db, thread.id)
            if current.provider_session
            else None,
        )
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        meter = await RunMeter.open(
            self._db,
            run_id,
            clock=self._clock,
            write=self._write,
            stop=functools.partial(self._stop_over_budget, run_id),
        )
        if (spent := meter.past) is not None:  # its work's budget is spent: it does not start
            await self._finish(run_id, "failed", reason=spent)
            return
        await self._events.publish(RunStarting(thread.id))  # its agent will want the MCP tools
        try:
            provider_run = await provider.start(spec)
        except ProviderPathUnreachable as exc:  # typed: an error item carrying the code
            await self._refuse(thread.id, run_id, exc)
            return
        except PeerdError as exc:
            await self._finish(run_id, "failed", reason=exc.message)
            return
        self._live[run_id] = provider_run
        slot.release_after(self.start_slots.hold_max_s)  # a quiet CLI holds its slot no longer
        meter.start_timer()
        await self._write(
            lambda: store.transition_run(
                self._db, run_id, "running", now=self._clock(), pgid=provider_run.pgid
            )
        )
        self._feed.changed(thread.id)
        if run_id in self._interrupts:  # asked while it was starting
            self._spawn(provider_run.interrupt(), f"interrupt:{run_id}")
        final = RunFinished("failed", "The provider ended without reporting a result.")
        errors_seen: set[str] = set()
        try:
            async for event in provider_run.events():
                slot.release()  # its CLI has started: the next run may start
                if isinstance(event, UsageReported):
                    await meter.report(event.usage)
                else:
                    final = await self._event(thread.id, run_id, event, final, errors_seen)
                self._feed.changed(thread.id)
        finally:
            meter.stop_timer()
        await meter.close()
        reason = final.error
        status = final.status
        if run_id in self._over_budget:  # stopped by its budget: failed, whatever the provider said
            status, reason = "failed", self._over_budget[run_id]
        elif run_id in self._interrupts and status != "completed":  # one that finished first stays so
            status, reason = "interrupted", self._interrupts[run_id]
        await self._finish(
            run_id, status, reason=reason, exit_code=final.exit_code, reported=reason in errors_seen
        )

    async def _event(
        self,
        thread_id: str,
        run_id: str,
        event: SessionStarted | ItemProduced | RunFinished,
        final: RunFinished,
        errors_seen: set[str],
    ) -> RunFinished:
        """Record one provider event; returns the run's outcome so far."""
        if isinstance(event, SessionStarted):
            await self._write(
                functools.partial(
                    store.set_provider_session, self._db, thread_id, event.session_id, now=self._clock()
                )
            )
        elif isinstance(event, ItemProduced):
            if event.kind == "error":
                errors_seen.add(event.text)
            data = task_reference(event.kind, event.text, event.data)  # not the whole task echoed
            await self._item(thread_id, run_id, event.kind, event.text, data)
        else:
            return event
        return final

    def _stop_over_budget(self, run_id: str, why: str) -> None:
        if run_id in self._over_budget or run_id in self._interrupts:
            return
        log.info("run.over_budget", run_id=run_id, reason=why)
        self._over_budget[run_id] = why
        self._interrupts[run_id] = why
        live = self._live.get(run_id)
        if live is not None:
            self._spawn(live.interrupt(), f"interrupt:{run_id}")

    async def _confinement(
        self, thread: Thread, cwd: Path, scratch: Path, tool_env: Mapping[str, str]
    ) -> Confinement:
        """The run's base sandbox profile; the provider adds its CLI's own needs."""
        project = await projects.get(self._db, thread.project_id)
        checkouts: list[Path] = []
        cursor: str | None = None
        while True:
            page = await projects.page(self._db, cursor=cursor, limit=500)
            checkouts += [Path(p.path) for p in page.items]
            if (cursor := page.next_cursor) is None:
                break
        socket = tool_env.get("PEERD_SOCKET")
        # in a thread: it looks at the filesystem (the /etc plan is walked once every 10 s)
        return await asyncio.to_thread(
            functools.partial(
                sandbox_profile.profile,
                home=self._home,
                owner_socket=Paths(self._home).socket,
                agent_socket=Path(socket) if socket else None,
                checkouts=checkouts,
                checkout=Path(project.path),
                worktree=cwd,
                scratch=scratch,
                by_link=thread.link_origin is not None,
                runtime_mode=thread.runtime_mode,
                interaction_mode=thread.interaction_mode,
            )
        )

    async def _write(self, op: Callable[[], Awaitable[T]]) -> T:
        """A store write of a live run: a store that cannot be written now is waited for (backoff
        `STORE_RETRY`), so the run's record is finished when the store works again.
        At shutdown it gives up: start-up recovery records the run instead."""
        failures = 0
        while True:
            try:
                return await op()
            except Exception as exc:
                if self._closing or not is_storage_fault(exc):
                    raise
                self.store_retries += 1
                self.store_fault.set()
                failures += 1
                delay = STORE_RETRY.delay(failures)
                log.warning("run.store_unavailable", retry_in_s=delay, error=str(exc))
            await self._clock.sleep(delay, self._closed)

    async def _item(
        self, thread_id: str, run_id: str, kind: str, text: str, data: Mapping[str, object] | None = None
    ) -> None:
        await self._write(
            lambda: store.add_item(
                self._db,
                thread_id=thread_id,
                run_id=run_id,
                kind=kind,
                text=text,
                data=dict(data or {}),
                now=self._clock(),
            )
        )
        self._feed.changed(thread_id)

    async def _refuse(self, thread_id: str, run_id: str, exc: PeerdError) -> None:
        """The run may not start: an error item carrying the code, and the run failed with it."""
        await self._item(thread_id, run_id, "error", exc.message, {"code": exc.code})
        await self._finish(run_id, "failed", reason=exc.message, reported=True)

    async def _finish(
        self,
        run_id: str,
        status: str,
        *,
        reason: str | None,
        exit_code: int | None = None,
        reported: bool = False,
    ) -> None:
        cut = status == "interrupted" and run_id in self._cut
        if self._approvals is not None:
            # Its open questions are withdrawn, unless a stop of this daemon cut it (they wait).
            with contextlib.suppress(Exception):
                await self._approvals.run_ended(run_id, cut=cut or self._closing)
        if cut:
            # Cut by the shutdown: interrupted, and continued after the restart where the rules say.
            await self._write(lambda: self._record_cut(only={run_id}))
            log.info("run.end", run_id=run_id, status="interrupted", cut=True)
            return
        # A failure's reason is also an error item, so readers of the items see why (once: not
        # again when the provider already reported that very error as an item).
        await self._write(
            lambda: store.transition_run(
                self._db,
                run_id,
                status,  # type: ignore[arg-type]  # one of the terminal statuses
                now=self._clock(),
                reason=reason,
                exit_code=exit_code,
                error_item=reason if status == "failed" and reason and not reported else None,
                # An interrupt leaves an item where the run stopped: the conversation shows it.
                notice_item=(RUN_INTERRUPTED, interrupted_notice(reason))
                if status == "interrupted"
                else None,
            )
        )
        log.info("run.end", run_id=run_id, status=status)

    def owned_runs(self) -> frozenset[str]:
        """The runs this manager executes now (the sweep's owners of live runs)."""
        return frozenset(self._tasks)

    async def cut_orphan(self, run_id: str, reason: str) -> bool:
        """A run recorded live that no task of this manager runs (the sweep found it): cut as a
        crash cuts it (interrupted with `reason`, continued where the run rules say), then its
        thread's queue starts and its task may settle. False: it was not live, or is owned now."""
        thread_id = await self._db.scalar("SELECT thread_id FROM runs WHERE id = ?", (run_id,))
        if thread_id is None or self._closing:
            return False
        async with self._lock(str(thread_id)):
            if run_id in self._tasks:
                return False
            done = await store.recover(
                self._db,
                now=self._clock(),
                reason=reason,
                label=self._label,
                continue_children=self._continue_cut_runs,
                only={run_id},
            )
        if not done:
            return False
        self._feed.changed(str(thread_id))
        await self.kick(str(thread_id))
        await self._notify_end(str(thread_id))
        return True

    async def _record_cut(self, only: set[str] | None = None) -> list[str]:
        return await store.recover(
            self._db,
            now=self._clock(),
            label=self._label,
            continue_children=self._continue_cut_runs,
            how="shutdown",
            only=only,
        )

    async def interrupt(
        self, thread_id: str, *, stop: bool, reason: str | None, run_id: str | None = None
    ) -> tuple[str | None, str, bool]:
        """Interrupt the live run (and with `stop` hold the queue). Returns (run, outcome, held).

        With `run_id` (a run of this thread), only that run: a queued one is cancelled under the
        thread's kick lock, the lock every start takes, so it can never start afterwards."""
        async with self._lock(thread_id):
            thread = await store.get_thread(self._db, thread_id)
            plan = plan_interrupt(await store.run_views(self._db, thread_id), stop=stop, run_id=run_id)
            if plan.hold_queue and not thread.queue_held:
                await store.set_queue_held(self._db, thread_id, True, now=self._clock())
            if plan.cancel_run is not None:
                why = reason or "Cancelled before it started."
                await store.transition_run(
                    self._db, plan.cancel_run, "cancelled", now=self._clock(), reason=why
                )
                log.info("run.end", run_id=plan.cancel_run, status="cancelled")
            if plan.target_run is not None:
                why = reason or INTERRUPT_REASONS[1 if stop else 0]
                self._interrupts.setdefault(plan.target_run, why)
                live = self._live.get(plan.target_run)
                if live is not None:
                    self._spawn(live.interrupt(), f"interrupt:{plan.target_run}")
        self._feed.changed(thread_id)
        if plan.cancel_run is not None and self._events.subscribers(RunEnded):
            self._spawn(self._notify_end(thread_id), f"ended:{thread_id}")
        return (
            plan.target_run or plan.cancel_run or run_id,
            plan.outcome,
            plan.hold_queue or thread.queue_held,
        )

    def is_executing(self, run_id: str) -> bool:
        return run_id in self._tasks

    def live_groups(self) -> frozenset[int]:
        """The process groups of the live runs (the owner socket refuses their members)."""
        return frozenset(run.pgid for run in self._live.values() if run.pgid is not None and run.pgid > 1)

    async def shutdown(self) -> None:
        """Interrupt every live run and record it; nothing is left half-written. A run the shutdown
        cuts (not one a person or a parent was already interrupting) is recorded as cut."""
        self._closing = True
        self._closed.set()
        asked = dict(self._interrupts)  # interrupts a person or a parent asked for: never continued
        for run_id in list(self._tasks):
            if run_id not in self._interrupts:
                self._interrupts[run_id] = SHUTDOWN_REASON
                self._cut.add(run_id)
        # Awaited, not spawned: escalation (SIGINT -> SIGTERM -> SIGKILL) must finish before exit.
        await asyncio.gather(
            *(live.interrupt() for live in list(self._live.values())), return_exceptions=True
        )
        tasks = list(self._tasks.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Whatever a cancelled task could not record is recorded here: an interrupt that was asked
        # for as asked (never continued), every other live run as cut. A store that cannot be
        # written now leaves them to start-up recovery.
        try:
            for run_id, why in asked.items():
                if is_live((await store.get_run(self._db, run_id)).status):
                    await store.transition_run(self._db, run_id, "interrupted", now=self._clock(), reason=why)
            await self._record_cut()
        except Exception:
            log.exception("run.shutdown_record_failed")
