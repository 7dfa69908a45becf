"""Pairing and links as operations: the box mints codes and lists/revokes clients; the laptop links,
lists its environments and unlinks. Everything here is local-only (never reachable over a link).

What the box says about itself is checked, not taken (issue 11). The environment id a link is
stored and shown under is derived from the public key in the certificate the code pins (fetched
over TLS and compared with the pin); a code or a descriptor naming another id is refused with
`wrong_environment` before anything secret is sent. (A plain-http link, loopback only, has no
certificate: there the code's id, confirmed by the descriptor, stands.) The box's label is
stripped of control characters and bounded, and its token answer must hold finite, bounded
lifetimes and an access no wider than the one asked for.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import structlog

from peerd import contracts as c
from peerd.core import pairing_code
from peerd.core.access import ACCESS_LEVELS, access_within
from peerd.core.agent_oauth import agent_code
from peerd.core.envid import normalize_env_id
from peerd.core.links import is_final
from peerd.core.text import clean_label
from peerd.errors import (
    PAIRING_REASONS,
    AccessExceedsCode,
    InvalidRequest,
    NotLinked,
    PairingRejected,
    PeerdError,
    PeerUnreachable,
    PinMismatch,
    RateLimited,
    SelfLink,
    WrongEnvironment,
)
from peerd.events import ClientRevoked, Events, LinkChecked, LinkForgotten
from peerd.peer.client import (
    PAIRING_GRANT,
    PeerClient,
    check_url,
    is_loopback_url,
    not_linked_message,
    unreachable_message,
)
from peerd.peer.identity import Identity, env_id_from_certificate
from peerd.store import clients, links, pairing
from peerd.store.db import Database
from peerd.store.links import LinkRow

log = structlog.get_logger(__name__)

MAX_LABEL_CHARS = 200
CERT_TIMEOUT_S = 10.0
CERT_TIMEOUT_LOOPBACK_S = 3.0
MAX_LIFETIME_S = 10 * 365 * 24 * 3600.0  # no token lifetime a box sends may be longer
# `environment list`/`show` wait at most this long for the boxes' answers.
LIVE_CHECK_S = 2.0
LATE_MESSAGE = f"It did not answer within {LIVE_CHECK_S:g} s; the status shown is the last one known."


async def peer_certificate(url: str) -> bytes:
    """The DER certificate the TLS listener at `url` presents (compared with its pin by the caller)."""
    parts = urlsplit(url)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a self-signed cert: the pin is what authenticates it
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    timeout = CERT_TIMEOUT_LOOPBACK_S if is_loopback_url(url) else CERT_TIMEOUT_S
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 443, ssl=ctx)
    except (OSError, TimeoutError, ssl.SSLError):
        raise PeerUnreachable(f"Nothing answered at {url}.") from None
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    finally:
        writer.close()
        try:
            async with asyncio.timeout(timeout):
                await writer.wait_closed()
        except (OSError, TimeoutError, ssl.SSLError):
            pass
    if not der:
        raise PeerUnreachable(f"{url} presented no certificate.")
    return bytes(der)


def _lifetime(body: dict[str, Any], key: str, label: str) -> float | None:
    """A relative lifetime from the box's token answer: absent, or finite and within bounds."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PairingRejected(f"{label} answered the link with an unusable {key}; nothing was stored.")
    return float(min(max(value, 0.0), MAX_LIFETIME_S))


def _label_of(text: str, fallback: str) -> str:
    return clean_label(text)[:MAX_LABEL_CHARS] or fallback


_REASONS = {
    "unknown_code": "it does not know this code",
    "wrong_secret": "the code's secret is wrong",
    "expired": "the code expired",
    "used": "the code was already used",
    "burnt": "the code saw too many wrong attempts and was burnt",
    "cancelled": "the code was cancelled",
}


class LinkService:
    def __init__(
        self,
        db: Database,
        identity: Identity,
        peers: PeerClient,
        *,
        label: str,
        advertised_urls: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
        events: Events | None = None,
    ) -> None:
        self.db = db
        self.identity = identity
        self.peers = peers
        self.label = label
        self.advertised_urls = advertised_urls
        self.clock = clock
        # What goes out: `LinkForgotten` (its follower ends its tasks), `ClientRevoked` (box side:
        # that client's long-polls end at once), `LinkChecked` (a box's `GET /v1/link` answer, with
        # its capacity report: peerd/placement/).
        self._events = events or Events()
        self._background: set[asyncio.Future[None]] = set()  # live checks that outlived a listing

    # --- box side ----------------------------------------------------------------------------

    async def pair_create(self, req: c.PairCreate) -> c.PairCreateResult:
        urls = [check_url(u) for u in req.urls] or self.advertised_urls()
        if req.purpose == "agent":
            return await self._agent_code(req, urls)
        if not urls:
            raise InvalidRequest(
                "This daemon has no network listener, so a laptop could not reach it. Restart it with "
                "`peerd serve --listen HOST:PORT`, or pass --url with the address the laptop should use."
            )
        info, secret = await pairing.create_code(
            self.db,
            access=req.access,
            ttl_s=req.ttl_s,
            label_hint=req.label_hint,
            max_age_s=req.max_age_s,
            now=self.clock(),
        )
        code = pairing_code.PairingCode(
            code_id=info.id,
            secret=secret,
            env_id=self.identity.env_id,
            fingerprint=self.identity.fingerprint,
            urls=tuple(urls),
            access=req.access,
        )
        log.info("pair.created", code_id=info.id, access=req.access, expires_at=info.expires_at)
        return c.PairCreateResult(code=code.encode(), info=info, urls=urls)

    async def _agent_code(self, req: c.PairCreate, urls: list[str]) -> c.PairCreateResult:
        """A code a person types into an outside agent's sign-in page (`/oauth/authorize`)."""
        info, secret = await pairing.create_code(
            self.db,
            access=req.access,
            ttl_s=req.ttl_s,
            label_hint=req.label_hint,
            max_age_s=req.max_age_s,
            now=self.clock(),
            purpose="agent",
        )
        log.info(
            "pair.created", code_id=info.id, access=req.access, expires_at=info.expires_at, purpose="agent"
        )
        return c.PairCreateResult(code=agent_code(info.id, secret), info=info, urls=urls)

    async def pair_list(self, *, include_done: bool) -> list[c.PairingCodeInfo]:
        return await pairing.list_codes(self.db, now=self.clock(), include_done=include_done)

    async def pair_cancel(self, code_id: str) -> c.PairingCodeInfo:
        return await pairing.cancel_code(self.db, code_id, now=self.clock())

    async def client_list(self) -> list[c.ClientInfo]:
        return await clients.list_clients(self.db, now=self.clock())

    async def client_revoke(self, client_id: str) -> c.ClientInfo:
        revoked = await clients.revoke_client(self.db, client_id, reason="Revoked here.", now=self.clock())
        await self._events.publish(
            ClientRevoked(client_id)
        )  # its open long-polls end now, not at their timeout
        return revoked

    # --- laptop side -------------------------------------------------------------------------

    async def link(self, req: c.LinkCreate) -> c.LinkInfo:
        code = pairing_code.decode(req.code)
        if code.env_id == self.identity.env_id:
            raise SelfLink(
                "That pairing code is this environment's own; run `peerd link` on the other machine."
            )
        if not access_within(req.access, code.access):
            raise AccessExceedsCode(
                f"Access {req.access} exceeds what this pairing code allows ({code.access}). Ask for "
                f"--access {code.access} or lower, or make a new code with `peerd pair --access {req.access}`.",
                requested=req.access,
                ceiling=code.access,
            )
        urls = list(dict.fromkeys(check_url(u) for u in [*req.urls, *code.urls]))
        good: list[str] = []
        silent: list[str] = []  # did not answer now; kept, since each use checks the address again
        label = code.env_id
        failures: list[PeerdError] = []
        for url in urls:
            try:
                desc = await self.peers.probe(url, code.fingerprint)
            except PinMismatch:
                raise  # fail closed: something else holds this address
            except PeerdError as exc:
                failures.append(exc)
                if isinstance(exc, PeerUnreachable):
                    silent.append(url)
                continue
            pinned = await self._pinned_env_id(url, code.fingerprint)
            if pinned is not None and pinned != code.env_id:
                raise WrongEnvironment(
                    f"The pairing code names environment {code.env_id}, but the certificate it pins at "
                    f"{url} belongs to {pinned}. Ask for a new code on that machine; nothing was sent."
                )
            if desc.environment_id == self.identity.env_id:
                raise SelfLink("That address is this environment.")
            if desc.environment_id != code.env_id:
                raise WrongEnvironment(
                    f"{url} answered as environment {desc.environment_id}, but the pairing code is for {code.env_id}; "
                    "nothing was sent."
                )
            label = _label_of(desc.label, code.env_id)
            good.append(url)
        if not good:
            if failures and not all(isinstance(f, PeerUnreachable) for f in failures):
                raise next(f for f in failures if not isinstance(f, PeerUnreachable))
            raise PeerUnreachable(unreachable_message(code.env_id, urls))
        form = {
            "grant_type": PAIRING_GRANT,
            "code_id": code.code_id,
            "code_secret": code.secret,
            "access": req.access,
            "client_label": req.label or self.label,
            "client_env_id": self.identity.env_id,
        }
        if req.max_age_s:
            form["max_age"] = str(req.max_age_s)  # not int(): 0.5 would become "0", refused there
        provisional = LinkRow(
            env_id=code.env_id,
            label=label,
            urls=tuple(good),
            fingerprint=code.fingerprint,
            access=req.access,
            client_id="",
            refresh_token="",
            refresh_expires_at=None,
            access_token=None,
            access_expires_at=None,
            linked_at=self.clock(),
        )
        status, body = await self.peers.post_form(provisional, good[0], "/oauth/token", form)
        if status != 200:
            raise self._token_error(status, body, label)
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k), str) and body[k] for k in ("client_id", "refresh_token", "access_token")
        ):
            raise PairingRejected(f"{label} answered the link in a shape this peerd does not understand.")
        now = self.clock()
        refresh_in = _lifetime(body, "refresh_expires_in", label)  # 0 means now, not never
        access_in = _lifetime(body, "expires_in", label) or 0.0
        scope = body.get("scope")
        # The box may narrow the access asked for, never widen it.
        granted = scope if scope in ACCESS_LEVELS and access_within(scope, req.access) else req.access
        row = LinkRow(
            env_id=code.env_id,
            label=label,
            urls=(*good, *silent),
            fingerprint=code.fingerprint,
            access=granted,
            client_id=body["client_id"][:200],
            refresh_token=body["refresh_token"],
            refresh_expires_at=None if refresh_in is None else now + refresh_in,
            access_token=body["access_token"],
            access_expires_at=now + access_in,
            linked_at=now,
            last_reached_at=now,
        )
        replaced = await links.upsert(self.db, row)
        if replaced is not None and replaced.client_id != row.client_id:
            # The earlier link's session would otherwise live on at the box, unused.
            told = await self.peers.revoke(replaced)
            log.info("link.replaced", env_id=row.env_id, old_revoked_there=told)
        log.info("link.created", env_id=row.env_id, label=label, access=row.access)
        made = row.info(now=now)
        return made if replaced is None else made.model_copy(update={"replaced_access": replaced.access})

    async def _pinned_env_id(self, url: str, pin: bytes) -> str | None:
        """The id of the key in the certificate `url` presents for `pin`; None over plain http."""
        if not url.startswith("https:"):
            return None
        der = await peer_certificate(url)
        try:
            return env_id_from_certificate(der, pin)
        except ValueError:
            raise PinMismatch(
                f"The machine at {url} presented a different certificate than the pairing code pins; "
                "nothing was sent."
            ) from None

    @staticmethod
    def _token_error(status: int, body: Any, label: str) -> PeerdError:
        error = body.get("error") if isinstance(body, dict) else None
        reason = body.get("peerd_reason") if isinstance(body, dict) else None
        described = body.get("error_description") if isinstance(body, dict) else None
        if status == 429 or error == "slow_down":
            return RateLimited(
                f"{label} is refusing pairing attempts for a while (too many failures); try later."
            )
        if reason == AccessExceedsCode.code:
            return AccessExceedsCode(str(described or "The requested access exceeds the pairing code's."))
        if error == "invalid_grant":  # RFC 6749's error for a code it refused
            known = next((r for r in PAIRING_REASONS if r == reason), None)
            why = _REASONS.get(known or "", "it refused the code")
            return PairingRejected(
                f"{label} did not accept the pairing code: {why}. Run `peerd pair` there for a new one.",
                reason=known,
            )
        return PairingRejected(f"{label} refused the link: {described or error or f'HTTP {status}'}.")

    async def environment_list(self, *, probe: bool = True) -> list[c.LinkInfo]:
        """Every link; with `probe`, each box is asked now (in parallel, at most LIVE_CHECK_S)."""
        rows = await links.all_links(self.db)
        if not probe:
            return [r.info(now=self.clock()) for r in rows]
        checked, late = await self._check_live(rows)
        now = self.clock()
        return [_shown(r.info(now=now), r.env_id, checked, late) for r in await links.all_links(self.db)]

    async def environment_show(self, env_id: str, *, probe: bool = True) -> c.LinkInfo:
        row = await self._row(env_id)
        if not probe:
            return row.info(now=self.clock())
        checked, late = await self._check_live([row])
        return _shown((await self._row(env_id)).info(now=self.clock()), row.env_id, checked, late)

    async def _check_live(self, rows: list[LinkRow]) -> tuple[set[str], set[str]]:
        """Ask each box, as the link, whether it still accepts the link: the env ids checked, and
        those of them that did not answer within LIVE_CHECK_S. The answer (reachable, unreachable, revoked, expired) is
        recorded by the call itself. A check that is late is never cancelled (it may be rotating
        the link's refresh token): it finishes in the background and records what it learns."""
        checks = {
            asyncio.ensure_future(self._check_one(r)): r.env_id
            for r in rows
            if not is_final(r.info(now=self.clock()).status)
        }
        if not checks:
            return set(), set()
        _, pending = await asyncio.wait(checks, timeout=LIVE_CHECK_S)
        for task in pending:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return set(checks.values()), {checks[t] for t in pending}

    async def _check_one(self, row: LinkRow) -> None:
        try:
            answer = await self.peers.call(row.env_id, "GET", "/v1/link")
            await self._events.publish(LinkChecked(row.env_id, answer))
        except PinMismatch as exc:
            await links.record_outcome(
                self.db, row.env_id, event="no_answer", error=str(exc), reached_at=None
            )
        except PeerdError:
            pass  # unreachable, revoked or expired: recorded by the call
        except Exception:  # a bug here must not fail the listing
            log.exception("link.live_check_failed", env_id=row.env_id)

    async def unlink(self, env_id: str) -> c.UnlinkResult:
        row = await self._row(env_id)
        told = False if row.status == "revoked" else await self.peers.revoke(row)
        await links.delete(self.db, row.env_id)
        await self._events.publish(LinkForgotten(row.env_id))  # its follower ends the link's tasks now
        if row.status == "revoked":
            message = f"Forgot the link to {row.label}; {row.label} had already revoked it."
        elif told:
            message = f"Unlinked {row.label}: the link was revoked there and forgotten here."
        else:
            message = (
                f"Forgot the link to {row.label} here, but {row.label} could not be told; "
                f"revoke it there with `peerd client revoke {row.client_id}`."
            )
        return c.UnlinkResult(environment_id=row.env_id, label=row.label, revoked_there=told, message=message)

    async def _row(self, env_id: str) -> LinkRow:
        try:
            key = normalize_env_id(env_id)
        except PeerdError:
            key = env_id
        row = await links.get(self.db, key)
        if row is None:
            for candidate in await links.all_links(self.db):
                if candidate.label == env_id:
                    return candidate
            raise NotLinked(not_linked_message(env_id))
        return row


def _shown(info: c.LinkInfo, env_id: str, checked: set[str], late: set[str]) -> c.LinkInfo:
    """`live` when the box answered just now; a late box keeps its last known status, said so."""
    if env_id in late:
        return info.model_copy(update={"last_error": LATE_MESSAGE})
    return info.model_copy(update={"live": env_id in checked})
