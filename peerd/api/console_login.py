"""What the owner API knows of the browser console: `POST /v1/console/login-token` asks it for a
one-time login URL (`peerd console`). The console (`console/server.py:Console`) is put on the local
app under `CONSOLE` by the daemon; the API never imports the console."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from peerd import contracts as c


class LoginToken(c.Wire):
    """`POST /v1/console/login-token`: the console's URL with a one-time login token in it."""

    url: str
    expires_at: float


class ConsoleLogin(Protocol):
    def login_token(self) -> LoginToken:
        """A one-time login URL, or `NotFound` saying why the console is not listening."""
        ...


CONSOLE: web.AppKey[ConsoleLogin] = web.AppKey("console_login")
