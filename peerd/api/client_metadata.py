"""Who an outside agent's OAuth client is (issue 29): a client ID metadata document fetched with
SSRF guards, or the checks a dynamic registration's metadata passes (api/agent_signin.py).

A metadata document is fetched only over https, without redirects, at most `MAX_METADATA_BYTES` in
`METADATA_TIMEOUT_S`, and only from addresses `core.agent_oauth.address_allowed` lets through: a
literal address is checked before any connection, a name by `GuardedResolver`, whose answer is the
one the connection uses (no rebinding between the check and the connect).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from peerd.core import agent_oauth as rules
from peerd.errors import InvalidClient
from peerd.peer.ratelimit import SlidingWindow

METADATA_TIMEOUT_S = 5.0
MAX_METADATA_BYTES = 8192
MAX_REDIRECT_URIS = 10
MAX_URI_CHARS = 2000
FETCHES_PER_MINUTE = 60
_PRIVATE_SCHEME = "abcdefghijklmnopqrstuvwxyz0123456789+.-"


@dataclass(frozen=True)
class AgentClient:
    client_id: str
    name: str | None
    redirect_uris: tuple[str, ...]


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
    `MAX_METADATA_BYTES` in `METADATA_TIMEOUT_S`, and at most `FETCHES_PER_MINUTE` a minute (anyone
    who reaches the listener can make the box fetch a URL; it must not become a fetching service)."""

    def __init__(
        self, *, allow_private: bool, limit: SlidingWindow | None = None, trust: ssl.SSLContext | None = None
    ) -> None:
        self.allow_private = allow_private
        self.limit = limit or SlidingWindow(FETCHES_PER_MINUTE, 60.0)
        self.trust = trust  # None: the system's CAs (a test trusts its own certificate)

    async def fetch(self, url: str) -> dict[str, Any]:
        rules.metadata_url_allowed(url)
        if not self.limit.hit("fetch"):
            raise InvalidClient(
                "This box fetched too many client metadata documents this minute; try again soon."
            )
        host = urlsplit(url).hostname or ""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None and not rules.address_allowed(host, allow_private=self.allow_private):
            raise InvalidClient(REFUSED_ADDRESS)
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(allow_private=self.allow_private),
            use_dns_cache=False,
            ssl=True if self.trust is None else self.trust,
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
                raw = b""
                while len(raw) <= MAX_METADATA_BYTES:  # a chunk at a time, never past the cap
                    chunk = await resp.content.read(MAX_METADATA_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
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
    return AgentClient(url, bounded_name(doc.get("client_name")), redirect_uris(doc.get("redirect_uris")))


def bounded_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 200:
        raise InvalidClient("client_name is a string of at most 200 characters.")
    return value


def redirect_uri_ok(uri: str) -> bool:
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


def redirect_uris(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_REDIRECT_URIS:
        raise InvalidClient(f"redirect_uris is a list of 1 to {MAX_REDIRECT_URIS} URIs.")
    if not all(isinstance(u, str) and redirect_uri_ok(u) for u in value):
        raise InvalidClient(
            "Each redirect URI must be https, http on a loopback address, or a private-use scheme, "
            "without a fragment."
        )
    return tuple(value)
