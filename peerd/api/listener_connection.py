"""One listener's connections: admission at accept, TLS, deadlines, and aiohttp behind each.

`Guard.accepted` is called with each socket the listener accepts, before anything else: when a
cap is full (`listener_rules.ConnectionGate`: total, per peer address, not yet authenticated) an
unauthenticated connection is evicted (aborted) to make room, the one least likely to be a link's
(`ConnectionGate.victim`); when there is none the new socket is reset and closed at once, before
any TLS and without a transport. An admitted one becomes a `GuardedConnection`: when the listener
holds two certificates, a peek at the ClientHello's first record (`core/tls_hello.sniff`: the bytes
stay in the socket for the TLS layer) chooses the one this client gets; then its TLS handshake
(`loop.start_tls`; the peek and the handshake share one timeout), then aiohttp's own
`RequestHandler`, to which it forwards the transport's events. Evictions and refusals together
are logged at most once a second.

Each connection has one deadline (`listener_rules.Timeline`) for what the client sends: the
request head, the body, the idle time between requests. `Guard.middleware` (outermost in the app)
tells the connection when a request's head is in and when its answer is written; when a deadline
passes the connection is aborted. A connection counts as authenticated (a link's) as soon as a
request's link token has been checked (`Guard.inner_middleware`, innermost, sees `CALLER_KEY` set
before the handler runs), or once a request carrying a caller has been answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import struct
from typing import cast

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from peerd.api.app import Handler
from peerd.api.context import CALLER_KEY
from peerd.api.listener_rules import (
    ConnectionGate,
    CrowdLog,
    ListenerLimits,
    Refusal,
    Timeline,
    address_key,
)
from peerd.core.tls_hello import MAX_RECORD, Cert, sniff
from peerd.peer.webcert import ServerTls

log = structlog.get_logger(__name__)

RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST, nothing lingers


def reset_and_close(sock: socket.socket) -> None:
    """Close now, with a reset: the descriptor is free at once and nothing lingers."""
    with contextlib.suppress(OSError):  # already reset by the client
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
    sock.close()


class Guard:
    """One listener's connections: the gate, the live connections, and the request hooks."""

    def __init__(
        self,
        limits: ListenerLimits,
        nofile_soft: int,
        tls: ServerTls | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.limits = limits
        self.gate = ConnectionGate.for_limits(limits, nofile_soft)
        self.tls = tls
        self.server: web.Server | None = None  # aiohttp's, once set up: makes each RequestHandler
        self.loop = loop
        self.connections: dict[int, GuardedConnection] = {}
        self.by_handler: dict[RequestHandler, GuardedConnection] = {}
        self._ids = itertools.count()
        self._crowded = CrowdLog()  # one line a second for evictions and refusals together
        self._starting: set[asyncio.Task[None]] = set()

    def accepted(self, sock: socket.socket, peername: object) -> None:
        """A socket the listener just accepted: refused at once past a cap, else served."""
        key = address_key(peername)
        conn_id = next(self._ids)
        admission = self.gate.admit(conn_id, key)
        if isinstance(admission, Refusal):
            self._refuse(sock, admission)
            return
        if admission.evicted is not None:
            self._evict(admission.evicted)
        conn = GuardedConnection(self, conn_id, sock)
        self.connections[conn_id] = conn
        task = self.loop.create_task(conn.start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _refuse(self, sock: socket.socket, reason: Refusal) -> None:
        reset_and_close(sock)
        self._log_crowded(reason)

    def _evict(self, conn_id: int) -> None:
        evicted = self.connections.get(conn_id)
        if evicted is not None:
            evicted.evict()
        self._log_crowded(None)

    def _log_crowded(self, refusal: Refusal | None) -> None:
        line = self._crowded.note(self.loop.time(), refusal)
        if line is not None:
            log.warning(
                "listener.crowded", **line, open=self.gate.total, unauthenticated=self.gate.unauthenticated
            )

    def close_all(self) -> None:
        """At shutdown: connections aiohttp does not know yet (in their handshake) are dropped."""
        for task in list(self._starting):
            task.cancel()
        for conn in list(self.connections.values()):
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
            try:
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()
            except ConnectionError:
                pass  # the client left; aiohttp's own finish notices it too, quietly
            if CALLER_KEY in request:
                conn.mark_authenticated()
            return response
        finally:
            conn.request_answered()

    @web.middleware
    async def inner_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Innermost: a request whose link token was checked (`CALLER_KEY` set by the app's auth)
        makes its connection a link's before the handler runs, so a long-poll, or a slow first
        request on a new connection, never waits as an unknown connection that could be evicted."""
        if CALLER_KEY in request:
            conn = self.by_handler.get(request.protocol)
            if conn is not None:
                conn.mark_authenticated()
        return await handler(request)


class GuardedConnection(asyncio.Protocol):
    """The transport's protocol for one accepted connection; aiohttp's `RequestHandler` behind it."""

    def __init__(self, guard: Guard, conn_id: int, sock: socket.socket) -> None:
        self._guard = guard
        self._loop = guard.loop
        self._id = conn_id  # admitted: holds a slot of the gate until _finish (or eviction)
        self._sock = sock  # the accepted socket: its descriptor is the slot
        self._started = False  # start() has handed the socket to asyncio
        self._evicted = False  # evicted while its transport was being made: closed once it is
        self._handler: RequestHandler | None = None
        self._transport: asyncio.Transport | None = None  # the one the handler uses (TLS or raw)
        self._raw: asyncio.Transport | None = None
        self._early: list[bytes] = []  # data the TLS layer delivered before we attached the handler
        self._early_eof = False
        self._done = False
        self._timeline: Timeline | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._request: web.BaseRequest | None = None
        self._handshake: asyncio.Task[None] | None = None
        self._ctx: ssl.SSLContext | None = None  # the certificate's context `_choose_tls` chose
        self._peeking: asyncio.Future[None] | None = None  # waiting for more of the ClientHello
        self._handshake_by = 0.0  # loop time: the peek and the handshake end by then

    # -- asyncio.Protocol, before and after TLS ------------------------------------------------

    async def start(self) -> None:
        """Make the transport for the accepted socket (this protocol's connection_made follows)."""
        if self._done:  # evicted before it started: its socket is closed already
            return
        self._started = True
        tls = self._guard.tls
        if tls is not None:
            self._handshake_by = self._loop.time() + self._guard.limits.handshake_timeout_s
            self._ctx = tls.identity
            if tls.web is not None:
                try:
                    cert = await self._choose_tls()
                except asyncio.CancelledError:  # shutdown
                    self._sock.close()
                    self._finish()
                    raise
                except (TimeoutError, OSError):  # no hello in time, or the socket failed
                    reset_and_close(self._sock)
                    self._finish()
                    return
                if cert is None:  # evicted while peeking: its socket is closed already
                    return
                self._ctx = tls.for_cert(cert)
        # Until connection_made its descriptor cannot be closed at once (while peeking it could).
        self._guard.gate.transport(self._id, ready=False)
        try:
            await self._loop.connect_accepted_socket(lambda: self, self._sock)
        except asyncio.CancelledError:
            self._sock.close()
            self._finish()
            raise
        except OSError:
            self._sock.close()
            self._finish()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = cast(asyncio.Transport, transport)  # the raw TCP one: start_tls does not call this again
        self._raw = raw
        self._guard.gate.transport(self._id, ready=True)
        if self._done or self._evicted:  # dropped at shutdown, or evicted, meanwhile
            raw.abort()  # connection_lost follows, then the descriptor is closed
            return
        if self._ctx is None:
            self._attach(raw)
            return
        raw.pause_reading()  # nothing reaches this protocol before start_tls takes the transport
        self._handshake = self._loop.create_task(self._start_tls(raw, self._ctx))

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

    async def _choose_tls(self) -> Cert | None:
        """Peek (never read) until the ClientHello's first record is in, then choose its
        certificate (`core/tls_hello.sniff`). The socket is still only ours: readiness is waited for
        with SO_RCVLOWAT at the bytes the record takes, so a hello trickling in wakes nobody until it
        is whole; by `_handshake_by`, or TimeoutError. None: evicted meanwhile."""
        seen, stale = -1, 0
        async with asyncio.timeout_at(self._handshake_by):
            while True:
                try:
                    data = self._sock.recv(MAX_RECORD, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    data = None
                if data == b"":  # the client left: the handshake sees it as it always did
                    return Cert.IDENTITY
                if data is not None and len(data) == seen:
                    # Woken with nothing new: the client closed after part of a hello, or this
                    # system's poll ignores the low-water mark. Look again later, by the deadline.
                    stale += 1
                    await self._readable(0, after_s=min(0.01 * 2**stale, 0.5))
                elif data is not None:
                    seen = len(data)
                    verdict = sniff(data)
                    if verdict.cert is not None:
                        return verdict.cert
                    await self._readable(verdict.need)
                else:
                    await self._readable(1)
                if self._done:  # evicted meanwhile (`evict` woke us)
                    return None

    async def _readable(self, low_water: int, *, after_s: float | None = None) -> None:
        """Until `low_water` bytes can be read (or `after_s` passed), or `evict` wakes it."""
        fd = self._sock.fileno()
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._peeking = waiter

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        if after_s is not None:
            timer = self._loop.call_later(after_s, wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self._peeking = None
            return
        with contextlib.suppress(OSError):  # where the system has no SO_RCVLOWAT: woken early
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, low_water)
        self._loop.add_reader(fd, wake)
        try:
            await waiter
        finally:
            self._peeking = None
            if self._sock.fileno() != -1:
                self._loop.remove_reader(fd)
                with contextlib.suppress(OSError):
                    self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    async def _start_tls(self, raw: asyncio.Transport, ctx: ssl.SSLContext) -> None:
        limits = self._guard.limits
        tls: asyncio.Transport | None
        try:
            tls = await self._loop.start_tls(
                raw,
                self,
                ctx,
                server_side=True,
                ssl_handshake_timeout=max(0.1, self._handshake_by - self._loop.time()),
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
            reset_and_close(self._sock)  # the descriptor free before the slot (see evict)
            self._finish()
            return
        self._attach(tls)

    def _attach(self, transport: asyncio.Transport) -> None:
        server = self._guard.server
        assert server is not None  # noqa: S101  # set before the listener accepts
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
        self._guard.connections.pop(self._id, None)
        if self._handler is not None:
            self._guard.by_handler.pop(self._handler, None)
        self._guard.gate.release(self._id)

    def evict(self) -> None:
        """Made room for a newer connection: abort it and close its descriptor now, before the
        listener accepts another (the gate has released its slot: the total cap counts
        descriptors). One whose transport is being made cannot be closed yet: connection_made
        aborts it, and its slot (`ConnectionGate.closing`) is released once it is closed."""
        if self._peeking is not None:  # peeking at its hello: the socket is still only ours
            if self._sock.fileno() != -1:
                self._loop.remove_reader(self._sock.fileno())
            reset_and_close(self._sock)
            self._finish()
            if not self._peeking.done():
                self._peeking.set_result(None)  # `_choose_tls` sees `_done` and stops
            return
        if self._started and self._raw is None and not self._done:
            self._evicted = True
            return
        if self._handler is not None:
            self._abort()  # its connection_lost follows and tells aiohttp
        elif self._raw is not None:
            self._raw.abort()
        if self._raw is not None or not self._started:
            # Aborted (the loop no longer watches the descriptor: its later close is a no-op) or
            # never handed to asyncio.
            reset_and_close(self._sock)
        self._finish()

    def drop_if_unattached(self) -> None:
        if self._handler is None:
            if self._raw is not None:
                self._raw.abort()
            if not self._started:  # its start() is cancelled before it runs: nothing else closes it
                self._sock.close()
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
        self._guard.gate.request(self._id, in_flight=True)
        if self._timeline is not None:
            self._timeline.on_request(self._loop.time(), body_complete=request.content.is_eof())
            self._arm()

    def request_answered(self) -> None:
        self._request = None
        self._guard.gate.request(self._id, in_flight=False)
        if self._timeline is not None and not self._done:
            self._timeline.on_answered(self._loop.time())
            self._arm()

    def mark_authenticated(self) -> None:
        if not self._done:
            self._guard.gate.authenticated(self._id)
