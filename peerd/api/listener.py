"""The TCP listener, hardened for the internet: caps, timeouts, quiet accept errors, `Host` checks.

A client that opens connections and then sends nothing (or a byte every few seconds) must not
take the descriptors the owner's socket, the database, runs and real links need. So:

- `Acceptor` runs peerd's own accept loop on the listening sockets and hands each accepted socket
  to the guard (`listener_connection.Guard`) at once: past a cap it is reset and closed before any
  TLS, else it is served with the TLS handshake and request deadlines there.
- A failed accept (EMFILE, ENFILE, ...) is logged at most once a second, with a count, and retried
  after ACCEPT_RETRY_S. asyncio's own accept loop (the Unix sockets) reports the same failure
  through the loop's exception handler, once per attempt, many times a second: `AcceptErrorFilter`
  paces those too.
- aiohttp's own request errors go to a logger paced the same way.
- The soft open-file limit is raised to the hard one at start; the total cap is half of it.
- `host_middleware` refuses a `Host` the listener does not answer to (`listener_rules.HostPolicy`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any, cast

import structlog
from aiohttp import hdrs, web
from yarl import URL

from peerd.api.app import Handler, error_response
from peerd.api.listener_connection import Guard
from peerd.api.listener_rules import LOOPBACK_ONLY, HostPolicy, ListenerLimits, Pacer
from peerd.errors import CapabilityDenied
from peerd.peer.webcert import ServerTls

__all__ = ["GUARD", "HOST_POLICY", "ListenerLimits", "host_middleware", "start_tcp"]

log = structlog.get_logger(__name__)

HOST_POLICY = web.AppKey("host_policy", HostPolicy)
GUARD = web.AppKey("listener_guard", Guard)  # the listener's connections (read by tests)
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
NOFILE_WHEN_UNLIMITED = 65536  # the soft limit to take when the hard one is "unlimited"
HTTP_LOGGER = "peerd.listener.http"  # aiohttp's RequestHandler logs here (paced)
ACCEPT_BACKLOG = 100  # the kernel's queue of connections not yet accepted
ACCEPT_BURST = 64  # accepts in a row before the accept loop lets other tasks run
ACCEPT_RETRY_S = 0.1  # after a failed accept (out of descriptors), wait this long


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit to the hard one (logged once); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_WHEN_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("listener.nofile_limit_unchanged", soft=soft, hard=hard, error=str(exc))
    if soft == resource.RLIM_INFINITY:
        soft = NOFILE_WHEN_UNLIMITED
    log.info("listener.nofile_limit", soft=soft, hard=hard)
    return soft


class AcceptErrorFilter:
    """The loop's exception handler: a failed accept is logged at most once a second, with how many
    were left out; everything else goes to the handler that was there before."""

    def __init__(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> None:
        self.previous = previous
        self.pacer = Pacer()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if "socket" in context and isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS:
            held = self.pacer.tick(loop.time())
            if held is not None:
                name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                log.warning("listener.accept_failed", error=name, left_out=held)
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)

    @classmethod
    def install(cls, loop: asyncio.AbstractEventLoop) -> None:
        if not isinstance(loop.get_exception_handler(), cls):  # one per loop, shared by listeners
            loop.set_exception_handler(cls(loop.get_exception_handler()))


class _PacedFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.pacer = Pacer()

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.pacer.tick(record.created)
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} similar left out)"
        return True


def http_logger() -> logging.Logger:
    logger = logging.getLogger(HTTP_LOGGER)
    if not any(isinstance(f, _PacedFilter) for f in logger.filters):
        logger.addFilter(_PacedFilter())
    return logger


async def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for HOST:PORT, as `loop.create_server` would make them (`start_tcp`
    serves them; bound first, a listener's address is known before what serves it is built)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(ACCEPT_BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Acceptor(asyncio.AbstractServer):
    """Listening sockets with peerd's own accept loops: each accepted socket goes to the guard at
    once, so one past a cap is closed before it has a transport (asyncio's own loop would accept a
    whole backlog, and make a transport for each, before any could be refused)."""

    def __init__(self, sockets: list[socket.socket], guard: Guard, loop: asyncio.AbstractEventLoop) -> None:
        self._sockets, self._guard, self._loop = sockets, guard, loop
        self._failures = Pacer()
        self._tasks = [loop.create_task(self._accept(sock)) for sock in sockets]

    @property
    def sockets(self) -> tuple[socket.socket, ...]:  # what `web.BaseRunner.addresses` reads
        return tuple(self._sockets)

    async def _accept(self, listening: socket.socket) -> None:
        try:
            await self._accept_forever(listening)
        finally:  # closed here, after asyncio has stopped watching it (a closed fd's number is reused)
            listening.close()

    async def _accept_forever(self, listening: socket.socket) -> None:
        burst = 0
        while True:
            try:
                sock, peer = await self._loop.sock_accept(listening)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue  # the client left before we took it
            except OSError as exc:  # EMFILE, ENFILE, ...: wait a little, say so once a second
                held = self._failures.tick(self._loop.time())
                if held is not None:
                    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                    log.warning("listener.accept_failed", error=name, left_out=held)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            self._guard.accepted(sock, peer)
            burst += 1
            if burst >= ACCEPT_BURST:  # a flood must not keep the rest of the daemon waiting
                burst = 0
                await asyncio.sleep(0)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()  # each closes its socket as it ends
        self._guard.close_all()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return any(not task.done() for task in self._tasks)

    async def start_serving(self) -> None:
        return None  # serving from the start

    async def serve_forever(self) -> None:
        await asyncio.gather(*self._tasks)

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are admitted by the guard and served through it (TLS too)."""

    __slots__ = ("_bound", "_guard", "_host", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: Guard,
        *,
        sockets: list[socket.socket] | None = None,
    ) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard, self._bound = host, port, guard, sockets

    @property
    def name(self) -> str:
        scheme = "https" if self._guard.tls else "http"
        return str(URL.build(scheme=scheme, host=self._host, port=self._port))

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._guard.server = self._runner.server
        AcceptErrorFilter.install(loop)  # for the Unix sockets, which asyncio accepts
        sockets = self._bound if self._bound is not None else await bind(self._host, self._port)
        self._server = Acceptor(sockets, self._guard, loop)


@web.middleware
async def host_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a `Host` the listener's policy does not know, before any handler (DNS rebinding)."""
    policy = request.app.get(HOST_POLICY, LOOPBACK_ONLY)
    if not policy.allows(request.headers.get(hdrs.HOST)):
        return error_response(
            CapabilityDenied(
                "This listener answers only its own names (localhost, loopback addresses and the "
                "--advertise names); the request named another host."
            )
        )
    return await handler(request)


async def start_tcp(
    app: web.Application,
    *,
    host: str,
    port: int,
    tls: ServerTls | None,
    limits: ListenerLimits,
    advertise: tuple[str, ...],
    shutdown_timeout_s: float,
    sockets: list[socket.socket] | None = None,
) -> web.AppRunner:
    """Serve `app` on HOST:PORT (or on `sockets`, bound to it already: `bind`) with the caps and
    timeouts; the runner's cleanup stops it all. An `OSError` from binding is raised after the
    runner is cleaned up."""
    nofile_soft = raise_nofile_limit()
    guard = Guard(limits, nofile_soft, tls, asyncio.get_running_loop())
    app[HOST_POLICY] = HostPolicy.for_bind(host, advertise)
    app.middlewares.insert(0, cast(Any, guard.middleware))  # outermost: it sees every answer
    app.middlewares.append(cast(Any, guard.inner_middleware))  # innermost: after the app's auth
    app[GUARD] = guard
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout_s,
        # A backstop only: our deadlines close idle connections first.
        keepalive_timeout=limits.idle_timeout_s + limits.head_timeout_s,
        logger=http_logger(),
        access_log=None,
    )
    await runner.setup()
    try:
        await GuardedSite(runner, host, port, guard, sockets=sockets).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
