"""The console's listener: started and stopped with the daemon (`Daemon.start`/`shutdown`);
every request passes `console/guard.py:guard` first.

The listener is plain HTTP on loopback (default 127.0.0.1:7434) or HTTPS with `console.tls_cert`
and `console.tls_key` (required off loopback). A port already in use does not stop the daemon:
the console is then unavailable, the log says why, and `peerd console` repeats it. No access log:
the login URL carries a token.
"""

from __future__ import annotations

import errno
import ssl

import structlog
from aiohttp import web

from peerd.api.localclient import LocalClient
from peerd.console import rules
from peerd.console.app import build_app
from peerd.console.state import ConsoleState
from peerd.core import console_bind
from peerd.errors import InvalidRequest

log = structlog.get_logger(__name__)

SHUTDOWN_TIMEOUT_S = 1.0


class Console(ConsoleState):
    """One daemon's console: its state (`ConsoleState`) and its listener."""

    async def start(self) -> None:
        """Listen, unless the console is off. A refused bind raises; a busy port is logged."""
        if not self.settings.enabled:
            return
        try:
            host, port = console_bind.parse_bind(self.settings.listen, tls=self.settings.tls)
        except console_bind.BindRefused as exc:
            raise InvalidRequest(str(exc)) from None
        ssl_ctx = self._ssl_context() if self.settings.tls else None
        client = LocalClient(self.socket_path)
        await client.__aenter__()
        self.client = client
        runner = web.AppRunner(
            build_app(self), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, host, port, ssl_context=ssl_ctx).start()
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or port == 0:
                    raise
                # Another daemon on this machine (or anything else) has the port: take a free one,
                # and say so (`peerd status` prints where, `peerd doctor` warns).
                await web.TCPSite(runner, host, 0, ssl_context=ssl_ctx).start()
                self.moved = True
                self.problem = (
                    f"console.listen {self.settings.listen} was taken (another peerd on this machine?); "
                    "the console listens on a free port instead, which changes at each start: set "
                    "console.listen in config.toml to a free port of your own to keep one."
                )
                log.warning("console.port_taken", listen=self.settings.listen)
        except OSError as exc:
            await runner.cleanup()
            self.problem = (
                f"The console could not listen on {self.settings.listen}: {exc.strerror or exc}. "
                "Set console.listen in config.toml to a free port and restart peerd."
            )
            log.warning("console.not_listening", listen=self.settings.listen, error=exc.strerror or str(exc))
            return
        bound_port = self.port = int(runner.addresses[0][1])
        self.site = rules.site_for(
            host, bound_port, tls=self.settings.tls, public_url=self.settings.public_url
        )
        self._runner = runner
        log.info("console.listening", url=self.site.base_url)

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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.client is not None:
            await self.client.__aexit__(None, None, None)
            self.client = None
        self.site = None
