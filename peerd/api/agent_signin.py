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
`peerd.api.client_metadata`) or a registered one. A client or redirect URI the box cannot vouch for is shown
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

The page is static HTML (`peerd.api.signin_page`): a strict CSP, no script at all, and a
double-submit CSRF token. The route table and its models are `peerd.api.agent_signin_routes`.
Nothing secret (pairing codes, authorization codes, verifiers, tokens) is logged or echoed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import structlog
from aiohttp import hdrs, web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.api import owner_approval, signin_page
from peerd.api.app import error_response, parse_json
from peerd.api.client_metadata import (
    AgentClient,
    MetadataFetcher,
    bounded_name,
    client_from_document,
    redirect_uris,
)
from peerd.api.signin_page import AUTHORIZE_PATH, CSRF_COOKIE
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
REGISTER_PATH = "/oauth/register"
REGISTRATIONS_PER_MINUTE = 30
_GLOBAL = "pairing"  # the same key as oauth.py's: one brake for links' and agents' codes
_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}

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
        self.ask_limit = SlidingWindow(owner_approval.ASKS_PER_MINUTE, 60.0)  # sign-ins asked of the owner
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
            body = parse_json(await request.read())  # within peerd's limits (depth, constants)
        except InvalidRequest:
            body = None
        if not isinstance(body, dict):
            return _registration_error("invalid_client_metadata", "The body is a JSON object (RFC 7591).")
        try:
            uris = redirect_uris(body.get("redirect_uris"))
        except InvalidClient as exc:
            return _registration_error("invalid_redirect_uri", exc.message)
        try:
            name = bounded_name(body.get("client_name"))
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

    def redirect(self, request: web.Request, uri: str, params: dict[str, str | None]) -> web.Response:
        target = _with_query(uri, {**params, "iss": issuer_of(request)})
        return web.Response(status=303, headers={**_NO_STORE, hdrs.LOCATION: target})

    async def authorize_page(self, request: web.Request) -> web.Response:
        try:
            params = _single(list(request.query.items()))
            client, redirect_uri = await self._trusted(params)
        except _Page as page:
            return self.page(request, page.status, error=page.text)
        try:
            self._request(request, params)
        except InvalidRequest as exc:
            return self.redirect(
                request,
                redirect_uri,
                {"error": "invalid_request", "error_description": exc.message, "state": params.get("state")},
            )
        return self.page(request, 200, params=params, client=client, redirect_uri=redirect_uri)

    async def authorize_submit(self, request: web.Request) -> web.Response:
        fields = await request.post()
        try:
            form = _single([(k, v) for k, v in fields.items() if isinstance(v, str)])
        except _Page as page:
            return self.page(request, page.status, error=page.text)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not cookie or not secrets.compare_digest(cookie, form.get("csrf", "")):
            return self.page(
                request, 403, error="The form expired or came from elsewhere; open the sign-in link again."
            )
        entered = form.pop("pairing_code", "")
        asked = form.pop("ask", None) == "1"  # "Ask the owner": approval in the console, no code
        form.pop("csrf", None)
        try:
            client, redirect_uri = await self._trusted(form)
        except _Page as page:
            return self.page(request, page.status, error=page.text)
        try:
            checked = self._request(request, form)
        except InvalidRequest as exc:
            return self.redirect(
                request,
                redirect_uri,
                {"error": "invalid_request", "error_description": exc.message, "state": form.get("state")},
            )
        if asked:
            return await owner_approval.ask(self, request, client, redirect_uri, checked)
        if not self.pairing_limit.allowed(_GLOBAL):
            wait_s = max(1, int(self.pairing_limit.retry_after(_GLOBAL)) + 1)
            log.warning("agent_signin.slowed_down", retry_after_s=wait_s)
            return self.page(
                request, 429, params=form, client=client, redirect_uri=redirect_uri,
                error=f"Too many wrong pairing codes on this box; try again in {wait_s} s.",
            )  # fmt: skip
        parts = rules.agent_code_parts(entered)
        if parts is None:
            self.pairing_limit.hit(_GLOBAL)
            return self.page(
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
            return self.page(request, 400, params=form, client=client, redirect_uri=redirect_uri, error=text)
        log.info(
            "agent_signin.approved",
            code_id=code_id,
            oauth_client_id=client.client_id[:200],
            access=approved.access,
        )
        return self.redirect(request, redirect_uri, {"code": approved.code, "state": checked.state})

    async def authorize_wait(self, request: web.Request) -> web.Response:
        return await owner_approval.wait(self, request)

    def page(self, request: web.Request, status: int, **kw: Any) -> web.Response:
        return signin_page.render(request, status, label=self.label, **kw)

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
