"""Outside agents sign in to the box's `/mcp` over OAuth 2.1 with PKCE (issue 29): the HTTP shell.

On the network listener (TLS; on loopback too when it listens there), as the MCP authorization
spec asks:

    GET  /.well-known/oauth-protected-resource[/mcp]  RFC 9728: this `/mcp`, its authorization server
    GET  /.well-known/oauth-authorization-server      RFC 8414: endpoints, S256 only, CIMD supported
    POST /oauth/register                              RFC 7591 dynamic registration (bounded, stored)
    GET  /oauth/authorize                             the sign-in page: type an agent pairing code
    POST /oauth/authorize                             the page's form (CSRF-checked): 303 to the client
    POST /oauth/token  grant_type=authorization_code  in peerd/api/oauth.py, which calls `exchange`

The client is a client ID metadata document (client_id is an https URL; fetched with SSRF guards,
`MetadataFetcher`) or a registered one. A client or redirect URI the box cannot vouch for is shown
on the page and never redirected to; every other error of the request goes back to the redirect URI
(RFC 6749 §4.1.2.1), with `state` and `iss` (RFC 9207). The person approves by typing a pairing
code the owner minted for agents (`peerd pair --for agent --access LEVEL`); wrong codes count toward
burning the code and the box's global pairing brake (`oauth.PAIRING_FAILURES_PER_WINDOW`), shared
with links' redemptions. The decisions are pure (`peerd.core.agent_oauth`); the codes are stored
hashed (`peerd.store.agent_signin`).

A signed-in agent is a client of the box of kind `agent`. On `/mcp` (`authenticate`, which
`peerd.api.mcp_http` calls for the network listener) its access token becomes a link caller
(`Caller.for_link`): capped at its level, fenced to the threads it started (and reading only
those: `own_threads_only`), and refused at once once revoked. A link's token is refused on `/mcp`,
and an agent's on `/v1/*` (peerd/api/remote.py).

The page is static HTML: a strict CSP (`default-src 'none'`, no script at all), `frame-ancestors
'none'`, no-store, and a double-submit CSRF token (a random cookie that the form repeats).
Nothing secret (pairing codes, authorization codes, verifiers, tokens) is logged or echoed.
"""

from __future__ import annotations

import html
import ipaddress
import json
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import structlog
from aiohttp import hdrs, web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field, RootModel

from peerd.api.app import SAME_ORIGIN_PATHS, error_response
from peerd.api.routes import Example, Route, add_routes
from peerd.core import agent_oauth as rules
from peerd.core.access import LinkContext, cap_for
from peerd.errors import (
    CapabilityDenied,
    InvalidClient,
    InvalidRequest,
    PairingReason,
    PairingRejected,
)
from peerd.operations import Caller
from peerd.peer.ratelimit import SlidingWindow
from peerd.peer.tokens import TokenRejected, VerifiedTokens
from peerd.store import agent_signin as store
from peerd.store import clients
from peerd.store.db import Database

log = structlog.get_logger(__name__)

MCP_PATH = "/mcp"
PRM_PATHS = ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp")
ASM_PATH = "/.well-known/oauth-authorization-server"
AUTHORIZE_PATH = "/oauth/authorize"
REGISTER_PATH = "/oauth/register"
CSRF_COOKIE = "peerd_signin_csrf"
METADATA_TIMEOUT_S = 5.0
MAX_METADATA_BYTES = 8192
MAX_REDIRECT_URIS = 10
MAX_URI_CHARS = 2000
REGISTRATIONS_PER_MINUTE = 30
_GLOBAL = "pairing"  # the same key as oauth.py's: one brake for links' and agents' codes
_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_PAGE_HEADERS = {
    **_NO_STORE,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_PRIVATE_SCHEME = "abcdefghijklmnopqrstuvwxyz0123456789+.-"

PAGE_PAIRING_TEXTS: dict[PairingReason, str] = {
    "unknown_code": "This box has no such agent pairing code. Run `peerd pair --for agent` there for one.",
    "wrong_secret": "The code does not match; copy the whole code again. A code is burnt after 5 wrong tries.",
    "expired": "This pairing code expired. Run `peerd pair --for agent` for a new one.",
    "used": "This pairing code was already used. Run `peerd pair --for agent` for a new one.",
    "burnt": "This pairing code was burnt after too many wrong tries. Run `peerd pair --for agent` again.",
    "cancelled": "This pairing code was cancelled. Run `peerd pair --for agent` for a new one.",
}


def origin_of(request: web.Request) -> str:
    """This listener as the caller reached it: the resource's origin."""
    return f"{request.scheme}://{request.host}"


def issuer_of(request: web.Request) -> str:
    """The issuer: the origin with its root path, `https://host:port/`. Clients compare `iss` and
    `issuer` as strings, some after URL normalization (which adds the `/`), some before: with the
    slash written out, both agree."""
    return origin_of(request) + "/"


@dataclass(frozen=True)
class AgentClient:
    client_id: str
    name: str | None
    redirect_uris: tuple[str, ...]


# --- client ID metadata documents (SSRF-guarded fetch) -----------------------------------------


REFUSED_ADDRESS = (
    "The client_id URL names an address this box does not fetch from (loopback, private or "
    "link-local); the owner may allow it with [agents] allow_private_metadata_urls = true."
)


class RefusedAddress(OSError):
    """A name that resolves to an address peerd does not fetch from (`GuardedResolver`)."""


class GuardedResolver(AbstractResolver):
    """Resolves as the system does, and refuses a name with any address peerd may not reach
    (`rules.address_allowed`): the check and the connection use the same answer."""

    def __init__(self, *, allow_private: bool) -> None:
        self._inner = ThreadedResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if not found or not all(
            rules.address_allowed(r["host"], allow_private=self._allow_private) for r in found
        ):
            raise RefusedAddress(f"{host} resolves to an address this box does not fetch from")
        return found

    async def close(self) -> None:
        await self._inner.close()


class MetadataFetcher:
    """Fetches a client ID metadata document: https only, no redirects, the address checked, at most
    `MAX_METADATA_BYTES` in `METADATA_TIMEOUT_S`."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private

    async def fetch(self, url: str) -> dict[str, Any]:
        rules.metadata_url_allowed(url)
        host = urlsplit(url).hostname or ""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None and not rules.address_allowed(host, allow_private=self.allow_private):
            raise InvalidClient(REFUSED_ADDRESS)
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(allow_private=self.allow_private), use_dns_cache=False
        )
        timeout = aiohttp.ClientTimeout(total=METADATA_TIMEOUT_S)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as resp,
            ):
                if resp.status != 200:
                    raise InvalidClient(
                        f"The client_id URL answered {resp.status}, not 200 with the metadata."
                    )
                raw = await resp.content.read(MAX_METADATA_BYTES + 1)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                raise InvalidClient(REFUSED_ADDRESS) from None
            raise InvalidClient(
                "The client's metadata document could not be fetched (unreachable)."
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError):
            raise InvalidClient("The client's metadata document could not be fetched.") from None
        if len(raw) > MAX_METADATA_BYTES:
            raise InvalidClient(f"The client's metadata document is larger than {MAX_METADATA_BYTES} bytes.")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise InvalidClient("The client's metadata document is not JSON.") from None
        if not isinstance(doc, dict):
            raise InvalidClient("The client's metadata document is not a JSON object.")
        return doc


def client_from_document(url: str, doc: dict[str, Any]) -> AgentClient:
    """A fetched metadata document as a client: its client_id must be its own URL."""
    if doc.get("client_id") != url:
        raise InvalidClient("The client's metadata document names another client_id than its URL.")
    return AgentClient(url, _bounded_name(doc.get("client_name")), _redirect_uris(doc.get("redirect_uris")))


def _bounded_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 200:
        raise InvalidClient("client_name is a string of at most 200 characters.")
    return value


def _redirect_uri_ok(uri: str) -> bool:
    try:
        parts = urlsplit(uri)
        _ = parts.port
    except ValueError:
        return False
    if parts.fragment or len(uri) > MAX_URI_CHARS:
        return False
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme == "http":  # loopback only (RFC 8252 §7.3)
        return parts.hostname in ("127.0.0.1", "::1", "localhost")
    # A native app's private-use scheme, reverse domain style (RFC 8252 §7.1).
    return "." in parts.scheme and all(ch in _PRIVATE_SCHEME for ch in parts.scheme)


def _redirect_uris(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_REDIRECT_URIS:
        raise InvalidClient(f"redirect_uris is a list of 1 to {MAX_REDIRECT_URIS} URIs.")
    if not all(isinstance(u, str) and _redirect_uri_ok(u) for u in value):
        raise InvalidClient(
            "Each redirect URI must be https, http on a loopback address, or a private-use scheme, "
            "without a fragment."
        )
    return tuple(value)


def _with_query(uri: str, params: dict[str, str | None]) -> str:
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    query += [(k, v) for k, v in params.items() if v is not None]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


class _Page(Exception):
    """A page to show instead of redirecting: the client or its redirect URI is not trusted."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class AgentSignin:
    def __init__(
        self,
        *,
        db: Database,
        signing_key: Ed25519PrivateKey,
        env_id: str,
        label: str,
        clock: Callable[[], float],
        pairing_limit: SlidingWindow,
        fetcher: MetadataFetcher,
        registration_limit: SlidingWindow | None = None,
    ) -> None:
        self.db = db
        self.env_id = env_id
        self.label = label
        self.clock = clock
        self.pairing_limit = pairing_limit
        self.fetcher = fetcher
        self.registration_limit = registration_limit or SlidingWindow(REGISTRATIONS_PER_MINUTE, 60.0)
        self.tokens = VerifiedTokens(signing_key.public_key(), env_id=env_id, clock=clock)

    # --- metadata ---------------------------------------------------------------------------------

    async def protected_resource(self, request: web.Request) -> web.Response:
        base = origin_of(request)
        return web.json_response(
            {
                "resource": base + MCP_PATH,
                "authorization_servers": [issuer_of(request)],
                "bearer_methods_supported": ["header"],
                "resource_name": f"peerd on {self.label}",
            }
        )

    async def authorization_server(self, request: web.Request) -> web.Response:
        base = origin_of(request)
        return web.json_response(
            {
                "issuer": issuer_of(request),
                "authorization_endpoint": base + AUTHORIZE_PATH,
                "token_endpoint": base + "/oauth/token",
                "registration_endpoint": base + REGISTER_PATH,
                "revocation_endpoint": base + "/oauth/revoke",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "revocation_endpoint_auth_methods_supported": ["none"],
                "client_id_metadata_document_supported": True,
                "authorization_response_iss_parameter_supported": True,
            }
        )

    # --- dynamic registration (RFC 7591) ----------------------------------------------------------

    async def register(self, request: web.Request) -> web.Response:
        if not self.registration_limit.hit("register"):
            return web.json_response(
                {"error": "slow_down", "error_description": "Too many registrations; try again in a minute."},
                status=429,
                headers=_NO_STORE,
            )
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _registration_error("invalid_client_metadata", "The body is a JSON object (RFC 7591).")
        try:
            uris = _redirect_uris(body.get("redirect_uris"))
        except InvalidClient as exc:
            return _registration_error("invalid_redirect_uri", exc.message)
        try:
            name = _bounded_name(body.get("client_name"))
            grants = body.get("grant_types", ["authorization_code", "refresh_token"])
            responses = body.get("response_types", ["code"])
            if not isinstance(grants, list) or not set(grants) <= {"authorization_code", "refresh_token"}:
                raise InvalidClient("grant_types may hold only authorization_code and refresh_token.")
            if not isinstance(responses, list) or not set(responses) <= {"code"}:
                raise InvalidClient("response_types may hold only code.")
        except InvalidClient as exc:
            return _registration_error("invalid_client_metadata", exc.message)
        metadata: dict[str, Any] = {
            "redirect_uris": list(uris),
            "client_name": name,
            "grant_types": grants or ["authorization_code"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",  # public clients: PKCE is the proof
        }
        now = self.clock()
        client_id = await store.register_client(self.db, metadata, now=now)
        log.info("agent_signin.registered", oauth_client_id=client_id, name=(name or "")[:60])
        answer = {"client_id": client_id, "client_id_issued_at": int(now), **metadata}
        return web.json_response(
            {k: v for k, v in answer.items() if v is not None}, status=201, headers=_NO_STORE
        )

    # --- authorization ---------------------------------------------------------------------------

    async def _client(self, client_id: str) -> AgentClient:
        if rules.is_metadata_url(client_id):
            return client_from_document(client_id, await self.fetcher.fetch(client_id))
        stored = await store.registered_client(self.db, client_id)
        if stored is None:
            raise InvalidClient("This box does not know this client_id; register it first (RFC 7591).")
        return AgentClient(client_id, stored.get("client_name"), tuple(stored["redirect_uris"]))

    async def _trusted(self, params: dict[str, str]) -> tuple[AgentClient, str]:
        """The client and its redirect URI, or a `_Page` (never a redirect to an unchecked URI)."""
        client_id, redirect_uri = params.get("client_id"), params.get("redirect_uri")
        if not client_id or not redirect_uri:
            raise _Page(400, "The sign-in request is missing client_id or redirect_uri.")
        try:
            client = await self._client(client_id)
        except InvalidClient as exc:
            raise _Page(400, exc.message) from None
        if not rules.redirect_allowed(redirect_uri, client.redirect_uris):
            log.info("agent_signin.redirect_refused", oauth_client_id=client_id[:200])
            raise _Page(400, "redirect_uri is not one this client registered; nothing was sent to it.")
        return client, redirect_uri

    def _request(self, request: web.Request, params: dict[str, str]) -> rules.AuthorizeRequest:
        return rules.check_authorize(
            client_id=params.get("client_id"),
            redirect_uri=params.get("redirect_uri"),
            response_type=params.get("response_type"),
            state=params.get("state"),
            code_challenge=params.get("code_challenge"),
            code_challenge_method=params.get("code_challenge_method"),
            resource=params.get("resource"),
            this_resource=origin_of(request) + MCP_PATH,
        )

    def _redirect(self, request: web.Request, uri: str, params: dict[str, str | None]) -> web.Response:
        target = _with_query(uri, {**params, "iss": issuer_of(request)})
        return web.Response(status=303, headers={**_NO_STORE, hdrs.LOCATION: target})

    async def authorize_page(self, request: web.Request) -> web.Response:
        try:
            params = _single(list(request.query.items()))
            client, redirect_uri = await self._trusted(params)
        except _Page as page:
            return self._page(request, page.status, error=page.text)
        try:
            self._request(request, params)
        except InvalidRequest as exc:
            return self._redirect(
                request,
                redirect_uri,
                {"error": "invalid_request", "error_description": exc.message, "state": params.get("state")},
            )
        return self._page(request, 200, params=params, client=client, redirect_uri=redirect_uri)

    async def authorize_submit(self, request: web.Request) -> web.Response:
        fields = await request.post()
        try:
            form = _single([(k, v) for k, v in fields.items() if isinstance(v, str)])
        except _Page as page:
            return self._page(request, page.status, error=page.text)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not cookie or not secrets.compare_digest(cookie, form.get("csrf", "")):
            return self._page(
                request, 403, error="The form expired or came from elsewhere; open the sign-in link again."
            )
        entered = form.pop("pairing_code", "")
        form.pop("csrf", None)
        try:
            client, redirect_uri = await self._trusted(form)
        except _Page as page:
            return self._page(request, page.status, error=page.text)
        try:
            checked = self._request(request, form)
        except InvalidRequest as exc:
            return self._redirect(
                request,
                redirect_uri,
                {"error": "invalid_request", "error_description": exc.message, "state": form.get("state")},
            )
        if not self.pairing_limit.allowed(_GLOBAL):
            wait_s = max(1, int(self.pairing_limit.retry_after(_GLOBAL)) + 1)
            log.warning("agent_signin.slowed_down", retry_after_s=wait_s)
            return self._page(
                request, 429, params=form, client=client, redirect_uri=redirect_uri,
                error=f"Too many wrong pairing codes on this box; try again in {wait_s} s.",
            )  # fmt: skip
        parts = rules.agent_code_parts(entered)
        if parts is None:
            self.pairing_limit.hit(_GLOBAL)
            return self._page(
                request, 400, params=form, client=client, redirect_uri=redirect_uri,
                error="That is not an agent pairing code (peerd-agent:...). Run `peerd pair --for agent` on the box.",
            )  # fmt: skip
        code_id, secret = parts
        try:
            approved = await store.approve(
                self.db,
                code_id=code_id,
                secret=secret,
                oauth_client_id=client.client_id,
                client_name=client.name,
                redirect_uri=redirect_uri,
                code_challenge=checked.code_challenge,
                resource=checked.resource,
                now=self.clock(),
            )
        except PairingRejected as exc:
            self.pairing_limit.hit(_GLOBAL)
            log.info("agent_signin.code_rejected", code_id=code_id[:64], reason=exc.reason)
            text = PAGE_PAIRING_TEXTS[exc.reason] if exc.reason is not None else "This code cannot be used."
            return self._page(request, 400, params=form, client=client, redirect_uri=redirect_uri, error=text)
        log.info(
            "agent_signin.approved",
            code_id=code_id,
            oauth_client_id=client.client_id[:200],
            access=approved.access,
        )
        return self._redirect(request, redirect_uri, {"code": approved.code, "state": checked.state})

    def _page(
        self,
        request: web.Request,
        status: int,
        *,
        params: dict[str, str] | None = None,
        client: AgentClient | None = None,
        redirect_uri: str | None = None,
        error: str | None = None,
    ) -> web.Response:
        esc = html.escape
        action_to = "'self'"
        body = [f"<h1>Sign in to peerd on {esc(self.label)}</h1>"]
        if error is not None:
            body.append(f'<p role="alert"><strong>{esc(error)}</strong></p>')
        headers = dict(_PAGE_HEADERS)
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
                '<button type="submit">Approve</button></form>'
            )
            response = self._html(status, body, headers, action_to)
            response.set_cookie(
                CSRF_COOKIE,
                csrf,
                path=AUTHORIZE_PATH,
                secure=request.secure,
                httponly=True,
                samesite="Strict",
            )
            return response
        return self._html(status, body, headers, action_to)

    @staticmethod
    def _html(status: int, body: list[str], headers: dict[str, str], action_to: str) -> web.Response:
        headers["Content-Security-Policy"] = (
            f"default-src 'none'; form-action {action_to}; frame-ancestors 'none'; base-uri 'none'"
        )
        text = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>peerd sign-in</title></head>'
            f"<body>{''.join(body)}</body></html>"
        )
        return web.Response(status=status, text=text, content_type="text/html", headers=headers)

    # --- the token endpoint's authorization_code grant (peerd/api/oauth.py calls it) -----------

    async def exchange(
        self,
        *,
        code: str,
        client_id: str | None,
        redirect_uri: str | None,
        verifier: str | None,
        resource: str | None,
        now: float,
    ) -> clients.Redeemed:
        redeemed = await store.exchange(
            self.db, code=code, client_id=client_id, redirect_uri=redirect_uri, verifier=verifier,
            resource=resource, now=now,
        )  # fmt: skip
        log.info("agent_signin.signed_in", client_id=redeemed.client.id, access=redeemed.client.access)
        return redeemed

    # --- `/mcp` on the network listener -------------------------------------------------------------

    def _challenge(self, request: web.Request, error: str | None) -> web.Response:
        response = error_response(
            CapabilityDenied(
                "Sign in first: this endpoint takes an access token from this box's OAuth sign-in "
                "(see /.well-known/oauth-protected-resource/mcp)."
                if error is None
                else "This access token is not accepted here (revoked, expired, or not an agent's); sign in again."
            )
        )
        response.set_status(401)
        meta = f'resource_metadata="{origin_of(request)}{PRM_PATHS[1]}"'
        response.headers[hdrs.WWW_AUTHENTICATE] = (
            f"Bearer {meta}" if error is None else f'Bearer error="{error}", {meta}'
        )
        return response

    async def authenticate(self, request: web.Request) -> Caller | web.Response:
        """The signed-in agent as a link caller, or the 401 to answer (RFC 9728 §5.1)."""
        header = request.headers.get(hdrs.AUTHORIZATION, "")
        if not header.startswith("Bearer "):
            return self._challenge(request, None)
        try:
            claims = self.tokens.verify(header.removeprefix("Bearer ").strip())
        except TokenRejected as exc:
            log.info("agent_signin.token_rejected", reason=str(exc))
            return self._challenge(request, "invalid_token")
        now = self.clock()
        client = await clients.active_client(self.db, claims.client_id, now=now)
        if client is None or client.kind != "agent":
            return self._challenge(request, "invalid_token")
        await clients.touch(self.db, client.id, address=request.remote or "", now=now, known=client)
        link = LinkContext(
            client_id=client.id,
            label=client.agent_name or client.label,
            access=client.access,
            cap=cap_for(client.access, None),
            own_threads_only=True,
        )
        return Caller.for_link(link)


def _single(items: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in items:
        if key in out:
            raise _Page(400, f"The sign-in request repeats {key[:40]}; send each parameter once.")
        if len(value) > 4096:
            raise _Page(400, f"The sign-in request's {key[:40]} is too long.")
        out[key] = value
    return out


def _registration_error(error: str, text: str) -> web.Response:
    return web.json_response({"error": error, "error_description": text}, status=400, headers=_NO_STORE)


AGENT_SIGNIN = web.AppKey("agent_signin", AgentSignin)


async def _protected_resource(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].protected_resource(request)


async def _authorization_server(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorization_server(request)


async def _register(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].register(request)


async def _authorize_page(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorize_page(request)


async def _authorize_submit(request: web.Request) -> web.Response:
    return await request.app[AGENT_SIGNIN].authorize_submit(request)


def add_agent_signin_routes(app: web.Application, signin: AgentSignin) -> None:
    """Mount the metadata, registration and authorization endpoints (the network listener's app)."""
    app[AGENT_SIGNIN] = signin
    app[SAME_ORIGIN_PATHS] = frozenset({AUTHORIZE_PATH})  # the sign-in form posts from its own page
    add_routes(app, ROUTES)


# --- the route table (what `peerd.api.openapi` describes) ------------------------------------------


class ProtectedResource(BaseModel):
    """RFC 9728 protected resource metadata of `/mcp`."""

    resource: str
    authorization_servers: list[str]
    bearer_methods_supported: list[str]
    resource_name: str


class AuthorizationServer(BaseModel):
    """RFC 8414 authorization server metadata (the fields peerd publishes)."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    registration_endpoint: str
    revocation_endpoint: str
    response_types_supported: list[str]
    grant_types_supported: list[str]
    code_challenge_methods_supported: list[str]
    token_endpoint_auth_methods_supported: list[str]
    revocation_endpoint_auth_methods_supported: list[str]
    client_id_metadata_document_supported: bool
    authorization_response_iss_parameter_supported: bool


class Registration(BaseModel):
    """RFC 7591 client metadata: what peerd reads of it (other fields are ignored)."""

    model_config = ConfigDict(extra="allow")
    redirect_uris: list[str] = Field(
        description="1 to 10: https, http on a loopback address, or a private-use scheme; no fragment"
    )
    client_name: str | None = Field(default=None, max_length=200)
    grant_types: list[str] | None = Field(default=None, description="authorization_code, refresh_token")
    response_types: list[str] | None = Field(default=None, description="code")


class Registered(BaseModel):
    """The registered client (RFC 7591 §3.2.1): a public client, PKCE its proof."""

    client_id: str
    client_id_issued_at: int
    redirect_uris: list[str]
    client_name: str | None = None
    grant_types: list[str]
    response_types: list[str]
    token_endpoint_auth_method: str


class RegistrationError(BaseModel):
    """RFC 7591 §3.2.2 (or RFC 8628's `slow_down` past 30 registrations a minute)."""

    error: str
    error_description: str | None = None


class SignInPage(RootModel[str]):
    """The sign-in page, or the page saying what is wrong: text/html (a strict CSP, no script)."""


class AuthorizeQuery(BaseModel):
    """An authorization request (RFC 6749 §4.1.1, RFC 7636, RFC 8707)."""

    response_type: Literal["code"]
    client_id: str = Field(
        description="a registered client id, or an https URL (a client ID metadata document)"
    )
    redirect_uri: str
    code_challenge: str = Field(description="BASE64URL(SHA256(code_verifier)), 43 characters")
    code_challenge_method: Literal["S256"]
    state: str | None = None
    resource: str | None = Field(default=None, description="this box's /mcp")
    scope: str | None = Field(default=None, description="ignored: the pairing code sets the level")


class AuthorizeForm(AuthorizeQuery):
    """The sign-in page's form: the request again, the page's CSRF token and the typed code."""

    csrf: str
    pairing_code: str = Field(description="peerd-agent:ID.SECRET, from `peerd pair --for agent`")


_REGISTRATION_STATUS = {"invalid_redirect_uri": 400, "invalid_client_metadata": 400, "slow_down": 429}
_PAGE = (
    "Answers text/html, not JSON: the sign-in page (200), or a page naming what is wrong (400: an "
    "unknown client or a redirect URI it did not register, never redirected to; 403: a form without its "
    "page's cookie; 429: too many wrong codes)."
)
_BASE = "https://box.example:7433"
_PRM = Example(
    {
        "resource": _BASE + MCP_PATH,
        "authorization_servers": [_BASE + "/"],
        "bearer_methods_supported": ["header"],
        "resource_name": "peerd on box",
    }
)
_ASM = Example(
    {
        "issuer": _BASE + "/",
        "authorization_endpoint": _BASE + AUTHORIZE_PATH,
        "token_endpoint": _BASE + "/oauth/token",
        "registration_endpoint": _BASE + REGISTER_PATH,
        "revocation_endpoint": _BASE + "/oauth/revoke",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "client_id_metadata_document_supported": True,
        "authorization_response_iss_parameter_supported": True,
    }
)
_REDIRECT = "http://127.0.0.1:53682/callback"
_REQUEST = {
    "response_type": "code",
    "client_id": "dcr_3f9c0a1b2d4e5f60718a",
    "redirect_uri": _REDIRECT,
    "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
    "code_challenge_method": "S256",
    "state": "af0ifjsldkj",
    "resource": _BASE + MCP_PATH,
}
ROUTES: tuple[Route, ...] = (
    Route("GET", PRM_PATHS[0], _protected_resource, "oauth_protected_resource",
          "Where to sign in for /mcp (RFC 9728).", "oauth", answer=ProtectedResource, example=_PRM),
    Route("GET", PRM_PATHS[1], _protected_resource, "oauth_protected_resource_mcp",
          "Where to sign in for /mcp (RFC 9728, the path-suffixed form).", "oauth", answer=ProtectedResource,
          example=_PRM),
    Route("GET", ASM_PATH, _authorization_server, "oauth_authorization_server",
          "The box's OAuth server for outside agents (RFC 8414).", "oauth", answer=AuthorizationServer,
          example=_ASM),
    Route("POST", REGISTER_PATH, _register, "oauth_register",
          "Register an outside agent's OAuth client (RFC 7591; a public client).", "oauth",
          body=Registration, answer=Registered, status=201, errors=tuple(_REGISTRATION_STATUS),
          error_body=RegistrationError, error_status=_REGISTRATION_STATUS,
          example=Example(
              {"client_id": "dcr_3f9c0a1b2d4e5f60718a", "client_id_issued_at": 1796229075, "redirect_uris": [_REDIRECT],
               "client_name": "Claude Code", "grant_types": ["authorization_code", "refresh_token"],
               "response_types": ["code"], "token_endpoint_auth_method": "none"},
              body={"redirect_uris": [_REDIRECT], "client_name": "Claude Code"})),
    Route("GET", AUTHORIZE_PATH, _authorize_page, "oauth_authorize",
          "The sign-in page an outside agent opens; a person types an agent pairing code.", "oauth",
          query=AuthorizeQuery, answer=SignInPage, other={303: None},
          example=Example("<!doctype html>...", query=_REQUEST),
          description=_PAGE + " An invalid request of a known client and redirect URI is 303 to the "
          "redirect URI with error, state and iss."),
    Route("POST", AUTHORIZE_PATH, _authorize_submit, "oauth_authorize_submit",
          "The sign-in page's form: 303 to the client with code, state and iss (RFC 9207).", "oauth",
          body=AuthorizeForm, form=True, answer=SignInPage, other={303: None}, description=_PAGE,
          example=Example("(303 to the redirect URI)",
                          body={**_REQUEST, "csrf": "q7Tz...", "pairing_code": "peerd-agent:3f9c0a1b2d4e.Xq3v..."})),
)  # fmt: skip
