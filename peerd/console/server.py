"""The console's listener: started and stopped with the daemon, guarded, with its login.

Every request passes `guard` first: its Host must be the console's own (`rules.check_host`); while
the daemon stops, it is answered 503 at once; without a live session only `/login` and `/static/`
are served (a page redirects to the login page, anything else is 401); and a change (any method
but GET/HEAD) must come from the console's own origin (`rules.check_change`) and carry the
session's CSRF token (form field `csrf` or header `X-CSRF-Token`). Every answer says
`Cache-Control: no-store`, a strict Content-Security-Policy (scripts and styles from the console
only, nothing framed), `Referrer-Policy: same-origin` (never a URL to another site) and
`X-Content-Type-Options: nosniff`.

Every page lives below a root path that is random for each daemon start (`/c/<random>`), and the
session cookie's `Path` is that root: browsers do not keep cookies apart by port, so without it
any other web server on 127.0.0.1 that the browser visits (a dev server an agent started, say)
would receive the cookie. `/` itself only says to run `peerd console`.

The listener is plain HTTP on loopback (default 127.0.0.1:7434) or HTTPS with `console.tls_cert`
and `console.tls_key` (required off loopback). A port already in use does not stop the daemon:
the console is then unavailable, the log says why, and `peerd console` repeats it. No access log:
the login URL carries a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web

from peerd import contracts as c
from peerd.api.app import ShutdownGate
from peerd.api.localclient import LocalClient
from peerd.config import ConsoleConfig
from peerd.console import rules
from peerd.console.auth import Session, Sessions, csrf_ok
from peerd.errors import InvalidRequest, NotFound, PeerdError

log = structlog.get_logger(__name__)

STATIC = Path(__file__).parent / "static"
SHUTDOWN_TIMEOUT_S = 1.0
PUBLIC = ("/login",)  # below the root, served without a session (with the static files)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION = web.RequestKey("console_session", Session)


class LoginToken(c.Wire):
    """`POST /v1/console/login-token`: the console's URL with a one-time login token in it."""

    url: str
    expires_at: float


class Console:
    """One daemon's console: its settings, sessions, listener and API client."""

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
        self.problem: str | None = (
            None if settings.enabled else "The console is off here (console.enabled = false in config.toml)."
        )
        # Cookies are not kept apart by port: two consoles on one host need two names.
        self.cookie_name = "peerd_console_" + re.sub(r"[^A-Za-z0-9]", "", env_id)[:12]
        self.client: LocalClient | None = None
        self._runner: web.AppRunner | None = None
        self._streams: set[asyncio.Task[object]] = set()
        self.closed = False

    @property
    def url(self) -> str | None:
        """The console's address: its base URL and root path."""
        return None if self.site is None else self.site.base_url + self.root

    async def start(self) -> None:
        """Listen, unless the console is off. A refused bind raises; a busy port is logged."""
        if not self.settings.enabled:
            return
        try:
            host, port = rules.parse_bind(self.settings.listen, tls=self.settings.tls)
        except rules.BindRefused as exc:
            raise InvalidRequest(str(exc)) from None
        ssl_ctx = self._ssl_context() if self.settings.tls else None
        from peerd.console.app import build_app  # noqa: PLC0415  # the pages import the page modules

        client = LocalClient(self.socket_path)
        await client.__aenter__()
        self.client = client
        runner = web.AppRunner(
            build_app(self), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, ssl_context=ssl_ctx).start()
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


CONSOLE = web.AppKey("console", Console)


def _plain(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


def below_root(console: Console, path: str) -> str | None:
    """`path` relative to the console's root (`/threads`), or None when it is not below it."""
    if path == console.root:
        return "/"
    if path.startswith(console.root + "/"):
        return path[len(console.root) :]
    return None


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = request.app[CONSOLE]
    site = console.site
    if site is None:
        return _plain(503, "The console is stopping.")
    refusal = rules.check_host(site, request.headers.get("Host"))
    if refusal is not None:
        return _plain(refusal.status, refusal.reason)
    if console.gate.closing or console.closed:
        return _plain(503, "peerd is shutting down; reload this page once it is back.")
    change = rules.check_change(
        site, request.method, request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site")
    )
    if change is not None:
        log.warning("console.change_refused", path=request.path, origin=request.headers.get("Origin"))
        return _plain(change.status, change.reason)
    rel = below_root(console, request.path)
    if rel is None:
        return _plain(
            404, "Open the console at the URL `peerd console` prints (it has a one-time login token)."
        )
    if rel in PUBLIC or rel.startswith("/static/"):
        return await handler(request)
    session = console.sessions.get(request.cookies.get(console.cookie_name))
    if session is None:
        if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("Accept", "text/html"):
            if request.headers.get("HX-Request"):
                return web.Response(status=401, headers={"HX-Redirect": console.root + "/login"})
            raise web.HTTPSeeOther(console.root + "/login")
        return _plain(401, "You are not signed in: run `peerd console` and open the URL it prints.")
    if request.method not in rules.SAFE_METHODS:
        presented = request.headers.get("X-CSRF-Token")
        if presented is None and request.content_type in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ):
            field = (await request.post()).get("csrf")
            presented = field if isinstance(field, str) else None
        if not csrf_ok(session, presented):
            log.warning("console.csrf_refused", path=request.path)
            return _plain(403, "This form is out of date (its CSRF token does not match); reload the page.")
    request[SESSION] = session
    return await handler(request)


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers.setdefault("Content-Security-Policy", CSP)
    headers.setdefault("Cache-Control", "no-store")
    headers["Referrer-Policy"] = "same-origin"  # no-referrer would make forms send `Origin: null`
    headers["X-Content-Type-Options"] = "nosniff"
    headers["X-Frame-Options"] = "DENY"
    headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
    headers.setdefault("Cross-Origin-Resource-Policy", "same-origin")


def set_session_cookie(console: Console, response: web.StreamResponse, session_id: str) -> None:
    """`Secure` always: Chromium keeps Secure cookies from http://127.0.0.1 and http://localhost
    (secure contexts; the browser tests check it), recent Firefox from localhost, and behind
    `tailscale serve` the browser sees HTTPS."""
    response.set_cookie(
        console.cookie_name,
        session_id,
        path=console.root,
        secure=True,
        httponly=True,
        samesite="Strict",
        max_age=int(console.sessions.max_age_s),
    )


async def login(request: web.Request) -> web.StreamResponse:
    """`GET /login?token=...` (the URL `peerd console` prints) or `POST /login` (token pasted)."""
    from peerd.console.render import page  # noqa: PLC0415

    console = request.app[CONSOLE]
    if request.method == "POST":
        form = await request.post()
        raw = form.get("token")
        token = raw.strip() if isinstance(raw, str) else ""
    else:
        token = request.query.get("token", "")
    if not token:
        return page(request, "login.html", title="Sign in", status=200, failed=False)
    found = console.sessions.exchange(token)
    if found is None:
        log.warning("console.login_refused")
        return page(request, "login.html", title="Sign in", status=401, failed=True)
    session_id, _ = found
    log.info("console.login")
    # A page, not a redirect: a Strict cookie set during a navigation that began on another site
    # would not be sent on the redirected request; the page's own refresh is same-site.
    response = page(request, "signed_in.html", title="Signed in", status=200)
    set_session_cookie(console, response, session_id)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    console.sessions.end(request.cookies.get(console.cookie_name))
    response = web.HTTPSeeOther(console.root + "/login")
    response.del_cookie(console.cookie_name, path=console.root)
    raise response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound()
    kind = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}.get(path.suffix)
    response = web.FileResponse(path, headers={"Cache-Control": "max-age=3600"})
    if kind:
        response.content_type = kind
    return response


def shown_error(exc: PeerdError) -> str:
    return f"{exc.code}: {exc.message}"


async def stop_streams(app: web.Application) -> None:
    with contextlib.suppress(KeyError):
        app[CONSOLE].drop_streams()
