"""The composition root: wires the store, identity, runs and listeners; recovers; shuts down.

Start-up order: take the home lock, load the identity, open and migrate the store, cut runs a
dead daemon left live (interrupted, and continued where owed: `store.threads.recover`), prune old
receipts, start the listeners, then start queued runs (continuations first).
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
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import structlog
from aiohttp import web

from peerd import __version__, sdnotify
from peerd import contracts as c
from peerd.api import peercred
from peerd.api import placement as placement_routes
from peerd.api.app import SHUTDOWN_GATE, ShutdownGate
from peerd.api.approvals import add_approval_routes
from peerd.api.gitwire import add_git_routes
from peerd.api.handoff import add_box_routes, add_handoff_routes
from peerd.api.listener import start_tcp
from peerd.api.local import local_app
from peerd.api.mcp_http import McpService, add_mcp_route, start_tcp_listener
from peerd.api.orchestrate import add_orchestration_routes
from peerd.api.remote import network_app
from peerd.api.tools import agent_app
from peerd.approvals import wiring as approvals_wiring
from peerd.approvals.desk import ApprovalDesk
from peerd.approvals.service import ApprovalService
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
from peerd.console.server import CONSOLE, Console
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
from peerd.handoff.service import HandoffService
from peerd.operations import Operations
from peerd.orchestrate.engine import Engine
from peerd.orchestrate.service import Orchestrations
from peerd.paths import Paths
from peerd.peer.client import PeerClient, check_url
from peerd.peer.forwarding import Forwarder
from peerd.peer.identity import Identity, load_or_create_identity, server_ssl_context
from peerd.peer.links import LinkService
from peerd.providers import registry
from peerd.providers.base import Provider
from peerd.providers.command import CommandProvider
from peerd.runtime.feed import ChangeFeed
from peerd.runtime.orphans import kill_orphaned_group
from peerd.runtime.runner import RunManager
from peerd.runtime.sweep import Sweeper, SweepHooks
from peerd.store import projects, provider_approvals, receipts, threads
from peerd.store import sweep as sweep_store
from peerd.store.db import Database
from peerd.store.threads import usage as usage_store
from peerd.tasks.delegation import Delegation
from peerd.tasks.follower import FollowerPool
from peerd.tasks.watch import client_key

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


class Daemon:
    def __init__(self, config: DaemonConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
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
        self.db: Database | None = None
        self.runs: RunManager | None = None
        self.peers: PeerClient | None = None
        self.followers: FollowerPool | None = None
        self._pruner: asyncio.Task[None] | None = None
        self._stopped = False
        self.feed = ChangeFeed(clock=clock)
        self.providers: dict[str, Provider] = {}
        self.orchestrations: Orchestrations | None = None
        self.handoff: HandoffService | None = None
        self.approvals: ApprovalService | None = None
        self.sweeper: Sweeper | None = None  # the sweep of open work (peerd/runtime/sweep.py)
        self.mcp = McpService()  # agent tools over MCP: /mcp on both sockets and a loopback port
        self.console: Console | None = None  # the browser console (peerd/console/), its own listener
        # Under `peerd serve` the daemon is a child subreaper, so every process below it is one it
        # started, and the owner socket refuses them all (peerd/api/peercred.py).
        self.subreaper = False
        self._early: EarlyStart | None = None  # `peerd serve`'s early owner socket (peerd/boot.py)

    def request_stop(self) -> None:
        self._stop.set()

    def _take_lock(self) -> None:
        self._lock_file = take_lock(self.paths)

    async def start(self, early: EarlyStart | None = None) -> None:
        """Build and wire everything. With `early` (`peerd serve`, peerd/boot.py), the home lock,
        the store and the owner socket are already its, and the socket already answers `status`;
        its held requests are handed to the local app once that is built."""
        self._early = early
        for url in self.config.advertise:
            check_url(url)  # a pairing code must never carry an address the laptop would refuse
        if early is not None and early.lock is not None and early.db is not None:
            self._lock_file, self.db = early.lock, early.db
        else:
            self._take_lock()
            self.db = await self._open_store()
        db = self.db
        # [prices]: what a run whose CLI reports no cost is estimated to cost (store/threads/usage.py)
        usage_store.use_prices(db, self.config.settings.price_table(), self.config.settings.default_models())
        try:
            identity = load_or_create_identity(self.paths.home)
        except OSError as exc:
            raise home_unusable(self.paths.home, exc) from None
        if early is not None and early.identity not in (None, (identity.env_id, identity.fingerprint_text)):
            log.warning("daemon.identity_changed_while_starting", env_id=identity.env_id)
        self.identity = identity
        clock = self.clock
        now = clock.wall()
        for run_id, pgid in await threads.live_run_groups(db):
            if kill_orphaned_group(pgid, run_id):
                log.info("daemon.killed_orphan", run_id=run_id, pgid=pgid)
        # Runs a crash cut: interrupted, saying where, and continued where the run rules say
        # (owed wakes; delegated children unless `continue_cut_runs = false`), recorded before
        # anything starts; `kick_all` below starts the continuations first.
        recovered = await threads.recover(
            db,
            now=now,
            label=self.config.label,
            continue_children=self.config.settings.continue_cut_runs,
        )
        if recovered:
            log.info("daemon.recovered_runs", count=len(recovered))
        # A question outlives no run: those of the runs just cut are withdrawn before anything is
        # served (peerd/core/liveness.py; the sweep below keeps it so while the daemon runs).
        withdrawn = await sweep_store.withdraw_orphaned_questions(db, now=now)
        if withdrawn:
            log.info("daemon.withdrew_questions", count=len(withdrawn), approvals=withdrawn)
        await self._prune_receipts()
        self._pruner = asyncio.create_task(self._prune_hourly(), name="peerd.prune")
        providers = registry.build(self.config.settings, self.command_approved)
        self.providers = providers
        socket_path = self.paths.socket
        # The loopback MCP listener first: runs are given its address (peerd/api/mcp_http.py).
        self._runners.append(
            await start_tcp_listener(
                self.mcp, self.gate, self.config.listener_limits, shutdown_timeout_s=HTTP_SHUTDOWN_TIMEOUT_S
            )
        )
        self.runs = RunManager(
            db,
            self.feed,
            providers,
            state_dir=self.paths.provider_state,
            # Runs get the agent socket only: the owner socket is never theirs (api/tools.py).
            tool_env={"PEERD_SOCKET": str(self.paths.agent_socket), "PEERD_MCP_URL": self.mcp.url or ""},
            home=self.paths.home,
            links=self.config.settings.links,  # what a link's runs may use (runtime/sandbox.py)
            label=self.config.label,  # named in the reason of a run a stop of this daemon cuts
            continue_cut_runs=self.config.settings.continue_cut_runs,
            start_slots=self.config.settings.runs.start_slots,  # [runs] start_slots
            clock=clock,
        )
        desc = c.Descriptor(
            env_id=identity.env_id, label=self.config.label, version=__version__, capabilities=CAPABILITIES
        )
        self.peers = PeerClient(db, own_env_id=identity.env_id, clock=clock)
        await self.peers.start()
        forwarder = Forwarder(self.peers, own_env_id=identity.env_id)
        ops = Operations(
            db, self.feed, self.runs, worktrees_dir=self.paths.worktrees, forwarder=forwarder, clock=clock
        )
        ops.link_may_use = lambda provider: link_may_use(self.config.settings, provider)
        ops.provider_installed = lambda provider: registry.available(
            {name: p for name, p in self.providers.items() if name == provider}  # that one's PATH search only
        ).get(provider, False)
        delegation = Delegation(db, self.feed, ops, self.runs, forwarder, env_id=identity.env_id, clock=clock)
        ops.delegation = delegation
        ops.on_stop = delegation.stop_children
        self.runs.on_run_end = delegation.on_run_end
        self.approvals = approvals_wiring.build(
            db,
            self.feed,
            self.config.settings.approvals,
            environment=self.config.label or identity.env_id,
            kick=self.runs.kick,
            clock=clock,
        )
        self.runs.approvals = approvals_wiring.gates(self.approvals, db)
        self.runs.on_approvals_end = lambda run_id, cut: self.approvals_service().run_ended(run_id, cut=cut)
        self.followers = FollowerPool(db, delegation, clock=clock, watch_chunk_s=self.config.watch_chunk_s)
        link_service = LinkService(
            db,
            identity,
            self.peers,
            label=self.config.label,
            advertised_urls=self.advertised_urls,
            clock=clock,
        )
        link_service.on_unlink = self.followers.notify
        link_service.on_client_revoked = lambda client_id: self.feed.changed(client_key(client_id))
        # Thread moves (peerd/handoff/): driven from here; a thread with a move takes no new sends.
        self.handoff = HandoffService(ops, link_service, env_id=identity.env_id, label=self.config.label)
        ops.before_send = self.handoff.guard_send
        engine = Engine(
            db,
            self.feed,
            ops,
            worktrees_dir=self.paths.worktrees,
            assign_more=lambda request, packets: self.orchestrations_service().assign_more(request, packets),
            clock=clock,
        )
        self.orchestrations = Orchestrations(
            db,
            self.feed,
            engine,
            available=self._available_providers,
            approved=self.command_approved,
            custom_commands={
                name: p.command for name, p in providers.items() if isinstance(p, CommandProvider)
            },
            models={n: p.model for n, p in self.config.settings.providers.items() if p.command is None},
            clock=clock,
        )
        local = local_app(ops, desc, self.status, link_service, self, any_descendant=lambda: self.subreaper)
        add_git_routes(local)
        add_handoff_routes(local, self.handoff)
        add_orchestration_routes(local, self.orchestrations)
        desk = ApprovalDesk(self.approvals, db, forwarder)
        add_approval_routes(local, desk)
        placement_routes.attach(  # capacity reports and `auto` (peerd/placement/); GET /v1/fleet
            local,
            self.config.settings.placement,
            env_id=identity.env_id,
            label=self.config.label or identity.env_id,
            home=self.paths.home,
            providers=providers,
            peers=self.peers,
            links=link_service,
            followers=self.followers,
            clock=clock,
        )
        self.mcp.attach(ops, link_service)
        add_mcp_route(local, self.mcp, "owner")
        self.console = Console(
            self.config.settings.console,
            socket_path=socket_path,
            env_id=identity.env_id,
            label=self.config.label,
            gate=self.gate,
            now=clock,
        )
        local[CONSOLE] = self.console  # POST /v1/console/login-token (`peerd console`)
        await self._serve_unix(local, socket_path)
        agent = agent_app(ops, link_service)
        add_mcp_route(agent, self.mcp, "agent")
        await self._serve_unix(agent, self.paths.agent_socket, listed=False)
        if self.config.listen:
            network = network_app(ops, desc, signing_key=identity.private_key, clock=clock)
            add_approval_routes(network, desk)  # a link's own work's approvals
            add_box_routes(network)  # the side of a move a link calls
            await self._serve_tcp(network, identity)
        await self.console.start()  # a client of the owner socket; a busy port is logged, not fatal
        self.approvals.start()  # deadlines passed while this daemon was down deny at once
        await self.runs.kick_all()
        await delegation.recover()
        await self.followers.start()  # every open remote task and owed stop is followed again
        await engine.recover()  # every open orchestration continues where it was
        await self.handoff.start()  # every unfinished move resumes (to one live copy)
        # Owned, owed or ending: every open run, task, approval and move, now and once a minute.
        self.sweeper = Sweeper(db, self._sweep_hooks(delegation), clock=clock)
        self.sweeper.start()
        self.mcp.warm()  # the MCP SDK is imported in a thread from now on, not before `status` answers
        log.info(
            "daemon.ready",
            env_id=identity.env_id,
            label=self.config.label,
            listeners=[listener.address for listener in self._listeners],
        )

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
        ssl_ctx = server_ssl_context(identity) if self.config.tls else None
        try:  # caps, timeouts and Host checks: peerd/api/listener.py
            app[SHUTDOWN_GATE] = self.gate
            runner = await start_tcp(
                app,
                host=host,
                port=port,
                ssl_context=ssl_ctx,
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

    def _sweep_hooks(self, delegation: Delegation) -> SweepHooks:
        runs, approvals, handoff = self.runs, self.approvals, self.handoff
        if runs is None or approvals is None or handoff is None:
            raise RuntimeError("the sweep is wired after the run manager, approvals and moves")

        async def cut_run(run_id: str, reason: str) -> None:
            await runs.cut_orphan(run_id, reason)

        async def withdraw(approval_id: str, reason: str) -> None:
            await approvals.withdraw(approval_id, reason)

        async def end_task(task_id: str, reason: str) -> None:
            await delegation.end(task_id, "failed", reason)

        return SweepHooks(
            owners=lambda: Owners(
                runs=runs.owned_runs(), questions=approvals.waiting(), moves=handoff.driving()
            ),
            cut_run=cut_run,
            start_queue=runs.kick,
            withdraw=withdraw,
            settle=delegation.on_run_end,
            end_task=end_task,
            resume_moves=handoff.start,
        )

    def approvals_service(self) -> ApprovalService:
        if self.approvals is None:
            raise Unavailable("The daemon is still starting.")
        return self.approvals

    def orchestrations_service(self) -> Orchestrations:
        if self.orchestrations is None:
            raise Unavailable("The daemon is still starting.")
        return self.orchestrations

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
        command = getattr(provider, "command", None)
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
        command = getattr(provider, "command", None)
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
        try:
            thread_count, live = await threads.counts(self.db)
            project_count = await projects.count(self.db)
        except StorageUnavailable:
            if lost is None:
                raise
            # A store cut short under the daemon may not be readable any more: `status` still
            # answers, so `peerd doctor` can say what happened (its `store` field); counts unknown.
            thread_count, live, project_count = 0, 0, 0
        return c.Status(
            env_id=self.identity.env_id,
            label=self.config.label,
            version=__version__,
            fingerprint=self.identity.fingerprint_text,
            listeners=list(self._listeners),
            counts=c.StatusCounts(projects=project_count, threads=thread_count, live_runs=live),
            home=str(self.paths.home),
            store=store,
        )

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        log.info("daemon.stopping")
        if self.sweeper is not None:
            await self.sweeper.close()
        # Requests answer `shutting_down` from now on; those in flight (long-polls, forwarded
        # calls waiting on a box) are answered so within a second, then long-polls elsewhere end.
        await self.gate.close()
        self.feed.close()
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        if self.followers is not None:
            await self.followers.close()
        if self.orchestrations is not None:
            await self.orchestrations.engine.close()  # recorded state is resumed at the next start
        if self.handoff is not None:
            await self.handoff.close()  # recorded steps resume at the next start
        if self.approvals is not None:
            await self.approvals.stop()  # pending approvals stay pending: the restart finds them
        if self.runs is not None:
            await self.runs.shutdown()
        if self.console is not None:
            await self.console.close()
        if self._early is not None:  # the owner socket stops accepting; held requests are answered
            self._early.refuse_held("The daemon is stopping.")
            await self._early.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        await self.mcp.close()
        if self.peers is not None:
            await self.peers.close()
        if self.db is not None:
            await self.db.close()
        if self._lock_file is not None:  # only the daemon holding the home lock owns the socket
            for path in (self.paths.socket, self.paths.agent_socket):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._lock_file.close()
        log.info("daemon.stopped")


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
    daemon = Daemon(config)
    daemon.subreaper = peercred.become_subreaper()
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
