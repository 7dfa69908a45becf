"""The TCP listener, hardened for the internet: caps, timeouts, quiet accept errors, `Host` checks.

A client that opens connections and then sends nothing (or a byte every few seconds) must not
take the descriptors the owner's socket, the database, runs and real links need. So:

- Each accepted TCP connection first meets `GuardedConnection.connection_made`, before any TLS:
  past a cap (`listener_rules.ConnectionGate`: total, per peer address, not yet authenticated) it
  is aborted there, which costs one accept and one close. An admitted one gets its TLS handshake
  (`loop.start_tls`, with a timeout) and is then handed to aiohttp's own `RequestHandler`, this
  wrapper forwarding the transport's events to it.
- Each connection has one deadline (`listener_rules.Timeline`) for what the client sends: the
  request head, the body, the idle time between requests. `track_middleware` (outermost in the
  app) tells the connection when a request's head is in and when its answer is written; when a
  deadline passes the connection is aborted. A connection counts as authenticated once a request
  carrying a link's token (`CALLER_KEY` set) has been answered.
- asyncio reports a failed `accept()` (EMFILE, ENFILE, ...) through the loop's exception handler,
  many times a second: `AcceptErrorFilter` logs it at most once a second with a count.
- aiohttp's own request errors go to a logger paced the same way.
- The soft open-file limit is raised to the hard one at start, and the total cap is half of it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import ssl
from collections.abc import Callable
from typing import Any, cast

import structlog
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

from peerd.api import local
from peerd.api.app import Handler, error_response
from peerd.api.listener_rules import (
    ACCEPT_BACKLOG,
    LOOPBACK_ONLY,
    ConnectionGate,
    HostPolicy,
    ListenerLimits,
    Pacer,
    Refusal,
    Timeline,
    address_key,
)
from peerd.errors import CapabilityDenied

__all__ = ["HOST_POLICY", "GuardedConnection", "ListenerLimits", "host_middleware", "start_tcp"]

log = structlog.get_logger(__name__)

HOST_POLICY = web.AppKey("host_policy", HostPolicy)
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
NOFILE_WHEN_UNLIMITED = 65536  # the soft limit to take when the hard one is "unlimited"
HTTP_LOGGER = "peerd.listener.http"  # aiohttp's RequestHandler logs here (paced)


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


class Guard:
    """One listener's connections: the gate, the live connections, and the request hooks."""

    def __init__(self, limits: ListenerLimits, nofile_soft: int, ssl_context: ssl.SSLContext | None) -> None:
        self.limits = limits
        self.gate = ConnectionGate.for_limits(limits, nofile_soft)
        self.ssl_context = ssl_context
        self.server: web.Server | None = None
        self.connections: set[GuardedConnection] = set()
        self.by_handler: dict[RequestHandler, GuardedConnection] = {}
        self._refusals = Pacer()

    def refused(self, reason: Refusal, loop: asyncio.AbstractEventLoop) -> None:
        held = self._refusals.tick(loop.time())
        if held is not None:
            log.warning(
                "listener.connection_refused",
                cap=str(reason),
                left_out=held,
                open=self.gate.total,
                unauthenticated=self.gate.unauthenticated,
            )

    def close_all(self) -> None:
        """At shutdown: connections aiohttp does not know yet (in their handshake) are dropped."""
        for conn in list(self.connections):
            conn.drop_if_unattached()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = self.by_handler.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.request_started(request)
        try:
            response = await handler(request)
            # Written here, so the idle time starts when the answer is out, not when it was built.
            if not response.prepared:
                await response.prepare(request)
            await response.write_eof()
            if local.CALLER_KEY in request:
                conn.mark_authenticated()
            return response
        finally:
            conn.request_answered()


class GuardedConnection(asyncio.Protocol):
    """The transport's protocol for one accepted connection; aiohttp's `RequestHandler` behind it."""

    def __init__(self, guard: Guard, loop: asyncio.AbstractEventLoop) -> None:
        self._guard = guard
        self._loop = loop
        self._key: str | None = None  # set once admitted
        self._handler: RequestHandler | None = None
        self._transport: asyncio.Transport | None = None  # the one the handler uses (TLS or raw)
        self._raw: asyncio.Transport | None = None
        self._early: list[bytes] = []  # data the TLS layer delivered before we attached the handler
        self._early_eof = False
        self._done = False
        self._authenticated = False
        self._timeline: Timeline | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._request: web.BaseRequest | None = None
        self._handshake: asyncio.Task[None] | None = None

    # -- asyncio.Protocol, before and after TLS ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = cast(asyncio.Transport, transport)  # the raw TCP one: start_tls does not call this again
        key = address_key(raw.get_extra_info("peername"))
        refusal = self._guard.gate.admit(key)
        if refusal is not None:
            self._done = True
            raw.abort()
            self._guard.refused(refusal, self._loop)
            return
        self._key, self._raw = key, raw
        self._guard.connections.add(self)
        if self._guard.ssl_context is None:
            self._attach(raw)
            return
        raw.pause_reading()  # nothing reaches this protocol before start_tls takes the transport
        self._handshake = self._loop.create_task(self._start_tls(raw, self._guard.ssl_context))

    def data_received(self, data: bytes) -> None:
        if self._handler is None:
            self._early.append(data)
            return
        self._on_bytes()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self._handler is None:
            self._early_eof = True
            return None
        self._handler.eof_received()
        return None

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        handler = self._handler
        self._finish()
        if handler is not None:
            handler.connection_lost(exc)

    # -- TLS, attach, release ------------------------------------------------------------------

    async def _start_tls(self, raw: asyncio.Transport, ctx: ssl.SSLContext) -> None:
        limits = self._guard.limits
        tls: asyncio.Transport | None
        try:
            tls = await self._loop.start_tls(
                raw,
                self,
                ctx,
                server_side=True,
                ssl_handshake_timeout=limits.handshake_timeout_s,
                ssl_shutdown_timeout=limits.tls_shutdown_timeout_s,
            )
        except asyncio.CancelledError:  # shutdown
            self._handshake = None
            raw.abort()
            self._finish()
            raise
        except Exception:  # a failed or timed-out handshake: just close
            tls = None
        self._handshake = None  # before _finish, which would cancel this very task
        if tls is None or self._done:  # failed, or lost during or right after the handshake
            raw.abort()
            self._finish()
            return
        self._attach(tls)

    def _attach(self, transport: asyncio.Transport) -> None:
        server = self._guard.server
        assert server is not None  # noqa: S101  # set before the site accepts
        handler = server()
        self._handler, self._transport = handler, transport
        self._guard.by_handler[handler] = self
        self._timeline = Timeline.started(self._guard.limits, self._loop.time())
        self._arm()
        handler.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)
        if self._early_eof:
            handler.eof_received()

    def _finish(self) -> None:
        """Release the slot, once."""
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._handshake is not None:
            self._handshake.cancel()
        self._guard.connections.discard(self)
        if self._handler is not None:
            self._guard.by_handler.pop(self._handler, None)
        if self._key is not None:
            self._guard.gate.release(self._key, authenticated=self._authenticated)

    def drop_if_unattached(self) -> None:
        if self._handler is None:
            if self._raw is not None:
                self._raw.abort()
            self._finish()

    def _abort(self) -> None:
        transport = self._transport or self._raw
        if transport is not None:
            transport.abort()  # not close(): a TLS close would wait for the client's close_notify

    # -- deadlines -----------------------------------------------------------------------------

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._timeline.deadline if self._timeline is not None else None
        if deadline is not None and not self._done:
            self._timer = self._loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if self._timeline is None or self._done:
            return
        body_complete = self._request is not None and self._request.content.is_eof()
        if self._timeline.expired(self._loop.time(), body_complete=body_complete):
            log.debug("listener.timed_out", phase=str(self._timeline.phase))
            self._abort()
        else:
            self._arm()

    def _on_bytes(self) -> None:
        if self._timeline is not None:
            before = self._timeline.deadline
            self._timeline.on_bytes(self._loop.time())
            if self._timeline.deadline != before:
                self._arm()

    def request_started(self, request: web.BaseRequest) -> None:
        self._request = request
        if self._timeline is not None:
            self._timeline.on_request(self._loop.time(), body_complete=request.content.is_eof())
            self._arm()

    def request_answered(self) -> None:
        self._request = None
        if self._timeline is not None and not self._done:
            self._timeline.on_answered(self._loop.time())
            self._arm()

    def mark_authenticated(self) -> None:
        if not self._authenticated and not self._done:
            self._authenticated = True
            self._guard.gate.authenticated()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through `GuardedConnection` (TLS is done there)."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: Guard) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        scheme = "https" if self._guard.ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._guard.server = self._runner.server
        AcceptErrorFilter.install(loop)
        self._server = await loop.create_server(
            lambda: GuardedConnection(self._guard, loop), self._host, self._port, backlog=ACCEPT_BACKLOG
        )

    async def stop(self) -> None:
        await super().stop()
        self._guard.close_all()


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
    ssl_context: ssl.SSLContext | None,
    limits: ListenerLimits,
    advertise: tuple[str, ...],
    shutdown_timeout_s: float,
) -> web.AppRunner:
    """Serve `app` on HOST:PORT with the caps and timeouts; the runner's cleanup stops it all.
    An `OSError` from binding is raised after the runner is cleaned up."""
    nofile_soft = raise_nofile_limit()
    guard = Guard(limits, nofile_soft, ssl_context)
    app[HOST_POLICY] = HostPolicy.for_bind(host, advertise)
    app.middlewares.insert(0, cast(Any, guard.middleware))  # outermost: it sees every answer
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
        await GuardedSite(runner, host, port, guard).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
