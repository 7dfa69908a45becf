"""The rules of an agent's OAuth sign-in (issue 29), pure: no I/O, the clock passed in.

- `redirect_allowed`: a redirect URI is one the client registered (or its metadata document
  lists), compared exactly; only a loopback `http` redirect may differ in its port (RFC 8252 §7.3).
- `pkce_matches`: S256 only (`BASE64URL(SHA256(verifier)) == challenge`, RFC 7636 §4.6); a
  verifier of the wrong shape never matches.
- `check_authorize`: the authorization request's own fields (response_type, PKCE, resource).
- `code_verdict`: what an authorization code presented at the token endpoint is worth.
- `metadata_url_allowed` / `address_allowed`: the SSRF guard for client ID metadata documents
  (https only, no credentials or fragment; no loopback, private, link-local or otherwise
  non-global address unless the owner allows private ones).
- `agent_code_parts`: the pasted agent pairing code, `peerd-agent:ID.SECRET`.

Every refusal is a typed error of the registry (peerd/errors.py); nothing secret is in a message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from peerd.errors import AuthCodeReason, InvalidClient, InvalidRequest

AGENT_CODE_PREFIX = "peerd-agent:"
AUTH_CODE_TTL_S = 60.0  # an authorization code lives a minute (RFC 6749 §4.1.2: short)
MAX_SIGNIN_S = 30 * 24 * 3600.0  # a sign-in lasts at most 30 days (the client's hard expires_at)
_VERIFIER = re.compile(r"[A-Za-z0-9\-._~]{43,128}")  # RFC 7636 §4.1
_CHALLENGE = re.compile(r"[A-Za-z0-9\-_]{43}")  # BASE64URL(SHA256(...)) without padding


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def pkce_matches(verifier: str | None, challenge: str) -> bool:
    """Whether `verifier` is the S256 preimage of `challenge` (constant-time compare)."""
    if verifier is None or not _VERIFIER.fullmatch(verifier):
        return False
    return hmac.compare_digest(s256(verifier), challenge)


def _is_loopback_http(parts: SplitResult) -> bool:
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "::1", "localhost")


def redirect_allowed(given: str, registered: tuple[str, ...] | list[str]) -> bool:
    """Exact match against a registered redirect URI; a loopback http one may vary its port."""
    if given in registered:
        return True
    try:
        got = urlsplit(given)
        _ = got.port  # a bad port raises
    except ValueError:
        return False
    if not _is_loopback_http(got):
        return False
    for uri in registered:
        try:
            want = urlsplit(uri)
            _ = want.port
        except ValueError:
            continue
        if (
            _is_loopback_http(want)
            and want.hostname == got.hostname
            and want.path == got.path
            and want.query == got.query
            and not got.fragment
        ):
            return True
    return False


@dataclass(frozen=True)
class AuthorizeRequest:
    """An authorization request's fields, checked (`check_authorize`)."""

    client_id: str
    redirect_uri: str
    state: str | None
    code_challenge: str
    resource: str


def check_authorize(
    *,
    client_id: str | None,
    redirect_uri: str | None,
    response_type: str | None,
    state: str | None,
    code_challenge: str | None,
    code_challenge_method: str | None,
    resource: str | None,
    this_resource: str,
) -> AuthorizeRequest:
    """The fields a redirect may be sent for, or `InvalidRequest`. The client and its redirect URI
    are checked by the caller first (a bad one is shown on the page, never redirected to)."""
    if not client_id or not redirect_uri:
        raise InvalidRequest("The authorization request is missing client_id or redirect_uri.")
    if response_type != "code":
        raise InvalidRequest("Only response_type=code is supported.")
    if not code_challenge:
        raise InvalidRequest("PKCE is required: send code_challenge with code_challenge_method=S256.")
    if code_challenge_method != "S256":
        raise InvalidRequest("Only code_challenge_method=S256 is accepted (plain is refused).")
    if not _CHALLENGE.fullmatch(code_challenge):
        raise InvalidRequest("code_challenge is not a BASE64URL SHA-256 value (43 characters).")
    if resource is not None and resource.rstrip("/") != this_resource.rstrip("/"):
        raise InvalidRequest(f"resource must be this server's MCP endpoint, {this_resource}.")
    if state is not None and len(state) > 1024:
        raise InvalidRequest("state is at most 1024 characters.")
    return AuthorizeRequest(client_id, redirect_uri, state, code_challenge, this_resource)


@dataclass(frozen=True)
class StoredCode:
    """What the store keeps of an authorization code (its hash aside)."""

    oauth_client_id: str
    redirect_uri: str
    code_challenge: str
    resource: str
    expires_at: float
    used: bool


def code_verdict(
    code: StoredCode | None,
    *,
    client_id: str | None,
    redirect_uri: str | None,
    verifier: str | None,
    resource: str | None,
    now: float,
) -> AuthCodeReason | None:
    """None when the code may be exchanged now; else why not. A used code is `reused` whatever
    else is wrong, so its second presentation always revokes what the first one minted."""
    if code is None:
        return "unknown"
    if code.used:
        return "reused"
    if code.expires_at <= now:
        return "expired"
    if client_id != code.oauth_client_id:
        return "client"
    if redirect_uri != code.redirect_uri:  # RFC 6749 §4.1.3: identical to the authorization request's
        return "redirect_uri"
    if resource is not None and resource.rstrip("/") != code.resource.rstrip("/"):
        return "resource"
    if not pkce_matches(verifier, code.code_challenge):
        return "pkce"
    return None


def is_metadata_url(client_id: str) -> bool:
    """A client id that is a URL (a client ID metadata document) rather than a registered id."""
    return client_id.startswith("https://") or client_id.startswith("http://")


def metadata_url_allowed(url: str) -> str:
    """The client ID metadata document's URL if it may be fetched at all (before any address is
    looked at): https, a host, a path, no credentials, no fragment, at most 2000 characters."""
    if len(url) > 2000:
        raise InvalidClient("The client_id URL is longer than 2000 characters.")
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        raise InvalidClient("The client_id URL does not parse.") from None
    if parts.scheme != "https":
        raise InvalidClient("A client_id URL must be https.")
    if not parts.hostname or parts.username or parts.password or parts.fragment:
        raise InvalidClient("A client_id URL needs a host, and no credentials or fragment.")
    if parts.path in ("", "/"):
        raise InvalidClient("A client_id URL needs a path (a metadata document, not a site's root).")
    return url


def address_allowed(address: str, *, allow_private: bool) -> bool:
    """Whether peerd may connect to `address` to fetch a client's metadata: a global address, or
    (only when the owner allows it) a private, loopback or link-local one. Never multicast,
    unspecified or reserved ones."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified:
        return False
    if ip.is_global:
        return True
    return allow_private and (ip.is_private or ip.is_loopback or ip.is_link_local)


def agent_code_parts(text: str) -> tuple[str, str] | None:
    """(code id, secret) of a pasted agent pairing code, or None when it is not one."""
    compact = "".join(text.split())
    if compact.startswith(AGENT_CODE_PREFIX):
        compact = compact[len(AGENT_CODE_PREFIX) :]
    code_id, dot, secret = compact.partition(".")
    if not dot or not re.fullmatch(r"[0-9a-f]{1,64}", code_id) or not 1 <= len(secret) <= 200:
        return None
    return code_id, secret


def agent_code(code_id: str, secret: str) -> str:
    return f"{AGENT_CODE_PREFIX}{code_id}.{secret}"


def signin_expiry(now: float, code_max_age_s: float | None) -> float:
    """When a sign-in ends for good: 30 days, or the pairing code's max age if shorter."""
    age = MAX_SIGNIN_S if code_max_age_s is None else min(MAX_SIGNIN_S, code_max_age_s)
    return now + age
