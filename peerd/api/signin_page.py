"""The sign-in page an outside agent opens (api/agent_signin.py): static HTML a person reads, with
the form where they type an agent pairing code.

No script at all, inline or not: `Content-Security-Policy: default-src 'none'; form-action 'self'
<the redirect URI's origin>; frame-ancestors 'none'; base-uri 'none'` (the 303 after the form is a
form action too, so its origin is allowed). `X-Frame-Options: DENY`, `no-store`, no referrer to other origins. The
form carries a double-submit CSRF token: a random cookie (`HttpOnly`, `SameSite=Strict`, scoped to
the form's path) that a hidden field repeats.
"""

from __future__ import annotations

import html
import secrets
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from peerd.api.client_metadata import AgentClient

AUTHORIZE_PATH = "/oauth/authorize"
CSRF_COOKIE = "peerd_signin_csrf"
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Pragma": "no-cache",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make the form's Origin `null`
}


def render(
    request: web.Request,
    status: int,
    *,
    label: str,
    params: dict[str, str] | None = None,
    client: AgentClient | None = None,
    redirect_uri: str | None = None,
    error: str | None = None,
) -> web.Response:
    esc = html.escape
    action_to = "'self'"
    body = [f"<h1>Sign in to peerd on {esc(label)}</h1>"]
    if error is not None:
        body.append(f'<p role="alert"><strong>{esc(error)}</strong></p>')
    headers = dict(PAGE_HEADERS)
    if params is not None and client is not None and redirect_uri is not None:
        target = urlsplit(redirect_uri)
        if target.scheme in ("http", "https"):  # the 303 after the form must be allowed too
            action_to += f" {target.scheme}://{target.netloc}"
        else:
            action_to += f" {target.scheme}:"
        csrf = secrets.token_urlsafe(24)
        who = client.name or client.client_id
        hidden = "".join(
            f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">'
            for k, v in params.items()
            if k not in ("pairing_code", "csrf")
        )
        body.append(
            f"<p>The agent <strong>{esc(who)}</strong> asks to use this machine's peerd tools. "
            f"After you approve, it is sent back to <code>{esc(redirect_uri)}</code>.</p>"
            "<p>Type the code from <code>peerd pair --for agent --access LEVEL</code> on this machine; "
            "the agent gets that access level, for at most 30 days.</p>"
            f'<form method="post" action="{AUTHORIZE_PATH}">{hidden}'
            f'<input type="hidden" name="csrf" value="{csrf}">'
            '<label>Pairing code <input name="pairing_code" autocomplete="off" required autofocus></label> '
            '<button type="submit">Approve</button>'
            "<p>No code? Ask the machine's owner to approve this sign-in in peerd's console instead: "
            '<button type="submit" name="ask" value="1" formnovalidate>Ask the owner</button></p></form>'
        )
        response = _html(status, body, headers, action_to)
        response.set_cookie(
            CSRF_COOKIE,
            csrf,
            path=AUTHORIZE_PATH,
            secure=request.secure,
            httponly=True,
            samesite="Strict",
        )
        return response
    return _html(status, body, headers, action_to)


WAIT_PATH = AUTHORIZE_PATH + "/wait"
WAIT_COOKIE = "peerd_signin_wait"
POLL_S = 3


def render_waiting(
    request: web.Request, *, label: str, request_id: str, poll_secret: str | None
) -> web.Response:
    """The page a person watches while the owner decides in the console: it asks again every
    `POLL_S` seconds (a meta refresh; no script). `poll_secret`: set the browser's cookie now."""
    esc = html.escape
    again = f"{WAIT_PATH}?{urlencode({'request': request_id})}"
    body = [
        f"<h1>Sign in to peerd on {esc(label)}</h1>",
        f"<p>Waiting for the owner to approve this sign-in in peerd's console (request "
        f"<code>{esc(request_id)}</code>). This page looks again every {POLL_S} s; keep it open.</p>",
    ]
    response = _html(202, body, dict(PAGE_HEADERS), "'none'", refresh=f"{POLL_S};url={again}")
    if poll_secret is not None:
        response.set_cookie(
            WAIT_COOKIE,
            poll_secret,
            path=AUTHORIZE_PATH,
            secure=request.secure,
            httponly=True,
            samesite="Lax",
        )
    return response


def _html(
    status: int, body: list[str], headers: dict[str, str], action_to: str, *, refresh: str | None = None
) -> web.Response:
    headers["Content-Security-Policy"] = (
        f"default-src 'none'; form-action {action_to}; frame-ancestors 'none'; base-uri 'none'"
    )
    meta = "" if refresh is None else f'<meta http-equiv="refresh" content="{html.escape(refresh)}">'
    text = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}<title>peerd sign-in</title></head>'
        f"<body>{''.join(body)}</body></html>"
    )
    return web.Response(status=status, text=text, content_type="text/html", headers=headers)
