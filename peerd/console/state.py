"""The console's state, shared by its guard and pages: the settings, sessions and root path of this
daemon's console, its site once listening, its API client and its live streams; the app's keys.
`console/server.py:Console` adds the listener's start and stop; nothing here imports a page."""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from peerd.api.app import ShutdownGate
from peerd.api.console_login import LoginToken
from peerd.api.localclient import LocalClient
from peerd.config import ConsoleConfig
from peerd.console import rules
from peerd.console.auth import Session, Sessions
from peerd.contracts import ConsoleStatus
from peerd.errors import NotFound

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION = web.RequestKey("console_session", Session)


class ConsoleState:
    """One daemon's console as its pages see it: its settings, sessions, root path, site and API
    client (the listener itself is `console/server.py:Console`)."""

    def __init__(
        self,
        settings: ConsoleConfig,
        *,
        socket_path: Path,
        env_id: str,
        label: str,
        gate: ShutdownGate,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.socket_path = socket_path
        self.env_id = env_id
        self.label = label
        self.gate = gate
        self.sessions = Sessions(now=now)
        self.site: rules.Site | None = None
        self.root = "/c/" + secrets.token_urlsafe(12)  # every page is below it (the cookie's Path)
        self.port: int | None = None  # the bound port (console.listen may say 0)
        self.moved = False  # console.listen's port was taken: it listens on a free one
        self.problem: str | None = (
            None if settings.enabled else "The console is off here (console.enabled = false in config.toml)."
        )
        # Cookies are not kept apart by port: two consoles on one host need two names.
        self.cookie_name = "peerd_console_" + re.sub(r"[^A-Za-z0-9]", "", env_id)[:12]
        self.client: LocalClient | None = None
        self._runner: web.AppRunner | None = None
        self.sockets: list[socket.socket] = []  # bound at start (`console/server.py`)
        self.ssl_context: ssl.SSLContext | None = None
        self.loading: asyncio.Task[None] | None = None  # the pages' load, from the first connection
        self._streams: set[asyncio.Task[object]] = set()
        self.closed = False

    def status(self) -> ConsoleStatus:
        """What `peerd status` and `peerd doctor` say about the console."""
        if not self.settings.enabled:
            state = "off"
        elif self.site is None:
            state = "not_listening"
        else:
            state = "moved" if self.moved else "listening"
        return ConsoleStatus(
            state=state, url=None if self.site is None else self.site.base_url, note=self.problem
        )

    @property
    def url(self) -> str | None:
        """The console's address: its base URL and root path."""
        return None if self.site is None else self.site.base_url + self.root

    def login_token(self) -> LoginToken:
        if self.site is None:
            raise NotFound(self.problem or "The console is not listening.")
        token, expires = self.sessions.issue_token()
        return LoginToken(url=f"{self.url}/login?token={token}", expires_at=expires)

    def stream_started(self, task: asyncio.Task[object]) -> None:
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    def drop_streams(self) -> None:
        """End every live stream (browsers reconnect with Last-Event-ID); at shutdown, and in tests."""
        for task in list(self._streams):
            task.cancel()


CONSOLE = web.AppKey("console", ConsoleState)


def below_root(console: ConsoleState, path: str) -> str | None:
    """`path` relative to the console's root (`/threads`), or None when it is not below it."""
    if path == console.root:
        return "/"
    if path.startswith(console.root + "/"):
        return path[len(console.root) :]
    return None
