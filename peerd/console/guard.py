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
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import structlog
from aiohttp import web

from peerd.console import rules
from peerd.console.auth import csrf_ok
from peerd.console.render import page
from peerd.console.state import CONSOLE, SESSION, ConsoleState, Handler, below_root

log = structlog.get_logger(__name__)

STATIC = Path(__file__).parent / "static"
PUBLIC = ("/login",)  # below the root, served without a session (with the static files)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


TITLES = {401: "Not signed in", 403: "Refused", 404: "Not found", 503: "Unavailable"}


def _plain(status: int, text: str, request: web.Request | None = None) -> web.Response:
    """A refusal: a styled page for a browser (it asks for HTML), plain text for anything else
    (and always for a foreign Host: nothing of the console is shown to another site's name)."""
    if request is not None and "text/html" in request.headers.get("Accept", ""):
        title = TITLES.get(status, "Not done")
        return page(request, "error.html", title=title, status=status, code=str(status), message=text)
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = request.app[CONSOLE]
    site = console.site
    if site is None:
        return _plain(503, "The console is stopping.", request)
    refusal = rules.check_host(site, request.headers.get("Host"))
    if refusal is not None:
        return _plain(refusal.status, refusal.reason)
    if console.gate.closing or console.closed:
        return _plain(503, "peerd is shutting down; reload this page once it is back.", request)
    change = rules.check_change(
        site, request.method, request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site")
    )
    if change is not None:
        log.warning("console.change_refused", path=request.path, origin=request.headers.get("Origin"))
        return _plain(change.status, change.reason, request)
    rel = below_root(console, request.path)
    if rel is None:
        return _plain(
            404,
            "Open the console at the URL `peerd console` prints (it has a one-time login token).",
            request,
        )
    if rel in PUBLIC or rel.startswith("/static/"):
        return await handler(request)
    session = console.sessions.get(request.cookies.get(console.cookie_name))
    if session is None:
        if request.method in ("GET", "HEAD") and "text/html" in request.headers.get("Accept", "text/html"):
            if request.headers.get("HX-Request"):
                return web.Response(status=401, headers={"HX-Redirect": console.root + "/login"})
            raise web.HTTPSeeOther(console.root + "/login")
        return _plain(401, "You are not signed in: run `peerd console` and open the URL it prints.", request)
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
            return _plain(
                403, "This form is out of date (its CSRF token does not match); reload the page.", request
            )
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


def set_session_cookie(console: ConsoleState, response: web.StreamResponse, session_id: str) -> None:
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


async def stop_streams(app: web.Application) -> None:
    with contextlib.suppress(KeyError):
        app[CONSOLE].drop_streams()
