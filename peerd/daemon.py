"""The composition root: the only place that wires; recovers; shuts down.

Start-up order (`Daemon.start`): open the home (the lock, the store, the identity), recover the
store (cut runs a dead daemon left live: interrupted, and continued where owed,
`store.threads.recover`; prune old receipts), build every part through its constructor (`Parts`;
the events between them, `peerd/events.py`, subscribed in `Daemon._subscribe`), then serve
them: the listeners, then queued runs (continuations first), tasks, followers, orchestrations,
moves, the sweep.
Shutdown (SIGTERM/SIGINT): every request is answered, in-flight ones (long-polls, forwarded calls)
with `shutting_down` within a second; live runs are interrupted and recorded as cut (continued
after the restart where owed), the listeners stop, the store closes. Nothing is half-written:
each change is a transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

import structlog
from aiohttp import web

from peerd import __version__, sdnotify
from peerd import contracts as c
from peerd.a2a.lazy import LazyA2A
from peerd.api import peercred
from peerd.api.a2a_routes import add_a2a_routes
from peerd.api.app import SHUTDOWN_GATE, ShutdownGate
from peerd.api.approvals import add_approval_routes
from peerd.api.console_login import CONSOLE
from peerd.api.gitwire import add_git_routes
from peerd.api.handoff import add_box_routes, add_handoff_routes
from peerd.api.listener import start_tcp
from peerd.api.mcp_http import Loopback, McpService, add_mcp_route, bind_loopback, start_tcp_listener
from peerd.api.orchestrate import add_orchestration_routes
from peerd.api.owner_routes import local_app
from peerd.api.placement import add_placement_routes
from peerd.api.signin_requests import add_signin_request_routes
from peerd.api.tools import ToolServices, agent_app
from peerd.api.waits import add_wait_routes
from peerd.approvals.desk import ApprovalDesk
from peerd.approvals.notify import Notifier
from peerd.approvals.service import ApprovalService, RunGates, continuation
from peerd.approvals.store import waiting_approval
from peerd.boot import (
    DEFAULT_LISTEN,
    DaemonConfig,
    EarlyStart,
    home_unusable,
    open_store,
    parse_listen,
    prepare_socket_path,
    take_lock,
)
from peerd.config import link_may_use
from peerd.console.server import Console
from peerd.core.clock import SYSTEM_CLOCK, Clock
from peerd.core.idempotency import RECEIPT_RETENTION_S
from peerd.core.liveness import Owners
from peerd.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    StorageUnavailable,
    Unavailable,
)
from peerd.events import (
    CapacityReported,
    ClientRevoked,
    Events,
    LinkChecked,
    LinkForgotten,
    PeerAnswered,
    RemoteTaskChanged,
    RunEnded,
    RunQueued,
    RunStarting,
    ThreadArchived,
    ThreadStopped,
)
from peerd.handoff.service import HandoffService, MoveGuard
from peerd.operations import Operations
from peerd.orchestrate.front import FrontParts
from peerd.orchestrate.lazy import LazyOrchestrations
from peerd.paths import Paths
from peerd.peer.client import PeerClient, check_url
from peerd.peer.forwarding import Forwarder
from peerd.peer.identity import Identity, load_or_create_identity
from peerd.peer.links import LinkService
from peerd.peer.webcert import WebCertificate, load_web_certificate, server_tls
from peerd.placement.capacity import readers_for
from peerd.placement.service import Placement
from peerd.providers import registry
from peerd.providers.registry import LazyProvider
from peerd.runtime.background import import_in_thread, in_daemon_thread
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.orphans import kill_orphaned_group
from peerd.runtime.runner import RunManager
from peerd.runtime.sweep import Sweeper, SweepHooks
from peerd.store import projects, provider_approvals, receipts, threads
from peerd.store import sweep as sweep_store
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store
from peerd.tasks import store as tasks_store
from peerd.tasks.delegation import Delegation
from peerd.tasks.feed import FeedHub
from peerd.tasks.follower import FollowerPool
from peerd.waits.pace import GhPace
from peerd.waits.service import Waits

# Defined in peerd/boot.py (the light first steps of `peerd serve`), known by these names here too.
__all__ = [
    "DEFAULT_LISTEN",
    "Daemon",
    "DaemonConfig",
    "home_unusable",
    "parse_listen",
    "serve",
]

log = structlog.get_logger(__name__)

CAPABILITIES = ["threads", "projects", "long-poll", "events", "links", "mode-limit-header", "link-fence"]
HTTP_SHUTDOWN_TIMEOUT_S = 5.0
PRUNE_EVERY_S = 3600.0
NETWORK_MODULE = "peerd.api.remote"  # the network listener's app; imports agent_signin_routes too


@dataclass(frozen=True)
class Parts:
    """Every part of a running daemon, built once by `Daemon._build` with constructors only: each
    part is given what it uses, and the events between them (`peerd/events.py`) are
    subscribed in one place, `Daemon._subscribe`. Nothing is wired after it is built."""

    events: Events
    desc: c.Descriptor
    providers: dict[str, LazyProvider]  # each driver loads when a run of it starts
    runs: RunManager
    peers: PeerClient
    forwarder: Forwarder
    placement: Placement
    ops: Operations
    delegation: Delegation
    followers: FollowerPool
    links: LinkService
    approvals: ApprovalService
    desk: ApprovalDesk
    handoff: HandoffService
    orchestrations: LazyOrchestrations
    tools: ToolServices
    mcp: McpService
    a2a: LazyA2A
    console: Console
    sweeper: Sweeper
    waits: Waits


async def _thread_stopped(p: Parts, e: ThreadStopped) -> None:
    """A thread's Stop or archive: the tasks it delegated stop, and its waits end (nobody to wake)."""
    await p.delegation.stop_children(e.thread_id, e.reason)
    await p.waits.cancel_for_thread(e.thread_id, e.reason)


async def _thread_archived(p: Parts, e: ThreadArchived) -> None:
    """A thread was archived: its waits end (nobody to wake)."""
    await p.waits.cancel_for_thread(e.thread_id, "it was archived")


class Daemon:
    def __init__(self, config: DaemonConfig, *, clock: Clock = SYSTEM_CLOCK, subreaper: bool = False) -> None:
        self.config = config
        # The one clock: every part below that stamps, measures or waits is given this one (a test
        # may give a daemon a clock it moves itself: tests/fakeclock.py).
        self.clock = clock
        self.paths = Paths(config.home)
        self._stop = asyncio.Event()
        self._listeners: list[c.Listener] = []
        self.gate = ShutdownGate()  # what every app answers while the daemon stops
        self._runners: list[web.AppRunner] = []
        self._lock_file: IO[str] | None = None
        self.identity: Identity | None = None
        self.web_certificate: WebCertificate | None = None  # the listener's, for browsers (TLS only)
        self.db: Database | None = None
        self.parts: Parts | None = None  # once built (`_build`)
        self._pruner: asyncio.Task[None] | None = None
        self._loopback: Loopback | None = None  # the MCP loopback port, bound before the parts
        self._stopped = False
        self.feed = ChangeFeed(clock=clock)
        # Under `peerd serve` the daemon is a child subreaper, so every process below it is one it
        # started, and the owner socket refuses them all (peerd/api/peercred.py).
        self.subreaper = subreaper
        self._early: EarlyStart | None = None  # `peerd serve`'s early owner socket (peerd/boot.py)

    # The parts by name, once built (tests and `shutdown` read them; None before).

    @property
    def providers(self) -> dict[str, LazyProvider]:
        return {} if self.parts is None else self.parts.providers

    @property
    def runs(self) -> RunManager | None:
        return None if self.parts is None else self.parts.runs

    @property
    def peers(self) -> PeerClient | None:
        return None if self.parts is None else self.parts.peers

    @property
    def followers(self) -> FollowerPool | None:
        return None if self.parts is None else self.parts.followers

    @property
    def approvals(self) -> ApprovalService | None:
        return None if self.parts is None else self.parts.approvals

    @property
    def handoff(self) -> HandoffService | None:
        return None if self.parts is None else self.parts.handoff

    @property
    def orchestrations(self) -> LazyOrchestrations | None:  # the engine loads on first need
        return None if self.parts is None else self.parts.orchestrations

    @property
    def sweeper(self) -> Sweeper | None:  # the sweep of open work (peerd/runtime/sweep.py)
        return None if self.parts is None else self.parts.sweeper

    @property
    def mcp(self) -> McpService | None:  # agent tools over MCP: /mcp on both sockets and a loopback port
        return None if self.parts is None else self.parts.mcp

    @property
    def console(self) -> Console | None:  # the browser console (peerd/console/), its own listener
        return None if self.parts is None else self.parts.console

    def request_stop(self) -> None:
        self._stop.set()

    def _take_lock(self) -> None:
        self._lock_file = take_lock(self.paths)

    async def start(self, early: EarlyStart | None = None) -> None:
        """Open the home, build every part, then serve them in order (docs/internals/architecture.md,
        "The composition root"). With `early` (`peerd serve`, peerd/boot.py), the home lock, the
        store and the owner socket are already its, and the socket already answers `status`; its
        held requests are handed to the local app once that is built."""
        self._early = early
        self._check_advertised()
        db, identity = await self._open_home(early)
        await self._recover_store(db)
        await self._start_pruning()
        self._loopback = await bind_loopback()  # runs are given its address (peerd/api/mcp_http.py)
        self.parts = self._build(db, identity, self._loopback)
        self._subscribe(self.parts)
        await self._serve(self.parts)
        log.info(
            "daemon.ready",
            env_id=identity.env_id,
            label=self.config.label,
            listeners=[listener.address for listener in self._listeners],
        )

    # --- opening the home ---------------------------------------------------------------------------

    def _check_advertised(self) -> None:
        for url in self.config.advertise:
            check_url(url)  # a pairing code must never carry an address the laptop would refuse

    async def _open_home(self, early: EarlyStart | None) -> tuple[Database, Identity]:
        """The home lock, the store (checked, migrated) and the identity."""
        if early is not None and early.lock is not None and early.db is not None:
            self._lock_file, self.db = early.lock, early.db
        else:
            self._take_lock()
            self.db = await self._open_store()
        db = self.db
        # [prices]: what a run whose CLI reports no cost is estimated to cost (store/threads/usage.py)
        usage_store.use_prices(db, self.config.settings.price_table(), self.config.settings.default_models())
        try:
            # Without a network listener nothing signs at start: the identity is read without
            # `cryptography` when its files are peerd's own (peer/identity.py; issue 33). Read in
            # a thread: `cryptography`'s import, when it is needed, does not hold the early `status`.
            identity = await in_daemon_thread(
                partial(load_or_create_identity, self.paths.home, light=not self.config.listen),
                name="peerd-identity",
            )
        except OSError as exc:
            raise home_unusable(self.paths.home, exc) from None
        if early is not None and early.identity not in (None, (identity.env_id, identity.fingerprint_text)):
            log.warning("daemon.identity_changed_while_starting", env_id=identity.env_id)
        self.identity = identity
        return db, identity

    async def _recover_store(self, db: Database) -> None:
        """What a dead daemon left: its orphaned provider groups killed, the runs it left live cut,
        and their questions withdrawn, all before anything starts."""
        now = self.clock.wall()
        for run_id, pgid in await threads.live_run_groups(db):
            if kill_orphaned_group(pgid, run_id):
                log.info("daemon.killed_orphan", run_id=run_id, pgid=pgid)
        # Runs a crash cut: interrupted, saying where, and continued where the run rules say
        # (owed wakes; delegated children unless `continue_cut_runs = false`), recorded before
        # anything starts; `kick_all` starts the continuations first.
        recovered = await threads.recover(
            db,
            now=now,
            label=self.config.label,
            continue_children=self.config.settings.continue_cut_runs,
        )
        if recovered:
            log.info("daemon.recovered_runs", count=len(recovered))
        # A question outlives no run: those of the runs just cut are withdrawn before anything is
        # served (peerd/core/liveness.py; the sweep keeps it so while the daemon runs).
        withdrawn = await sweep_store.withdraw_orphaned_questions(db, now=now)
        if withdrawn:
            log.info("daemon.withdrew_questions", count=len(withdrawn), approvals=withdrawn)

    async def _start_pruning(self) -> None:
        await self._prune_receipts()
        self._pruner = asyncio.create_task(self._prune_hourly(), name="peerd.prune")

    # --- building the parts (constructors only; no I/O) -----------------------------------------------

    def _build(self, db: Database, identity: Identity, loopback: Loopback) -> Parts:
        """Every part, each given what it uses (in an order where that exists already). The
        cycles between them are events (`Events`), subscribed by `_subscribe`."""
        settings, clock, label = self.config.settings, self.clock, self.config.label
        env_id = identity.env_id
        events = Events()
        providers = registry.build(settings, self.command_approved)
        desc = c.Descriptor(
            environment_id=env_id, label=label, version=__version__, capabilities=CAPABILITIES
        )
        approvals = ApprovalService(
            db,
            self.feed,
            clock=clock,
            deadline_s=settings.approvals.deadline_minutes * 60.0,
            link_policy=settings.approvals.policy_for,
            notifier=Notifier(
                environment=label or env_id,
                desktop=settings.approvals.desktop,
                webhook_url=settings.approvals.webhook_url,
            ),
            continue_thread=continuation(db, events, clock=clock),  # started on `RunQueued`
        )
        runs = RunManager(
            db,
            self.feed,
            providers,
            state_dir=self.paths.provider_state,
            # Runs get the agent socket only: the owner socket is never theirs (api/tools.py).
            tool_env={"PEERD_SOCKET": str(self.paths.agent_socket), "PEERD_MCP_URL": loopback.url},
            home=self.paths.home,
            links=settings.links,  # what a link's runs may use (runtime/sandbox.py)
            label=label,  # named in the reason of a run a stop of this daemon cuts
            continue_cut_runs=settings.continue_cut_runs,
            start_slots=settings.runs.start_slots,  # [runs] start_slots
            clock=clock,
            # each run's gate at approval-required (with the task that delegated it here), and its end
            approvals=RunGates(approvals, partial(tasks_store.delegated_by, db)),
            events=events,
        )
        peers = PeerClient(db, own_env_id=env_id, clock=clock, events=events)
        forwarder = Forwarder(peers, own_env_id=env_id)
        placement = Placement(  # capacity reports and `auto` (peerd/placement/); GET /v1/fleet
            db,
            settings.placement,
            env_id=env_id,
            label=label or env_id,
            providers=lambda: registry.available(providers),
            readers=readers_for(self.paths.home),
            peers=peers,
            clock=clock,
        )
        # Thread moves (peerd/handoff/): a thread with a move takes no new sends (`before_send`).
        move_guard = MoveGuard(db, self.feed, clock=clock)
        ops = Operations(
            db,
            self.feed,
            runs,
            worktrees_dir=self.paths.worktrees,
            forwarder=forwarder,
            clock=clock,
            events=events,
            placement=placement,
            before_send=move_guard.guard_send,
            link_may_use=lambda provider: link_may_use(self.config.settings, provider),
            provider_installed=lambda provider: registry.available(
                {name: p for name, p in providers.items() if name == provider}  # that one's PATH search only
            ).get(provider, False),
            awaiting_approval=partial(waiting_approval, db),
        )
        delegation = Delegation(
            db,
            self.feed,
            ops,
            runs,
            forwarder,
            env_id=env_id,
            clock=clock,
            events=events,
            hub=FeedHub(db, self.feed, capacity=placement.local_capacity),  # the box's feed answers
        )
        followers = FollowerPool(
            db, delegation, clock=clock, watch_chunk_s=self.config.watch_chunk_s, events=events
        )
        links = LinkService(
            db, identity, peers, label=label, advertised_urls=self.advertised_urls, clock=clock, events=events
        )
        handoff = HandoffService(ops, links, env_id=env_id, label=label)
        # One gh login's pace for every poller of a pull request here: the waits and the
        # orchestrations waiting on theirs (--until).
        gh_pace = GhPace(clock)
        # Orchestration (peerd/orchestrate/): the engine and the service load on first need.
        orchestrations = LazyOrchestrations(
            FrontParts(
                db,
                self.feed,
                ops,
                worktrees_dir=self.paths.worktrees,
                available=self._available_providers,
                approved=self.command_approved,
                models={n: p.model for n, p in settings.providers.items() if p.command is None},
                custom_commands={name: p.command for name, p in providers.items() if p.command is not None},
                clock=clock,
                gh_pace=gh_pace,
                pr_poll_s=settings.waits.poll_seconds,
            )
        )
        desk = ApprovalDesk(approvals, db, forwarder)
        # Waits on a pull request (peerd/waits/): watched through gh, delivered as a wake run.
        waits = Waits(
            db, self.feed, kick=runs.kick, clock=clock, poll_s=settings.waits.poll_seconds, pace=gh_pace
        )
        tools = ToolServices(ops, links, delegation, handoff, desk, waits)
        console = Console(
            settings.console,
            socket_path=self.paths.socket,
            env_id=env_id,
            label=label,
            gate=self.gate,
            now=clock,
        )
        return Parts(
            events=events,
            desc=desc,
            providers=providers,
            runs=runs,
            peers=peers,
            forwarder=forwarder,
            placement=placement,
            ops=ops,
            delegation=delegation,
            followers=followers,
            links=links,
            approvals=approvals,
            desk=desk,
            handoff=handoff,
            orchestrations=orchestrations,
            tools=tools,
            mcp=McpService(tools, loopback=loopback),
            a2a=LazyA2A(ops, label=label, allow_private_push=settings.a2a.allow_private_push),
            console=console,
            # Owned, owed or ending: every open run, task, approval and move, now and once a minute.
            sweeper=Sweeper(db, _sweep_hooks(runs, approvals, handoff, delegation, waits), clock=clock),
            waits=waits,
        )

    @staticmethod
    def _subscribe(p: Parts) -> None:
        """Who hears what (`peerd/events.py`): the only subscriptions of the daemon."""
        on = p.events.subscribe
        on(RunEnded, lambda e: p.delegation.on_run_end(e.thread_id))  # a local child's end settles its task
        on(RunQueued, lambda e: p.runs.kick(e.thread_id))  # an owed approval's continuation starts
        on(RunStarting, lambda e: p.mcp.warm())  # the MCP SDK loads (in a thread) on first need
        on(ThreadStopped, partial(_thread_stopped, p))  # its tasks stop too, and its waits end
        on(ThreadArchived, partial(_thread_archived, p))  # its waits end
        on(RemoteTaskChanged, p.followers.task_changed)  # the link's follower (re)reads the task
        on(LinkForgotten, p.followers.link_forgotten)  # its open tasks fail now
        on(PeerAnswered, p.followers.peer_answered)  # any answer from a box ends its backoff
        on(ClientRevoked, p.delegation.hub.client_revoked)  # its open long-polls end now
        on(LinkChecked, lambda e: p.placement.link_answered(e.env_id, e.answer))  # a live check's report
        on(CapacityReported, lambda e: p.placement.keep_from_feed(e.env_id, e.capacity))  # a feed answer's

    # --- serving them, in order -------------------------------------------------------------------------

    async def _serve(self, p: Parts) -> None:
        await p.peers.start()
        await self._serve_listeners(p)
        await p.console.start()  # a client of the owner socket; a busy port is logged, not fatal
        p.approvals.start()  # deadlines passed while this daemon was down deny at once
        await p.runs.kick_all()  # queued runs, continuations first
        await p.delegation.recover()  # local tasks whose child ended while the daemon was down
        await p.followers.start()  # every open remote task and owed stop is followed again
        await p.orchestrations.start()  # owed work: the engine loads, every open orchestration continues
        await p.handoff.start()  # every unfinished move resumes (to one live copy)
        await p.waits.start()  # every open wait on a pull request is watched again
        p.sweeper.start()
        await p.a2a.start()  # owed push notifications are delivered again, tasks on boxes followed again

    async def _serve_listeners(self, p: Parts) -> None:
        """The MCP loopback port, the owner socket, the agent socket, then the network listener."""
        if self.config.listen:
            # The network app (OAuth, link tokens: authlib, joserfc) only with a network listener,
            # imported off the event loop, before the owner socket is handed over (the early
            # `status` answers meanwhile; the full one lists every listener); issue 33.
            await import_in_thread(NETWORK_MODULE)
        self._runners.append(
            await start_tcp_listener(
                p.mcp, self.gate, self.config.listener_limits, shutdown_timeout_s=HTTP_SHUTDOWN_TIMEOUT_S
            )
        )
        await self._serve_unix(self._owner_app(p), self.paths.socket)
        agent = agent_app(p.tools)
        add_mcp_route(agent, p.mcp, "agent")
        await self._serve_unix(agent, self.paths.agent_socket, listed=False)
        if self.config.listen:
            assert self.identity is not None  # noqa: S101  # opened before the parts
            from peerd.api.agent_signin_routes import AGENT_SIGNIN  # noqa: PLC0415  # loaded above
            from peerd.api.remote import network_app  # noqa: PLC0415  # loaded above

            network = network_app(
                p.ops,
                p.desc,
                delegation=p.delegation,
                signing_key=self.identity.private_key,
                clock=self.clock,
                allow_private_metadata=self.config.settings.agents.allow_private_metadata_urls,
            )
            # Outside agents signed in over OAuth (issue 29; peerd/api/agent_signin.py).
            add_mcp_route(network, p.mcp, "network", signed_in=network[AGENT_SIGNIN].authenticate)
            add_approval_routes(network, p.desk)  # a link's own work's approvals
            add_box_routes(network)  # the side of a move a link calls
            add_a2a_routes(network, p.a2a, network=True)  # the card; A2A behind the link's token
            await self._serve_tcp(network, self.identity)

    def _owner_app(self, p: Parts) -> web.Application:
        """The owner socket's app: the local API and every feature's routes."""
        local = local_app(p.tools, p.desc, self.status, self, any_descendant=lambda: self.subreaper)
        add_git_routes(local)
        add_handoff_routes(local, p.handoff)
        add_orchestration_routes(local, p.orchestrations)
        add_wait_routes(local, p.waits)
        add_approval_routes(local, p.desk)
        add_placement_routes(local, p.placement)  # GET /v1/fleet
        add_mcp_route(local, p.mcp, "owner")
        add_signin_request_routes(local)  # outside agents' sign-ins the owner approves (issue 29)
        add_a2a_routes(local, p.a2a, network=False)  # A2A as the owner
        local[CONSOLE] = p.console  # POST /v1/console/login-token (`peerd console`)
        return local

    async def _open_store(self) -> Database:
        """The store, checked before it is opened (`boot.open_store`)."""
        return await open_store(self.paths, new_store=self.config.new_store)

    async def _serve_unix(self, app: web.Application, path: Path, *, listed: bool = True) -> None:
        early = self._early
        if early is not None and path == self.paths.socket:
            # The owner socket is bound already (or now, on a first start): its connections,
            # held ones included, go to this app from now on.
            if not early.bound:
                await early.bind()
            app[SHUTDOWN_GATE] = self.gate
            runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S)
            await runner.setup()
            assert runner.server is not None  # noqa: S101  # set by setup()
            early.handoff(cast("Callable[[], asyncio.Protocol]", runner.server))
            self._runners.append(runner)
            if listed:
                self._listeners.append(c.Listener(kind="unix", address=str(path), tls=False))
            return
        prepare_socket_path(self.paths.home, path)
        app[SHUTDOWN_GATE] = self.gate
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            await web.UnixSite(runner, str(path)).start()
        finally:
            os.umask(old_umask)
        self._runners.append(runner)
        if listed:
            self._listeners.append(c.Listener(kind="unix", address=str(path), tls=False))

    async def _serve_tcp(self, app: web.Application, identity: Identity) -> None:
        assert self.config.listen is not None  # noqa: S101  # checked by the caller
        host, port = parse_listen(self.config.listen, tls=self.config.tls)
        tls = None
        if self.config.tls:
            self.web_certificate = load_web_certificate(
                self.paths.home,
                identity.env_id,
                cert=self.config.settings.web_cert,
                key=self.config.settings.web_key,
            )
            tls = server_tls(identity, self.web_certificate)
        try:  # caps, timeouts and Host checks: peerd/api/listener.py
            app[SHUTDOWN_GATE] = self.gate
            runner = await start_tcp(
                app,
                host=host,
                port=port,
                tls=tls,
                limits=self.config.listener_limits,
                advertise=self.config.advertise,
                shutdown_timeout_s=HTTP_SHUTDOWN_TIMEOUT_S,
            )
        except OSError as exc:
            raise InvalidRequest(f"Cannot listen on {self.config.listen}: {exc.strerror or exc}.") from None
        self._runners.append(runner)
        for address in runner.addresses:
            bound_host, bound_port = address[0], address[1]
            shown = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
            scheme = "https" if self.config.tls else "http"
            self._listeners.append(c.Listener(kind="tcp", address=f"{scheme}://{shown}", tls=self.config.tls))

    async def _prune_receipts(self) -> None:
        """Idempotency receipts past their 7 days, and refresh tokens past their own expiry (a rotated
        token is kept until then, so a replay of it is still recognised and revokes the link)."""
        if self.db is None:
            return
        now = self.clock.wall()
        await receipts.prune(self.db, older_than=now - RECEIPT_RETENTION_S)
        async with self.db.write() as tx:
            await tx.execute("DELETE FROM refresh_tokens WHERE expires_at < ?", (now,))

    async def _prune_hourly(self) -> None:
        """Idempotency receipts are kept 7 days, also in a daemon that runs for months."""
        while True:
            await self.clock.sleep(PRUNE_EVERY_S)
            try:
                await self._prune_receipts()
            except Exception:
                log.exception("daemon.prune_failed")

    def advertised_urls(self) -> list[str]:
        """What a pairing code tells a laptop: `--advertise` addresses, else the bound listeners
        (a wildcard bind is shown as this host's name)."""
        if self.config.advertise:
            return list(self.config.advertise)
        urls = []
        for listener in self._listeners:
            if listener.kind != "tcp":
                continue
            url = listener.address
            for wildcard in ("0.0.0.0", "[::]"):  # noqa: S104  # recognising a wildcard, not binding one
                url = url.replace(f"//{wildcard}:", f"//{socket.gethostname()}:")
            urls.append(url)
        return urls

    async def _available_providers(self) -> dict[str, bool]:
        return registry.available(self.providers)

    async def command_approved(self, name: str, command: str) -> bool:
        """A custom command runs only as approved: named in the config file's allowlist (whose
        command text is in that same file), or approved with `peerd provider approve` for exactly
        this text."""
        if name in self.config.settings.approved_commands:
            return True
        return self.db is not None and await provider_approvals.is_approved(self.db, name, command)

    async def provider_list(self) -> list[c.ProviderInfo]:
        infos = [
            registry.describe(name, provider, self.command_approved)
            for name, provider in sorted(self.providers.items())
        ]
        return list(await asyncio.gather(*infos))

    async def provider_approve(self, name: str, req: c.ProviderApprove) -> c.ProviderApproveResult:
        provider = self.providers.get(name)
        command = None if provider is None else provider.command
        if provider is None or not isinstance(command, str):
            raise NotFound(
                f"No custom provider {name!r} in the config file; only custom commands need approval."
            )
        if req.command != command:
            raise Conflict(
                f"The command of {name!r} is not the one you were shown; it is now:\n  {command}\n"
                "Look again, then approve."
            )
        if self.db is None:
            raise Unavailable("The daemon is still starting.")
        await provider_approvals.approve(self.db, name, command, now=self.clock.wall())
        return c.ProviderApproveResult(name=name, command=command, approved=True)

    async def provider_revoke(self, name: str) -> c.ProviderApproveResult:
        provider = self.providers.get(name)
        command = None if provider is None else provider.command
        if self.db is None or not isinstance(command, str):
            raise NotFound(f"No custom provider {name!r} in the config file.")
        await provider_approvals.revoke(self.db, name)
        return c.ProviderApproveResult(
            name=name, command=command, approved=await self.command_approved(name, command)
        )

    def config_shown(self) -> dict[str, Any]:
        """The effective config: the file's settings with the command line's overrides applied."""
        shown = self.config.settings.shown()
        shown.update(
            {
                "label": self.config.label,
                "listen": self.config.listen or False,
                "tls": self.config.tls,
                "advertise": list(self.config.advertise),
                "home": str(self.paths.home),
                "source": self.config.settings.source,
            }
        )
        return shown

    async def status(self) -> c.Status:
        if self.db is None or self.identity is None:
            raise Unavailable("The daemon is still starting.")
        lost = await self.db.verify()  # one stat: is the file at the path still the store?
        store = c.StoreState(path=str(self.db.path))
        if lost is not None:
            saved = None if lost.saved_as is None else str(lost.saved_as)
            store = c.StoreState(state=lost.kind, path=store.path, message=lost.sentence(), saved_as=saved)
        pushes = None
        try:
            thread_count, live = await threads.counts(self.db)
            project_count = await projects.count(self.db)
            if self.parts is not None:  # A2A pushes given up lately: status and doctor warn
                pushes = await self.parts.a2a.given_up()
        except StorageUnavailable:
            if lost is None:
                raise
            # A store cut short under the daemon may not be readable any more: `status` still
            # answers, so `peerd doctor` can say what happened (its `store` field); counts unknown.
            thread_count, live, project_count = 0, 0, 0
        return c.Status(
            environment_id=self.identity.env_id,
            label=self.config.label,
            version=__version__,
            fingerprint=self.identity.fingerprint_text,
            web_fingerprint=None if self.web_certificate is None else self.web_certificate.fingerprint_text,
            listeners=list(self._listeners),
            counts=c.StatusCounts(projects=project_count, threads=thread_count, live_runs=live),
            home=str(self.paths.home),
            store=store,
            console=None if self.console is None else self.console.status(),
            a2a_pushes=pushes,
        )

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        log.info("daemon.stopping")
        p = self.parts
        if p is not None:
            await p.sweeper.close()
        # Requests answer `shutting_down` from now on; those in flight (long-polls, forwarded
        # calls waiting on a box) are answered so within a second, then long-polls elsewhere end.
        await self.gate.close()
        self.feed.close()
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        if p is not None:
            await p.a2a.close()
            await p.waits.stop()  # open waits stay recorded: the next start watches them again
            await p.followers.close()
            await p.orchestrations.close()  # recorded state is resumed at the next start
            await p.handoff.close()  # recorded steps resume at the next start
            await p.approvals.stop()  # pending approvals stay pending: the restart finds them
            await p.runs.shutdown()
            await p.console.close()
        if self._early is not None:  # the owner socket stops accepting; held requests are answered
            self._early.refuse_held("The daemon is stopping.")
            await self._early.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if p is not None:
            await p.mcp.close()
        if self._loopback is not None:
            self._loopback.close()  # bound, maybe never served (a start that failed)
        if p is not None:
            await p.peers.close()
        if self.db is not None:
            await self.db.close()
        if self._lock_file is not None:  # only the daemon holding the home lock owns the socket
            for path in (self.paths.socket, self.paths.agent_socket):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._lock_file.close()
        log.info("daemon.stopped")


def _sweep_hooks(
    runs: RunManager,
    approvals: ApprovalService,
    handoff: HandoffService,
    delegation: Delegation,
    waits: Waits,
) -> SweepHooks:
    """What the sweep of open work asks of the parts that own each kind of record."""

    async def cut_run(run_id: str, reason: str) -> None:
        await runs.cut_orphan(run_id, reason)

    async def withdraw(approval_id: str, reason: str) -> None:
        await approvals.withdraw(approval_id, reason)

    async def end_task(task_id: str, reason: str) -> None:
        await delegation.end(task_id, "failed", reason)

    return SweepHooks(
        owners=lambda: Owners(
            runs=runs.owned_runs(),
            questions=approvals.waiting(),
            moves=handoff.driving(),
            waits=frozenset(waits.watching()),
        ),
        cut_run=cut_run,
        start_queue=runs.kick,
        withdraw=withdraw,
        settle=delegation.on_run_end,
        end_task=end_task,
        resume_moves=handoff.start,
        resume_waits=waits.start,
    )


def ready_line(label: str, listeners: list[str], console: str | None) -> str:
    """`peerd serve`'s line on a terminal once it serves."""
    where = ", ".join(listeners)
    shown = f"; console {console} (`peerd console` prints a login link)" if console else ""
    return f"peerd {label} is ready: {where}{shown}"


async def serve(
    config: DaemonConfig,
    *,
    early: EarlyStart | None = None,
    import_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully (`peerd serve` comes through
    `boot.serve`, which answers `status` first: `early`; a signal its handlers took, `stop`, is
    not lost in the hand-over)."""
    daemon = Daemon(config, subreaper=peercred.become_subreaper())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.request_stop)
    handed_over: asyncio.Task[bool] | None = None
    if stop is not None:
        handed_over = asyncio.ensure_future(stop.wait())
        handed_over.add_done_callback(lambda task: None if task.cancelled() else daemon.request_stop())
    # systemd (Type=notify, see peerd/sdnotify.py): READY=1 once serving, watchdog pings, STOPPING=1.
    notifier = sdnotify.Notifier.from_env()
    watchdog: asyncio.Task[None] | None = None
    try:
        await daemon.start(early)
        if import_s is not None:
            log.info("daemon.imported_while_serving_status", seconds=round(import_s, 3))
        listeners = [listener.address for listener in daemon._listeners]
        notifier.ready(sdnotify.serving_status(config.label, listeners))
        if sys.stdout.isatty():  # a person started it: one line that says it is up, and where
            console = None if daemon.console is None else daemon.console.status().url
            sys.stdout.write(ready_line(config.label, listeners, console) + "\n")
            sys.stdout.flush()
        watchdog = asyncio.create_task(notifier.run_watchdog(), name="peerd.watchdog")
        await daemon.wait_stopped()
    finally:
        notifier.stopping()
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if handed_over is not None:
            handed_over.cancel()
        await daemon.shutdown()
