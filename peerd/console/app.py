"""The console's aiohttp application: the guard, the error pages and every page's route."""

from __future__ import annotations

import structlog
from aiohttp import web

from peerd.console import approvals, boardpages, fleetpages, pages, stream, threads, work
from peerd.console.guard import guard, login, logout, security_headers, static, stop_streams
from peerd.console.owner import Owner
from peerd.console.render import page
from peerd.console.state import CONSOLE, ConsoleState, Handler
from peerd.errors import PeerdError, http_status

log = structlog.get_logger(__name__)

OWNER = pages.OWNER
# aiohttp's own refusals (no such page, a method a page does not take, a body too large), as pages.
STATUS_PAGES = {
    400: ("Bad request", "The console could not read that request."),
    403: ("Not allowed", "That is not allowed from here."),
    404: (
        "Not found",
        "There is no page at this address. A thread's address names its machine too: "
        "open threads from the Threads page or the Board.",
    ),
    405: (
        "Not here",
        "This address does not take that kind of request; go back and use the page's own buttons.",
    ),
    413: ("Too large", "What was sent is larger than the console takes."),
}
MAX_FORM_BYTES = 256 * 1024


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A typed error from the API is a page with its code and sentence; anything else is logged
    and answered without details."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or request.headers.get("HX-Request"):
            raise
        title, message = STATUS_PAGES.get(exc.status, (exc.reason, f"The console answered {exc.status}."))
        return page(
            request, "error.html", title=title, status=exc.status, code=str(exc.status), message=message
        )
    except PeerdError as exc:
        status = http_status(exc.code)
        return page(
            request, "error.html", title="Not done", status=status, code=exc.code, message=exc.message
        )
    except Exception:
        log.exception("console.unhandled", method=request.method, path=request.path)
        return page(
            request,
            "error.html",
            title="Internal error",
            status=500,
            code=PeerdError.code,
            message="peerd hit an internal error; its log has the details.",
        )


def build_app(console: ConsoleState) -> web.Application:
    app = web.Application(middlewares=[errors, guard], client_max_size=MAX_FORM_BYTES)
    app[CONSOLE] = console
    assert console.client is not None  # noqa: S101  # Console.start opens it first
    app[OWNER] = Owner(console.client, env_id=console.env_id, label=console.label)
    app.on_response_prepare.append(security_headers)
    app.on_shutdown.append(stop_streams)
    root = console.root
    app.router.add_get(root + "/login", login)
    app.router.add_post(root + "/login", login)
    app.router.add_post(root + "/logout", logout)
    app.router.add_get(root + "/static/{name}", static)
    for module in (pages, threads, stream, work, approvals, boardpages, fleetpages):
        for method, path, handler in module.ROUTES:
            app.router.add_route(method, root + path, handler)
    return app
