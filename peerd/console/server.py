"""The console's listener: started and stopped with the daemon (`Daemon.start`/`shutdown`);
every request passes `console/guard.py:guard` first.

The listener is plain HTTP on loopback (default 127.0.0.1:7434) or HTTPS with `console.tls_cert`
and `console.tls_key` (required off loopback). A port already in use does not stop the daemon:
the console is then unavailable, the log says why, and `peerd console` repeats it. No access log:
the login URL carries a token.

The socket is bound at start (so `peerd status` says where), but the console's pages (its app, the
templates' engine, the Markdown parser) load on its first connection (issue 33: an idle daemon
nobody opens the console of does not pay for them): until then the listening socket only queues
connections, and the first one makes the app load in a thread, then served from that socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl

import structlog
from aiohttp import web

from peerd.api.localclient import LocalClient
from peerd.console import rules
from peerd.console.state import ConsoleState
from peerd.core import console_bind
from peerd.errors import InvalidRequest
from peerd.runtime.background import import_in_thread

log = structlog.get_logger(__name__)

SHUTDOWN_TIMEOUT_S = 1.0
BACKLOG = 128  # as aiohttp's sites
APP_MODULE = "peerd.console.app"  # the pages: loaded on the first connection


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound and listening sockets for every address `host` names, as `loop.create_server` makes
    them (SO_REUSEADDR; an IPv6 socket takes IPv6 only); an OSError when one cannot bind."""
    infos = dict.fromkeys(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    made: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


def unavailable_app(reason: str) -> web.Application:
    """What the console answers when its pages could not load: 503 and why (the log has more)."""

    async def answer(_: web.Request) -> web.Response:
        return web.Response(status=503, text=reason)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


class Console(ConsoleState):
    """One daemon's console: its state (`ConsoleState`) and its listener."""

    async def start(self) -> None:
        """Bind, unless the console is off; the pages load on the first connection (`_load`). A
        refused bind raises; a busy port is logged."""
        if not self.settings.enabled:
            return
        try:
            host, port = console_bind.parse_bind(self.settings.listen, tls=self.settings.tls)
        except console_bind.BindRefused as exc:
            raise InvalidRequest(str(exc)) from None
        self.ssl_context = self._ssl_context() if self.settings.tls else None
        try:
            try:
                sockets = listening_sockets(host, port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or port == 0:
                    raise
                # Another daemon on this machine (or anything else) has the port: take a free one,
                # and say so (`peerd status` prints where, `peerd doctor` warns).
                sockets = listening_sockets(host, 0)
                self.moved = True
                self.problem = (
                    f"console.listen {self.settings.listen} was taken (another peerd on this machine?); "
                    "the console listens on a free port instead, which changes at each start: set "
                    "console.listen in config.toml to a free port of your own to keep one."
                )
                log.warning("console.port_taken", listen=self.settings.listen)
        except OSError as exc:
            self.problem = (
                f"The console could not listen on {self.settings.listen}: {exc.strerror or exc}. "
                "Set console.listen in config.toml to a free port and restart peerd."
            )
            log.warning("console.not_listening", listen=self.settings.listen, error=exc.strerror or str(exc))
            return
        self.sockets = sockets
        bound_port = self.port = int(sockets[0].getsockname()[1])
        self.site = rules.site_for(
            host, bound_port, tls=self.settings.tls, public_url=self.settings.public_url
        )
        loop = asyncio.get_running_loop()
        for sock in sockets:  # readable: a connection waits to be accepted
            loop.add_reader(sock.fileno(), self._first_connection)
        log.info("console.listening", url=self.site.base_url)

    @property
    def loaded(self) -> bool:
        """Whether the pages are loaded and served (after the first connection)."""
        return self._runner is not None

    def _first_connection(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            loop.remove_reader(sock.fileno())
        if self.loading is None and not self.closed:
            self.loading = loop.create_task(self._load(), name="peerd.console.load")

    async def _load(self) -> None:
        """The pages, imported in a thread, then served from the sockets bound at start (the
        connections that waited meanwhile are answered by them)."""
        try:
            module = await import_in_thread(APP_MODULE)
            client = LocalClient(self.socket_path)
            await client.__aenter__()
            self.client = client
            app = module.build_app(self)
        except Exception:
            log.exception("console.load_failed")
            app = unavailable_app("peerd's console could not load; peerd's log says why.")
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        self._runner = runner
        try:
            for sock in self.sockets:
                await web.SockSite(runner, sock, ssl_context=self.ssl_context, backlog=BACKLOG).start()
        except OSError:
            log.exception("console.serve_failed")
            self.problem = "The console could not serve on its socket; peerd's log says why."
            return
        log.info("console.loaded")

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.settings.tls_cert is not None and self.settings.tls_key is not None  # noqa: S101
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.settings.tls_cert, self.settings.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequest(
                f"The console's certificate or key cannot be loaded ({self.settings.tls_cert}, "
                f"{self.settings.tls_key}): {getattr(exc, 'strerror', None) or exc}."
            ) from None
        return ctx

    async def close(self) -> None:
        self.closed = True
        self.sessions.end_all()
        self.drop_streams()
        if self.loading is not None and not self.loading.done():
            self.loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # logged by `_load`
                await self.loading
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        loop = asyncio.get_running_loop()
        for sock in self.sockets:  # never served (no connection came); a served one is closed above
            if sock.fileno() != -1:
                loop.remove_reader(sock.fileno())
                sock.close()
        self.sockets = []
        if self.client is not None:
            await self.client.__aexit__(None, None, None)
            self.client = None
        self.site = None
