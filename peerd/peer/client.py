"""The peer client: calls a linked environment's API with its link.

One `aiohttp.ClientSession` per daemon; TLS pinned to the box's certificate fingerprint (one
cached `aiohttp.Fingerprint` per peer, so connections are pooled); the access token refreshed
under a per-link lock, the rotated refresh token persisted before the new access token is used.

Errors are typed; their codes say whether retrying can help (`peerd.errors.classify`): an
unreachable box (`unreachable`, also any 5xx answer) is transient; a pin mismatch, a revoked,
expired or missing (`not_linked`) link, or a typed refusal from the box is terminal. aiohttp's
`ServerFingerprintMismatch` subclasses `ClientConnectionError`, so it is caught first.

Nothing waits on a silent box for long: a call's read timeout is `CALL_TIMEOUT_S`, a long-poll's
is its own wait plus `LONG_POLL_MARGIN_S`, and the sockets use TCP keepalive, so a black-holed
route is noticed within one long-poll chunk. Every answer from a box (a call, a token refresh, a
probe of its descriptor) is published as `PeerAnswered(env_id)` (`peerd/events.py`): the
followers use it to end a backoff the moment the box is back.

Version skew. Every request says which wire revision this peerd speaks (`Peerd-Protocol`), and
every answer's revision and release (`Peerd-Protocol`, `Peerd-Version`; none: revision 1, the
releases before the header) is remembered per link (`protocol_of`). A call the box's revision lacks
(the change feed, `REQUIRED_PROTOCOL`) that it answers `not_found` is a typed `VersionSkew` naming
the machine to update; such an answer is not published as `PeerAnswered` (an answer that cannot be used
ends no backoff: otherwise the follower would retry it at once, for ever). While the box answers
with an older revision than this peerd needs to follow tasks (`FEED_PROTOCOL`), the link's status
is `version_skew`, with that sentence, instead of `reachable`.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
import yarl

from peerd import contracts as c
from peerd.contracts import RUNTIME_MODES
from peerd.core.access import require_write, runtime_rank
from peerd.core.console_bind import is_loopback
from peerd.core.links import LinkEvent, is_final, next_status
from peerd.errors import (
    CapabilityDenied,
    Incompatible,
    InvalidRequest,
    LinkClockSkew,
    NotAPeerd,
    NotLinked,
    PeerdError,
    PeerUnreachable,
    PinMismatch,
    RuntimeModeEscalationDenied,
    VersionSkew,
    from_body,
)
from peerd.events import Events, PeerAnswered
from peerd.peer.identity import pinned_fingerprint
from peerd.peer.skew import REQUIRED_PROTOCOL, PeerProtocol, skew_message
from peerd.store import links
from peerd.store.db import Database
from peerd.store.links import LinkRow

log = structlog.get_logger(__name__)

PAIRING_GRANT = "urn:peerd:params:oauth:grant-type:pairing-code"
MODE_LIMIT_HEADER = "X-Peerd-Mode-Limit"
REFRESH_MARGIN_S = 60.0
PROBE_TIMEOUT_LOOPBACK_S = 3.0
PROBE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0  # TCP and TLS handshakes
CALL_TIMEOUT_S = 30.0  # the longest silence a call (not a long-poll) waits for
LONG_POLL_MARGIN_S = 5.0  # a long-poll's answer may come this long after its own wait ended
# TCP keepalive: a connection whose peer vanished is dropped after about 15 + 3 * 5 s of silence.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 15, 5, 3

REVOKED_MESSAGE = (
    "The linked environment no longer accepts this link. It may have been revoked there; link it again."
)


# A box's answer is read up to this many bytes: a larger one (no answer of peerd's is near it;
# bundles are at most ~1.9 MB of JSON) is not taken, so a misbehaving box cannot fill this memory.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


async def read_answer(resp: aiohttp.ClientResponse) -> Any:
    """The answer's JSON, read at most `MAX_ANSWER_BYTES`; ValueError when larger or not JSON."""
    raw = bytearray()
    while chunk := await resp.content.read(64 * 1024):  # whatever arrived, at most 64 KiB
        raw += chunk
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer over {MAX_ANSWER_BYTES} bytes")
    return json.loads(raw) if raw else None


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """The client's sockets: TCP keepalive on, so a dead route is noticed in about 30 s."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock


def read_timeout(method: str, path: str, body: dict[str, Any] | None, params: dict[str, Any] | None) -> float:
    """How long a call waits for the box to say something: a long-poll its own wait (at most
    50 s) plus a margin, any other call `CALL_TIMEOUT_S`."""
    if not is_long_poll(method, path):
        return CALL_TIMEOUT_S
    asked = (body or {}).get("timeout") if method == "POST" else (params or {}).get("timeout")
    try:
        wait = float(asked) if asked is not None else c.LONG_POLL_MAX_S
    except (TypeError, ValueError):
        wait = c.LONG_POLL_MAX_S
    return min(max(wait, 0.0), c.LONG_POLL_MAX_S) + LONG_POLL_MARGIN_S


def expired_message(label: str) -> str:
    return f"The link to {label} expired. Link it again with a new pairing code from {label}."


def still_valid(link: LinkRow, now: float) -> bool:
    """By this machine's own record (its clock when the box last answered a refresh, plus the
    lifetime the box gave then: never the box's absolute time), is the link's refresh token valid?
    No record of its lifetime: nothing contradicts the box, whose word stands."""
    return link.refresh_expires_at is not None and link.refresh_expires_at > now


def clock_skew_message(link: LinkRow, now: float) -> str:
    left = f"{((link.refresh_expires_at or now) - now) / 86400:.0f} days left"
    return (
        f"{link.label} says the link expired, but by this machine's clock it is valid ({left}): "
        f"{link.label}'s clock is probably wrong (ahead). Fix the clock there; the link works again "
        "without a new pairing."
    )


def not_linked_message(env_id: str) -> str:
    return (
        f"This environment is not linked to {env_id}. The linked ones are listed by the environment_list "
        "tool (or `peerd environment list`)."
    )


def unreachable_message(label: str, urls: tuple[str, ...] | list[str]) -> str:
    return f"{label} did not answer at {', '.join(urls)}."


def is_loopback_url(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")


def check_url(url: str) -> str:
    """https anywhere; plain http only on loopback (it would carry the link's credentials in clear)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidRequest(f"{url!r} is not an http(s) address of a peerd listener.")
    if parts.scheme == "http" and not is_loopback_url(url):
        raise InvalidRequest(
            f"{url} is plain http, which would send the link's credentials unencrypted. Use its https address."
        )
    return url.rstrip("/")


def _ssl_for(url: str, fingerprint: bytes) -> aiohttp.Fingerprint | bool:
    return pinned_fingerprint(fingerprint) if url.startswith("https:") else True


class PeerClient:
    def __init__(
        self,
        db: Database,
        *,
        own_env_id: str,
        clock: Callable[[], float] = time.time,
        events: Events | None = None,
    ) -> None:
        self._db = db
        self._own_env_id = own_env_id
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._long_session: aiohttp.ClientSession | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._good_url: dict[str, str] = {}
        self._protocols: dict[str, PeerProtocol] = {}  # per link: what the box's last answer said
        self._events = events or Events()  # `PeerAnswered`: a box answered

    def protocol_of(self, env_id: str) -> PeerProtocol | None:
        """What the box's last answer said it speaks (None: no answer since this daemon started)."""
        return self._protocols.get(env_id)

    async def _answered(self, env_id: str) -> None:
        try:
            await self._events.publish(PeerAnswered(env_id))
        except Exception:  # a listener's bug must not fail the call that succeeded
            log.exception("peer.on_answer_failed", env_id=env_id)

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=CALL_TIMEOUT_S)
        # Two pools. Long-polls (the follower's watch, forwarded waits and event reads: up to 50 s
        # each) have no cap, so they never starve one another; every other call shares at most
        # CONNECTIONS_PER_BOX connections per box, so a burst (hundreds of launches at once) queues
        # here instead of opening more unauthenticated connections than a box admits per address.
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(
                limit=0,
                limit_per_host=CONNECTIONS_PER_BOX,
                keepalive_timeout=POOL_KEEPALIVE_S,
                socket_factory=keepalive_socket,
            ),
        )
        self._long_session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(
                limit=0, keepalive_timeout=POOL_KEEPALIVE_S, socket_factory=keepalive_socket
            ),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._long_session is not None:
            await self._long_session.close()
            self._long_session = None

    @property
    def db(self) -> Database:
        return self._db

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("PeerClient used before start()")
        return self._session

    def session_for(self, method: str, path: str) -> aiohttp.ClientSession:
        """The pool a call uses: the uncapped one for long-polls, else the capped one."""
        if self._long_session is not None and is_long_poll(method, path):
            return self._long_session
        return self.session

    # --- descriptor probes (no credentials) --------------------------------------------------

    async def probe(self, url: str, fingerprint: bytes) -> c.Descriptor:
        """GET the descriptor at `url` over pinned TLS; typed errors for every way it can be wrong."""
        timeout = PROBE_TIMEOUT_LOOPBACK_S if is_loopback_url(url) else PROBE_TIMEOUT_S
        try:
            async with self.session.get(
                f"{url}/.well-known/peerd",
                ssl=_ssl_for(url, fingerprint),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                body = await read_answer(resp) if resp.status == 200 else None
        except aiohttp.ServerFingerprintMismatch:
            raise PinMismatch(
                f"The machine at {url} presented a different certificate than the one pinned for it; "
                "nothing was sent. If that machine was reinstalled, link it again with a new pairing code."
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            raise PeerUnreachable(f"Nothing answered at {url}.") from None
        if not isinstance(body, dict) or body.get("service") != "peerd":
            raise NotAPeerd(f"Nothing at {url} answered as a peerd.")
        try:
            desc = c.Descriptor.model_validate(body)
        except ValueError:
            raise Incompatible(
                f"{url} answered in a shape this peerd does not understand; update both."
            ) from None
        if desc.protocol_version != c.PROTOCOL_VERSION:
            raise Incompatible(
                f"{desc.label} speaks peerd protocol {desc.protocol_version}, this one {c.PROTOCOL_VERSION}; "
                "update both, then link again."
            )
        return desc

    async def _base_url(self, link: LinkRow) -> str:
        """The first address whose descriptor says it is the linked environment; tokens go nowhere else."""
        cached = self._good_url.get(link.env_id)
        if cached is not None:
            return cached
        mismatch: PinMismatch | None = None
        for url in link.urls:
            try:
                desc = await self.probe(url, link.fingerprint)
            except PinMismatch as exc:
                mismatch = exc  # an impostor or a reused address: never sign in there
                continue
            except PeerdError:
                continue
            if desc.environment_id == link.env_id:
                self._good_url[link.env_id] = url
                await self._answered(link.env_id)  # it answers as the linked environment, at its pin
                return url
        if mismatch is not None:
            # Something answers where the box should, with another certificate: retrying cannot
            # help, and it is worth a person's attention (reinstalled box, or an impostor).
            raise mismatch
        raise PeerUnreachable(unreachable_message(link.label, link.urls))

    # --- tokens ------------------------------------------------------------------------------

    async def load_link(self, env_id: str) -> LinkRow:
        link = await links.get(self._db, env_id)
        if link is None:
            raise NotLinked(not_linked_message(env_id))
        if link.status == "revoked":
            raise CapabilityDenied(REVOKED_MESSAGE)
        if link.status == "expired" or (link.refresh_expires_at and link.refresh_expires_at < self._clock()):
            raise CapabilityDenied(expired_message(link.label))
        return link

    async def _fail_link(self, link: LinkRow, event: LinkEvent, message: str) -> CapabilityDenied:
        await links.record_outcome(
            self._db, link.env_id, event=event, error=message, reached_at=self._clock()
        )
        return CapabilityDenied(message)

    async def access_token(self, env_id: str, *, force_refresh: bool = False) -> tuple[LinkRow, str]:
        """A valid access token; at most one refresh per link at a time."""
        async with self._locks.setdefault(env_id, asyncio.Lock()):
            link = await self.load_link(env_id)
            fresh = (
                link.access_expires_at is not None
                and link.access_expires_at - REFRESH_MARGIN_S > self._clock()
            )
            if link.access_token and fresh and not force_refresh:
                return link, link.access_token
            base = await self._base_url(link)
            form = {"grant_type": "refresh_token", "refresh_token": link.refresh_token}
            status, body = await self.post_form(link, base, "/oauth/token", form)
            if status != 200:
                reason = body.get("peerd_reason") if isinstance(body, dict) else None
                if status == 400 and reason == "expired":
                    if still_valid(link, self._clock()):
                        # Judged by this machine's clock of its last refresh, the link is valid:
                        # the box's clock is wrong. Nothing is marked; it works once that is fixed.
                        raise LinkClockSkew(clock_skew_message(link, self._clock()))
                    raise await self._fail_link(link, "refused_expired", expired_message(link.label))
                if status == 400:  # revoked, reused or unknown: the box no longer accepts this link
                    raise await self._fail_link(link, "refused", REVOKED_MESSAGE)
                raise PeerUnreachable(f"{link.label} answered HTTP {status} while refreshing the link.")
            now = self._clock()
            answer = _token_answer(body, link.label)
            updated = link.with_tokens(
                refresh_token=answer.refresh_token,
                refresh_expires_at=None
                if answer.refresh_expires_in is None
                else now + answer.refresh_expires_in,
                access_token=answer.access_token,
                access_expires_at=now + answer.expires_in,
            )
            await links.save_tokens(self._db, updated)  # persisted before it is used
            await self._answered(env_id)
            return updated, answer.access_token

    async def post_form(self, link: LinkRow, base: str, path: str, form: dict[str, str]) -> tuple[int, Any]:
        try:
            async with self.session.post(
                f"{base}{path}", data=form, ssl=_ssl_for(base, link.fingerprint)
            ) as resp:
                return resp.status, await read_answer(resp)
        except aiohttp.ServerFingerprintMismatch:
            self._good_url.pop(link.env_id, None)
            raise PinMismatch(
                f"{link.label} at {base} presented another certificate; nothing was sent."
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            self._good_url.pop(link.env_id, None)
            raise PeerUnreachable(unreachable_message(link.label, link.urls)) from None

    # --- calls -------------------------------------------------------------------------------

    async def call(
        self,
        env_id: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        mode_limit: str | None = None,
    ) -> Any:
        """Call the linked environment's API as this link; the peer's own error codes are kept.

        What the link cannot do is refused here first, so a refused call sends nothing."""
        precheck(await self.load_link(env_id), method, path, body)
        for attempt in (1, 2):
            try:
                link, token = await self.access_token(env_id, force_refresh=attempt == 2)
                base = await self._base_url(link)
            except PeerUnreachable as exc:  # no address answered as the box: say so on the link
                await links.record_outcome(
                    self._db, env_id, event="no_answer", error=exc.message, reached_at=None
                )
                raise
            except LinkClockSkew as exc:  # it answered, with its clock wrong: said on the link
                await links.record_outcome(
                    self._db, env_id, event="answered", error=exc.message, reached_at=self._clock()
                )
                raise
            headers = {"Authorization": f"Bearer {token}", c.PROTOCOL_HEADER: str(c.WIRE_PROTOCOL)}
            if mode_limit:
                headers[MODE_LIMIT_HEADER] = mode_limit
            query = {k: _q(v) for k, v in (params or {}).items() if v is not None}
            try:
                async with self.session_for(method, path).request(
                    method,
                    # `path` is already encoded (ids as `path_segment`s): taken as is, never
                    # re-quoted nor dot-normalised (`%2E%2E` must not become `..`).
                    yarl.URL(f"{base}{path}", encoded=True).with_query(query),
                    json=body,
                    headers=headers,
                    ssl=_ssl_for(base, link.fingerprint),
                    timeout=aiohttp.ClientTimeout(
                        total=None,
                        sock_connect=CONNECT_TIMEOUT_S,
                        sock_read=read_timeout(method, path, body, params),
                    ),
                ) as resp:
                    status = resp.status
                    peer = PeerProtocol.of(resp.headers)
                    data = await read_answer(resp)
            except aiohttp.ServerFingerprintMismatch:
                self._good_url.pop(env_id, None)
                raise PinMismatch(
                    f"{link.label} at {base} presented another certificate; nothing was sent."
                ) from None
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                self._good_url.pop(env_id, None)
                message = unreachable_message(link.label, link.urls)
                await self._outcome(link, "no_answer", message)
                raise PeerUnreachable(message) from exc
            if status == 401 and attempt == 1:
                continue  # the access token may have expired early: refresh once and retry
            if status == 401:
                raise await self._fail_link(link, "refused", REVOKED_MESSAGE)
            if status >= 500 or not isinstance(data, (dict, list)):
                message = f"{link.label} answered HTTP {status}."
                await self._outcome(link, "no_answer", message)
                raise PeerUnreachable(message)
            self._protocols[env_id] = peer
            needed = REQUIRED_PROTOCOL.get(path, 1)
            if status == 404 and peer.revision < needed:  # the route is newer than the box
                skew = VersionSkew(skew_message(link.label, peer))
                await self._outcome(link, "answered_older", skew.message)
                raise skew  # no `_answered`: this answer ends no backoff
            await self._answered(env_id)
            if peer.revision < c.FEED_PROTOCOL:
                await self._outcome(link, "answered_older", skew_message(link.label, peer))
            else:
                await self._outcome(link, "answered", None)
            if status >= 400:
                if isinstance(data, dict) and "code" in data:
                    raise from_body(data)
                raise PeerdError(f"{link.label} answered HTTP {status}.")
            return data
        raise AssertionError("unreachable")  # pragma: no cover  # the loop always returns or raises

    async def _outcome(self, link: LinkRow, event: LinkEvent, error: str | None) -> None:
        """The link's outcome, written only when it changes (compared with the row this call read),
        and its reached time at most once a minute: a write per forwarded call costs a transaction.
        A link that ended meanwhile stays as it ended (`core/links.py`, applied by the store)."""
        status = next_status(link.status, event)
        if is_final(status):
            return  # it ended (as this call read it): nothing changes it, and the store agrees
        reached = None
        if event in ("answered", "answered_older"):  # the box answered (a skewed one too)
            reached = self._clock()
            last = link.last_reached_at
            unchanged = link.status == status and link.last_error == error
            if unchanged and last is not None and reached - last < REACHED_REFRESH_S:
                return
        elif link.status == status and link.last_error == error:
            return
        await links.record_outcome(self._db, link.env_id, event=event, error=error, reached_at=reached)

    async def revoke(self, link: LinkRow) -> bool:
        """RFC 7009 revocation at the box; False when the box could not be told."""
        try:
            base = await self._base_url(link)
            status, _ = await self.post_form(link, base, "/oauth/revoke", {"token": link.refresh_token})
        except PeerdError:
            return False
        return status == 200


MAX_TOKEN_LIFETIME_S = 10 * 365 * 24 * 3600.0  # no lifetime a box sends is taken as longer


@dataclass(frozen=True)
class _TokenAnswer:
    access_token: str
    refresh_token: str
    expires_in: float
    refresh_expires_in: float | None

    def __repr__(self) -> str:  # tokens never reach a log through repr()
        return f"_TokenAnswer(expires_in={self.expires_in}, refresh_expires_in={self.refresh_expires_in})"


def _lifetime(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a finite number")
    return float(min(max(value, 0.0), MAX_TOKEN_LIFETIME_S))


def _token_answer(body: Any, label: str) -> _TokenAnswer:
    """A refresh answer the laptop can store: two non-empty token strings and finite lifetimes. A
    box answering anything else keeps the stored tokens and is treated as not answering properly."""
    try:
        if not isinstance(body, dict):
            raise ValueError("not an object")
        access, refresh = body.get("access_token"), body.get("refresh_token")
        if not (isinstance(access, str) and access and isinstance(refresh, str) and refresh):
            raise ValueError("no tokens")
        refresh_in = body.get("refresh_expires_in")
        return _TokenAnswer(
            access,
            refresh,
            _lifetime(body.get("expires_in")),
            None if refresh_in is None else _lifetime(refresh_in),
        )
    except ValueError:
        raise PeerUnreachable(
            f"{label} answered the link's token refresh with an unusable answer; the link's tokens were kept."
        ) from None


# POSTs for their bodies that only read (the change feed's subscription names runs to follow).
READ_ONLY_POSTS = frozenset({"/v1/watch", "/v1/feed/subscription", "/v1/feed/changes"})
REACHED_REFRESH_S = 60.0  # how stale a link's stored "last reached" may get while it answers
# At most this many connections per box for calls other than long-polls: below the box's cap on
# connections per address that have not yet made an authenticated request (api/listener_rules.py).
CONNECTIONS_PER_BOX = 16
# An idle pooled connection is kept this long for the next call (aiohttp's default is 15 s): under
# the box's idle timeout (api/listener_rules.py IDLE_TIMEOUT_S, 30 s), so the laptop never reuses
# one the box is about to close, and long enough that a link's calls rarely need a new connection
# (a kept one is authenticated at the box: no flood of unknown connections can evict it).
POOL_KEEPALIVE_S = 25.0


def is_long_poll(method: str, path: str) -> bool:
    """The box's long-polls: the follower's change feed (and the batched watch before it), and a
    thread's wait and events."""
    if method == "POST":
        return path in ("/v1/feed/changes", "/v1/watch")
    return method == "GET" and path.startswith("/v1/threads/") and path.endswith(("/wait", "/events"))


def precheck(link: LinkRow, method: str, path: str, body: dict[str, Any] | None) -> None:
    """The box enforces access; the laptop checks the same rules first so nothing refused is sent."""
    if method.upper() != "GET" and path not in READ_ONLY_POSTS:
        require_write(link.access, "change anything there")
    requested = (body or {}).get("runtimeMode")
    if (
        isinstance(requested, str)
        and requested in RUNTIME_MODES
        and runtime_rank(requested) > runtime_rank(link.access)
    ):
        raise RuntimeModeEscalationDenied(
            f"Runtime mode {requested} is broader than the link to {link.label} allows ({link.access})."
        )


def _q(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
