"""The box's OAuth 2.0 endpoints on the network listener: token (pairing code, refresh) and revoke.

    POST /oauth/token    grant_type=urn:peerd:params:oauth:grant-type:pairing-code
                           code_id, code_secret, access?, client_label?, client_env_id?, max_age?
                         grant_type=refresh_token   refresh_token
    POST /oauth/revoke   token, token_type_hint?    (RFC 7009: 200 {} whether or not it was known)

Our own async handlers over `peerd.store.clients`. A failure is a typed error of the registry
(peerd/errors.py), which says once which RFC 6749 §5.2 `error` it is (`oauth_error`) and whether
the answer names peerd's stable `peerd_reason` (`errors.oauth_error_of`); authlib's `OAuth2Error`
gives the body and headers (`no-store`). Every error carries a description a person can act on.
Nothing secret is echoed or logged.

Guessing is slowed twice: each code burns after 5 wrong secrets (in the store), and failed pairing
redemptions are limited globally; past that limit pairing requests are answered 429 `slow_down`
without looking at the code at all, so a guesser learns nothing while it lasts.

Every field of a pairing request is checked before the code is looked at (`max_age` finite,
positive and at most ten years; label and environment id bounded, then stripped of control
characters in the store): a bad one is `invalid_request`, and the code stays open, no client made.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from aiohttp import web
from authlib.oauth2.base import OAuth2Error
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, Field

from peerd.api import examples as ex
from peerd.api.routes import Example, Route, add_routes
from peerd.core.access import ACCESS_LEVELS, DEFAULT_LINK_ACCESS
from peerd.errors import (
    OAUTH_STATUS,
    REGISTRY,
    AccessExceedsCode,
    AuthCodeRejected,
    InvalidClient,
    InvalidRequest,
    NotFound,
    PairingReason,
    PairingRejected,
    PeerdError,
    RateLimited,
    RefreshReason,
    RefreshRejected,
    ScopeInvalid,
    UnsupportedGrant,
    oauth_error_of,
)
from peerd.logs import get_logger
from peerd.peer.ratelimit import SlidingWindow
from peerd.peer.tokens import ACCESS_TOKEN_TTL_S, TokenRejected, sign_access_token, verify_access_token
from peerd.store import clients
from peerd.store.db import Database
from peerd.store.pairing import check_max_age

log = get_logger(__name__)

PAIRING_GRANT = "urn:peerd:params:oauth:grant-type:pairing-code"
REFRESH_GRANT = "refresh_token"
AUTHORIZATION_CODE_GRANT = "authorization_code"  # an outside agent's sign-in (api/agent_signin.py)
PAIRING_FAILURES_PER_WINDOW = 20
PAIRING_WINDOW_S = 60.0
_GLOBAL = "pairing"
_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class _Reject(Exception):
    """An OAuth error response to send: a typed error, its description a person can act on
    (RFC 6749 §5.2 characters only), and extra headers."""

    def __init__(self, error: PeerdError, description: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(error.code)
        self.error = error
        self.description = _printable(description)
        self.headers = headers or {}


def _printable(text: str) -> str:
    # RFC 6749 §5.2 allows only %x20-21 / %x23-5B / %x5D-7E in error_description (authlib
    # enforces it), and a box label may hold anything.
    return "".join(ch if 0x20 <= ord(ch) <= 0x7E and ch not in '"\\' else "?" for ch in text)


def _error_response(reject: _Reject) -> web.Response:
    error, status_code, reason = oauth_error_of(reject.error)
    status, body, headers = OAuth2Error(
        error=error, description=reject.description, status_code=status_code
    )()
    if reason is not None:
        body["peerd_reason"] = reason
    # Not web.json_response: authlib's headers already carry the Content-Type.
    return web.Response(text=json.dumps(body), status=status, headers={**dict(headers), **reject.headers})


Form = dict[str, list[str]]

# What a person reads for each typed reason (the reasons are peerd/errors.py's; `{box}` is this
# box's name). One per reason: tests/integration/test_oauth.py.
PAIRING_TEXTS: dict[PairingReason, str] = {
    "unknown_code": "{box} has no such pairing code.",
    "wrong_secret": "The pairing code's secret does not match; copy the whole code again. "
    "A code is burnt after 5 wrong attempts.",
    "expired": "This pairing code expired.",
    "used": "This pairing code was already used.",
    "burnt": "This pairing code was burnt after too many wrong attempts.",
    "cancelled": "This pairing code was cancelled on {box}.",
}
REFRESH_TEXTS: dict[RefreshReason, str] = {
    "unknown": "{box} does not know this refresh token.",
    "reused": "This refresh token was already used once, so {box} revoked the link to be safe.",
    "revoked": "The link to {box} was revoked there.",
    "expired": "The link to {box} expired.",
}

# The same, for a signed-in agent (api/agent_signin.py): it signs in again rather than links.
AGENT_REFRESH_TEXTS: dict[RefreshReason, str] = {
    "unknown": "{box} does not know this refresh token.",
    "reused": "This refresh token was already used once, so {box} ended the sign-in to be safe.",
    "revoked": "The sign-in to {box} was revoked there.",
    "expired": "The sign-in to {box} expired (a sign-in lasts at most 30 days).",
}


async def _read_form(request: web.Request) -> Form:
    # Only urlencoded fields count; a JSON body reads as an empty form (so: missing grant_type).
    form: Form = {}
    try:
        fields = await request.post()
    except ValueError:  # a multipart body without its boundary, or one that does not parse
        text = "The body is not a readable form; send application/x-www-form-urlencoded."
        raise _Reject(InvalidRequest(text), text) from None
    for key, value in fields.items():
        if isinstance(value, str):
            form.setdefault(key, []).append(value)
    return form


def _optional(form: Form, name: str) -> str | None:
    values = form.get(name, [])
    if len(values) > 1:  # RFC 6749 §3.2: parameters MUST NOT repeat
        raise _invalid(f"Send {name} only once.")
    value = values[0].strip() if values else ""
    return value or None


def _required(form: Form, name: str) -> str:
    value = _optional(form, name)
    if value is None:
        raise _invalid(f"The request is missing {name}.")
    return value


def _invalid(text: str) -> _Reject:
    return _Reject(InvalidRequest(text), text)


class CodeExchange(Protocol):
    """An agent's authorization code for a new client (`AgentSignin.exchange`); raises
    `AuthCodeRejected`, `InvalidClient` or `InvalidRequest`."""

    def __call__(
        self,
        *,
        code: str,
        client_id: str | None,
        redirect_uri: str | None,
        verifier: str | None,
        resource: str | None,
        now: float,
    ) -> Awaitable[clients.Redeemed]: ...


class OAuthEndpoints:
    def __init__(
        self,
        *,
        db: Database,
        signing_key: Ed25519PrivateKey,
        env_id: str,
        label: str,
        clock: Callable[[], float],
        pairing_limit: SlidingWindow,
        code_exchange: CodeExchange | None = None,
    ) -> None:
        self.db = db
        self.code_exchange = code_exchange
        self.signing_key = signing_key
        self.env_id = env_id
        self.label = label  # as configured, for the token response
        self.name = _printable(label)  # for error descriptions (RFC 6749 §5.2 characters only)
        self.clock = clock
        self.pairing_limit = pairing_limit

    def _new_code(self) -> str:
        return f"Run `peerd pair` on {self.name} for a new code."

    def _relink(self) -> str:
        return f"Link it again with a new pairing code from `peerd pair` on {self.name}."

    # --- token ----------------------------------------------------------------------------------

    async def token(self, request: web.Request) -> web.Response:
        try:
            form = await _read_form(request)
            # grant_type first: an unknown grant is unsupported_grant_type whatever else is wrong.
            grant = _optional(form, "grant_type")
            if grant is None:
                raise _invalid(
                    "The token request is missing grant_type; send it as a form "
                    "(application/x-www-form-urlencoded)."
                )
            if grant == PAIRING_GRANT:
                body = await self._pairing(form)
            elif grant == REFRESH_GRANT:
                body = await self._refresh(form)
            elif grant == AUTHORIZATION_CODE_GRANT and self.code_exchange is not None:
                body = await self._authorization_code(form, self.code_exchange)
            else:
                text = (
                    f"grant_type {_printable(grant[:100])} is not supported here; use {PAIRING_GRANT} "
                    f"or {REFRESH_GRANT}."
                )
                raise _Reject(UnsupportedGrant(text), text)
        except _Reject as reject:
            return _error_response(reject)
        return web.json_response(body, headers=_NO_STORE)

    async def _pairing(self, form: Form) -> dict[str, Any]:
        if not self.pairing_limit.allowed(_GLOBAL):
            wait_s = max(1, math.ceil(self.pairing_limit.retry_after(_GLOBAL)))
            log.warning("oauth.pairing_slowed_down", retry_after_s=wait_s)
            text = f"Too many failed pairing attempts on {self.name}; try again in {wait_s} s."
            raise _Reject(RateLimited(text), text, headers={"Retry-After": str(wait_s)})
        code_id = _required(form, "code_id")
        secret = _required(form, "code_secret")
        access = _optional(form, "access") or _optional(form, "scope") or DEFAULT_LINK_ACCESS
        if access not in ACCESS_LEVELS:
            text = f"Unknown access level {_printable(access[:60])}; use one of: {', '.join(ACCESS_LEVELS)}."
            raise _Reject(ScopeInvalid(text), text)
        max_age = self._max_age(_optional(form, "max_age"))
        label, env_id = _optional(form, "client_label"), _optional(form, "client_env_id")
        try:
            clients.check_redemption(label=label, env_id=env_id, max_age_s=max_age)
        except InvalidRequest as exc:
            raise _Reject(exc, exc.message) from None
        now = self.clock()
        try:
            redeemed = await clients.redeem_pairing_code(
                self.db,
                code_id=code_id,
                secret=secret,
                access=access,
                label=label,
                env_id=env_id,
                max_age_s=max_age,
                now=now,
            )
        except PairingRejected as exc:
            self.pairing_limit.hit(_GLOBAL)
            log.info(
                "oauth.pairing_rejected", code_id=code_id[:64], reason=exc.reason
            )  # caller-chosen: bounded
            raise _Reject(exc, self._pairing_text(exc.reason)) from None
        except InvalidRequest as exc:  # e.g. a code stored with an unusable max age: nothing spent
            raise _Reject(exc, exc.message) from None
        except AccessExceedsCode as exc:
            text = (
                f"You asked for {exc.requested} access, but this pairing code allows at most {exc.ceiling}. "
                f"Link with --access {exc.ceiling} (or lower), or run `peerd pair --access {exc.requested}` "
                f"on {self.name} for a code that allows it."
            )
            raise _Reject(exc, text) from None
        log.info("oauth.linked", code_id=code_id, client_id=redeemed.client.id, access=access)
        return self._token_body(redeemed, now)

    async def _authorization_code(self, form: Form, exchange: CodeExchange) -> dict[str, Any]:
        code = _required(form, "code")
        now = self.clock()
        try:
            redeemed = await exchange(
                code=code,
                client_id=_optional(form, "client_id"),
                redirect_uri=_optional(form, "redirect_uri"),
                verifier=_optional(form, "code_verifier"),
                resource=_optional(form, "resource"),
                now=now,
            )
        except (AuthCodeRejected, InvalidClient, InvalidRequest) as exc:
            log.info("oauth.code_rejected", error=exc.code, reason=getattr(exc, "reason", None))
            raise _Reject(exc, exc.message) from None
        return self._token_body(redeemed, now)

    def _max_age(self, text: str | None) -> float | None:
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        try:
            return check_max_age(value)
        except InvalidRequest as exc:
            raise _Reject(exc, exc.message) from None

    def _pairing_text(self, reason: PairingReason | None) -> str:
        said = PAIRING_TEXTS[reason] if reason is not None else "This pairing code cannot be used."
        return f"{said.format(box=self.name)} {self._new_code()}"

    async def _refresh(self, form: Form) -> dict[str, Any]:
        token = _required(form, "refresh_token")
        now = self.clock()
        try:
            rotated = await clients.rotate_refresh(self.db, token, now=now)
        except RefreshRejected as exc:
            log.info("oauth.refresh_rejected", client_id=exc.client_id, reason=exc.reason)
            if exc.client_id is not None and await clients.kind_of(self.db, exc.client_id) == "agent":
                raise _Reject(exc, self._agent_refresh_text(exc.reason)) from None
            raise _Reject(exc, self._refresh_text(exc.reason)) from None
        return self._token_body(rotated, now)

    def _refresh_text(self, reason: RefreshReason | None) -> str:
        said = REFRESH_TEXTS[reason] if reason is not None else "This refresh token cannot be used."
        return f"{said.format(box=self.name)} {self._relink()}"

    def _agent_refresh_text(self, reason: RefreshReason | None) -> str:
        said = AGENT_REFRESH_TEXTS[reason] if reason is not None else "This refresh token cannot be used."
        return f"{said.format(box=self.name)} Sign in again with a code from `peerd pair --for agent` on {self.name}."

    def _token_body(self, grant: clients.Redeemed | clients.Rotated, now: float) -> dict[str, Any]:
        client = grant.client
        ttl = ACCESS_TOKEN_TTL_S
        if client.expires_at is not None:  # never outlive the link's hard max age
            ttl = max(1, min(ttl, int(client.expires_at - now)))
        access_token, _exp = sign_access_token(
            self.signing_key, env_id=self.env_id, client_id=client.id, access=client.access, ttl=ttl
        )
        return TokenAnswer(
            access_token=access_token,
            token_type="Bearer",  # noqa: S106  # the token type, not a secret
            expires_in=ttl,
            refresh_token=grant.refresh_token,
            refresh_expires_in=max(0, int(grant.refresh_expires_at - now)),
            scope=client.access,
            client_id=client.id,
            env_id=self.env_id,
            label=self.label,
        ).model_dump()

    # --- revoke ---------------------------------------------------------------------------------

    async def revoke(self, request: web.Request) -> web.Response:
        try:
            token = _required(await _read_form(request), "token")
        except _Reject as reject:
            return _error_response(reject)
        now = self.clock()
        if await clients.revoke_by_refresh_token(self.db, token, now=now):
            log.info("oauth.revoked", via="refresh_token")
        elif token.count(".") == 2:
            # RFC 7009 §2.1: access tokens SHOULD be revocable too; ours name their client.
            try:
                claims = verify_access_token(self.signing_key.public_key(), token, env_id=self.env_id)
                await clients.revoke_client(
                    self.db, claims.client_id, reason=clients.UNLINKED_REASON, now=now
                )
            except (TokenRejected, NotFound):
                pass
            else:
                log.info("oauth.revoked", via="access_token", client_id=claims.client_id)
        # 200 whether or not the token was known (RFC 7009 §2.2): no oracle for guessed tokens.
        return web.json_response({}, headers=_NO_STORE)


def add_oauth_routes(
    app: web.Application,
    *,
    db: Database,
    signing_key: Ed25519PrivateKey,
    env_id: str,
    label: str,
    clock: Callable[[], float] = time.time,
    pairing_limit: SlidingWindow | None = None,
    code_exchange: CodeExchange | None = None,
) -> None:
    """Mount `/oauth/token` and `/oauth/revoke` (the network listener's app); with `code_exchange`,
    the token endpoint takes agents' authorization codes too."""
    endpoints = OAuthEndpoints(
        db=db,
        signing_key=signing_key,
        env_id=env_id,
        label=label,
        clock=clock,
        pairing_limit=(
            SlidingWindow(PAIRING_FAILURES_PER_WINDOW, PAIRING_WINDOW_S)
            if pairing_limit is None
            else pairing_limit
        ),
        code_exchange=code_exchange,
    )
    app[OAUTH] = endpoints
    add_routes(app, ROUTES)


# --- the route table (what `peerd.api.openapi` describes) ------------------------------------------

OAUTH = web.AppKey("oauth_endpoints", OAuthEndpoints)


async def token(request: web.Request) -> web.Response:
    return await request.app[OAUTH].token(request)


async def revoke(request: web.Request) -> web.Response:
    return await request.app[OAUTH].revoke(request)


class TokenForm(BaseModel):
    """`POST /oauth/token`, a form: a pairing code's redemption or a refresh (module docstring)."""

    grant_type: str = Field(description=f"{PAIRING_GRANT}, {REFRESH_GRANT} or {AUTHORIZATION_CODE_GRANT}")
    code_id: str | None = Field(default=None, description="pairing: the code's id")
    code_secret: str | None = Field(default=None, description="pairing: the code's secret")
    access: str | None = Field(default=None, description=f"pairing: one of {', '.join(ACCESS_LEVELS)}")
    scope: str | None = Field(default=None, description="pairing: the same as access (RFC 6749)")
    client_label: str | None = Field(default=None, description="pairing: what this box calls the client")
    client_env_id: str | None = Field(default=None, description="pairing: the client's environment id")
    max_age: str | None = Field(default=None, description="pairing: the link's hard age limit, seconds")
    refresh_token: str | None = Field(default=None, description="refresh: the refresh token")
    code: str | None = Field(
        default=None, description="authorization_code: an agent's code (RFC 6749 §4.1.3)"
    )
    redirect_uri: str | None = Field(
        default=None, description="authorization_code: as in the authorization request"
    )
    client_id: str | None = Field(default=None, description="authorization_code: the agent's OAuth client id")
    code_verifier: str | None = Field(
        default=None, description="authorization_code: the PKCE verifier (RFC 7636)"
    )
    resource: str | None = Field(default=None, description="authorization_code: this box's /mcp (RFC 8707)")


class RevokeForm(BaseModel):
    """`POST /oauth/revoke`, a form (RFC 7009)."""

    token: str = Field(description="a refresh token or an access token of the link to revoke")
    token_type_hint: str | None = None


class TokenAnswer(BaseModel):
    """A token response (RFC 6749 §5.1) with the box's id and label."""

    access_token: str
    token_type: Literal["Bearer"]
    expires_in: int
    refresh_token: str
    refresh_expires_in: int
    scope: str
    client_id: str
    env_id: str
    label: str


class OAuthError(BaseModel):
    """An OAuth error (RFC 6749 §5.2), with peerd's stable reason where there is one."""

    error: str
    error_description: str | None = None
    peerd_reason: str | None = None


class Revoked(BaseModel):
    """RFC 7009: `{}` whether or not the token was known."""


# The RFC 6749 errors a token request can answer: those the registry's classes declare.
_DECLARED = {cls.oauth_error for cls in REGISTRY.values() if "oauth_error" in vars(cls)}
_STATUS: dict[str, int] = {error: status for error, status in OAUTH_STATUS.items() if error in _DECLARED}
ROUTES: tuple[Route, ...] = (
    Route("POST", "/oauth/token", token, "oauth_token", "Redeem a pairing code, or refresh a link's tokens.",
          "oauth", body=TokenForm, form=True, answer=TokenAnswer, errors=tuple(_STATUS), error_body=OAuthError,
          error_status=_STATUS,
          example=Example(
              {"access_token": "eyJ...", "token_type": "Bearer", "expires_in": 900, "refresh_token": "rt_...",
               "refresh_expires_in": 2592000, "scope": "approval-required", "client_id": ex.CLI, "env_id": ex.BOX,
               "label": "box"},
              body={"grant_type": PAIRING_GRANT, "code_id": ex.PCD, "code_secret": "Xq3v9TzK0bR2mW8s"})),
    Route("POST", "/oauth/revoke", revoke, "oauth_revoke", "Revoke a link by one of its tokens (RFC 7009).",
          "oauth", body=RevokeForm, form=True, answer=Revoked, errors=("invalid_request",), error_body=OAuthError,
          error_status=_STATUS,
          example=Example({}, body={"token": "rt_..."})),
)  # fmt: skip
