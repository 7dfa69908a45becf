"""The network listener's rules as plain state: caps, per-connection deadlines, Host names, log pacing.

No sockets here (`peerd.api.listener` applies these to real connections), so each rule is tested
with plain values and a fake clock.

- `ConnectionGate`: a cap on all connections of the listener, on those from one peer address, and
  on those that have not yet made an authenticated request. When a cap is full an unauthenticated
  connection is evicted to make room for the new one, the one least likely to be a link's (see
  `ConnectionGate.victim`); only when there is none is the new one refused (the caller closes it
  before the TLS handshake). An authenticated connection (a link's) is never evicted and never
  counts against the unauthenticated or per-address caps.
- `Timeline`: one connection's current deadline. The client must finish a request's head within
  `head_s` of the connection (after TLS) or of its first byte after an idle pause (of the previous
  response, if it sent while we answered), the body within `body_s` of the head, and may stay idle
  between requests `idle_s`. Our own answer has no deadline: long-polls answer after up to 50 s.
- `HostPolicy`: which `Host` headers a listener accepts (DNS rebinding).
- `Pacer`: at most one log line a second for a repeating event, with the count of those left out.
- `CrowdLog`: the evictions and refusals of the gate, together at most one line a second.
"""

from __future__ import annotations

import enum
import ipaddress
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# Caps. The total is derived from the open-file soft limit: half of it, leaving the rest for runs
# (each holds pipes and log files), the database, the Unix sockets and outgoing link calls, and
# at least RESERVED_FDS of them however low the limit is.
# Per peer address, only connections that have not yet made an authenticated request count: a
# flood from one address is of those, while a linked laptop's many long-polls are authenticated
# (and bounded by the total cap and by revocation). A laptop keeps its own unauthenticated burst
# below this (`peer/client.py:CONNECTIONS_PER_BOX`).
MAX_PER_ADDRESS = 32
MAX_UNAUTHENTICATED = 128
# How many addresses a link has authenticated from the gate remembers (most recent kept): an
# unauthenticated connection from one of them is evicted last (see `ConnectionGate.victim`).
LINK_ADDRESSES_KEPT = 256
TOTAL_SHARE_OF_NOFILE = 0.5
RESERVED_FDS = 64

# Timeouts on what the client sends (never on our answer).
TLS_HANDSHAKE_TIMEOUT_S = 10.0
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0  # the whole body, up to MAX_BODY_BYTES (2 MiB)
IDLE_TIMEOUT_S = 30.0
TLS_SHUTDOWN_TIMEOUT_S = 5.0  # how long a closing TLS connection may hold its descriptor

LOG_EVERY_S = 1.0


@dataclass(frozen=True)
class ListenerLimits:
    """The TCP listener's caps and timeouts (the defaults are the constants above; tests lower them)."""

    total: int | None = None  # None: TOTAL_SHARE_OF_NOFILE of the open-file soft limit
    per_address: int = MAX_PER_ADDRESS
    unauthenticated: int = MAX_UNAUTHENTICATED
    handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    tls_shutdown_timeout_s: float = TLS_SHUTDOWN_TIMEOUT_S

    def total_for(self, nofile_soft: int) -> int:
        if self.total is not None:
            return self.total
        share = int(nofile_soft * TOTAL_SHARE_OF_NOFILE)
        return max(1, min(share, nofile_soft - RESERVED_FDS))


def address_key(peername: object) -> str:
    """Who counts as one peer: an IPv4 address, or an IPv6 /64 (one host can hold a whole /64);
    an IPv4-mapped IPv6 address counts as its IPv4 address."""
    host = peername[0] if isinstance(peername, tuple) and peername else peername
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Refusal(enum.StrEnum):
    """Why a new connection was reset: its cap is full and no connection can be evicted for it."""

    TOTAL = "total"
    PER_ADDRESS = "per_address"
    UNAUTHENTICATED = "unauthenticated"


@dataclass(frozen=True)
class Admitted:
    """A new connection takes a slot; `evicted`: the id of the connection the caller must close now
    to make room (the gate has already released it)."""

    evicted: int | None = None


@dataclass
class ConnectionGate:
    """Open connections by id: `pending` the not yet authenticated ones (oldest first, with their
    address), `known` those that made an authenticated request, `busy` the pending ones with a
    request in flight, `opening` the pending ones whose transport is being made, `closing` evicted
    ones whose descriptor is not closed yet, `link_addresses` the addresses links authenticated
    from (most recent last, at most `LINK_ADDRESSES_KEPT`). `admit` takes a slot, evicting a
    pending connection when a cap is full, or says which cap refuses it.

    The total cap counts descriptors, so however fast connections arrive there are never more: an
    evicted connection's descriptor is closed at once by the caller, except one whose transport is
    being made (`opening`, for a turn of the event loop), which is closed when that is done and is
    counted (`closing`) until then. When the descriptors are at the total cap only a connection that
    can be closed at once makes room.

    A known connection is never evicted and never counts against the pending caps; only the total
    cap (descriptors) bounds it. A pending one is evicted in this order (`victim`), so a flood of
    unknown connections, however fast it reconnects, pushes out its own and not a link's new
    connection in its TLS handshake or first request:

    1. not from an address a link authenticated from, before one that is (a laptop reconnects from
       where its link's other connections are);
    2. from the address holding the most pending connections first (a flood holds many per
       address, a laptop one or a few; it takes a flood from more addresses than the budget has
       slots to tie with a laptop);
    3. one with no request in flight before one with a request in flight (pairing, a token
       refresh, a link's first request until its token is checked);
    4. the oldest first.

    At a full per-address cap the new connection evicts one of its own address's idle ones (or is
    refused): an address only ever pushes out its own.
    """

    total_cap: int
    per_address_cap: int
    unauthenticated_cap: int
    pending: dict[int, str] = field(default_factory=dict)  # insertion order: oldest first
    known: set[int] = field(default_factory=set)
    busy: set[int] = field(default_factory=set)
    opening: set[int] = field(default_factory=set)
    closing: set[int] = field(default_factory=set)
    by_address: Counter[str] = field(default_factory=Counter)
    link_addresses: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @classmethod
    def for_limits(cls, limits: ListenerLimits, nofile_soft: int) -> ConnectionGate:
        return cls(limits.total_for(nofile_soft), limits.per_address, limits.unauthenticated)

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.known) + len(self.closing)

    @property
    def unauthenticated(self) -> int:
        return len(self.pending)

    def admit(self, conn_id: int, key: str) -> Admitted | Refusal:
        at_total = self.total >= self.total_cap  # a descriptor must be freed now
        evicted: int | None = None
        if self.by_address[key] >= self.per_address_cap:
            evicted = self._oldest_idle_of(key, closable=at_total)  # its own: one is enough
            if evicted is None:
                return Refusal.PER_ADDRESS
        elif self.unauthenticated >= self.unauthenticated_cap or at_total:
            evicted = self.victim(closable=at_total)
            if evicted is None:
                return Refusal.TOTAL if at_total else Refusal.UNAUTHENTICATED
        if evicted is not None:
            self._evict(evicted)
        self.pending[conn_id] = key
        self.by_address[key] += 1
        return Admitted(evicted)

    def victim(self, *, closable: bool = False) -> int | None:
        """The pending connection to evict for a new one (the order in the class's docstring), or
        None when there is none; `closable`: only one whose descriptor can be closed at once. One
        pass over at most `unauthenticated_cap` connections."""
        chosen: int | None = None
        best: tuple[bool, int, bool] | None = None
        for conn_id, key in self.pending.items():  # oldest first: a tie keeps the older
            if closable and conn_id in self.opening:
                continue
            rank = (key in self.link_addresses, -self.by_address[key], conn_id in self.busy)
            if best is None or rank < best:
                chosen, best = conn_id, rank
        return chosen

    def _oldest_idle_of(self, key: str, *, closable: bool) -> int | None:
        """The oldest pending connection of address `key` with no request in flight."""
        for conn_id, conn_key in self.pending.items():  # at most unauthenticated_cap of them
            if conn_key == key and conn_id not in self.busy and not (closable and conn_id in self.opening):
                return conn_id
        return None

    def _evict(self, conn_id: int) -> None:
        """Out of the pending caps at once; its descriptor counts until closed if it is opening."""
        opening = conn_id in self.opening
        self.release(conn_id)
        if opening:
            self.closing.add(conn_id)

    def transport(self, conn_id: int, *, ready: bool) -> None:
        """Its transport is being made (False: its descriptor cannot be closed at once) or is in
        hand (True)."""
        if not ready and conn_id in self.pending:
            self.opening.add(conn_id)
        else:
            self.opening.discard(conn_id)

    def request(self, conn_id: int, *, in_flight: bool) -> None:
        """A request's head is in (True) or its answer is written (False)."""
        if in_flight and conn_id in self.pending:
            self.busy.add(conn_id)
        else:
            self.busy.discard(conn_id)

    def authenticated(self, conn_id: int) -> None:
        """An admitted connection carried a link's valid token: it is known from now on, out of the
        pending caps, never evicted; its address is a link's."""
        key = self.pending.pop(conn_id, None)
        if key is None:
            return
        self.busy.discard(conn_id)
        self.opening.discard(conn_id)
        self._drop(key)
        self.known.add(conn_id)
        self.link_addresses[key] = None
        self.link_addresses.move_to_end(key)
        while len(self.link_addresses) > LINK_ADDRESSES_KEPT:
            self.link_addresses.popitem(last=False)

    def release(self, conn_id: int) -> None:
        """The connection is gone, its descriptor closed; a second release of it is a no-op."""
        self.known.discard(conn_id)
        self.busy.discard(conn_id)
        self.opening.discard(conn_id)
        self.closing.discard(conn_id)
        key = self.pending.pop(conn_id, None)
        if key is not None:
            self._drop(key)

    def _drop(self, key: str) -> None:
        self.by_address[key] -= 1
        if self.by_address[key] <= 0:
            del self.by_address[key]


class Phase(enum.StrEnum):
    HEAD = "head"  # waiting for a request's head; deadline
    BODY = "body"  # the handler runs and the body is still arriving; deadline
    ANSWERING = "answering"  # the body is in; our answer takes what it takes; no deadline
    IDLE = "idle"  # between requests, nothing sent yet; deadline


@dataclass
class Timeline:
    """One connection's phase and deadline, moved by what the client sends and what we answer."""

    head_s: float
    body_s: float
    idle_s: float
    phase: Phase = Phase.HEAD
    deadline: float | None = None
    sent_while_answering: bool = False

    @classmethod
    def started(cls, limits: ListenerLimits, now: float) -> Timeline:
        return cls(
            limits.head_timeout_s,
            limits.body_timeout_s,
            limits.idle_timeout_s,
            deadline=now + limits.head_timeout_s,
        )

    def on_bytes(self, now: float) -> None:
        if self.phase is Phase.IDLE:  # the next request begins: its head is now due
            self.phase, self.deadline = Phase.HEAD, now + self.head_s
        elif self.phase is Phase.ANSWERING:
            self.sent_while_answering = True  # a pipelined request: its head is due from our answer

    def on_request(self, now: float, *, body_complete: bool) -> None:
        if body_complete:
            self.phase, self.deadline = Phase.ANSWERING, None
        else:
            self.phase, self.deadline = Phase.BODY, now + self.body_s

    def on_answered(self, now: float) -> None:
        if self.sent_while_answering:
            self.phase, self.deadline = Phase.HEAD, now + self.head_s
        else:
            self.phase, self.deadline = Phase.IDLE, now + self.idle_s
        self.sent_while_answering = False

    def expired(self, now: float, *, body_complete: bool) -> bool:
        """At (or after) the deadline: True when the connection must be closed."""
        if self.deadline is None or now < self.deadline:
            return False
        if self.phase is Phase.BODY and body_complete:
            self.phase, self.deadline = Phase.ANSWERING, None
            return False
        return True


LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(header: str) -> str:
    """The name or address in a `Host` header, without port, brackets or a final dot, lowercased."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") > 1:  # a bare IPv6 address (not valid in Host, but unambiguous)
        return value
    return value.rsplit(":", 1)[0].rstrip(".") if ":" in value else value.rstrip(".")


def _is_loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    """Which `Host` headers a listener answers.

    Bound to loopback, only a browser can send a foreign name there (a page whose DNS name was
    rebound to 127.0.0.1): only `localhost`, loopback addresses and the advertised names are
    answered. Bound off loopback, peers dial the advertised names and whatever address reaches the
    box (its IPs, a Tailscale name), so every name is accepted: there the TLS pin is what protects,
    and a browser cannot finish a TLS handshake with the box's self-signed certificate anyway.
    A request without `Host` is not from a browser (they always send it) and is accepted.
    """

    any_host: bool
    names: frozenset[str] = frozenset()

    @classmethod
    def for_bind(cls, bind_host: str, advertise: tuple[str, ...] | list[str] = ()) -> HostPolicy:
        host = bind_host.strip("[]").lower()
        loopback = host in LOOPBACK_NAMES or _is_loopback_ip(host)
        names = frozenset(host_name(urlsplit(url).netloc) for url in advertise if urlsplit(url).netloc)
        return cls(any_host=not loopback, names=names)

    def allows(self, header: str | None) -> bool:
        if self.any_host or header is None:
            return True
        name = host_name(header)
        return name in LOOPBACK_NAMES or name in self.names or _is_loopback_ip(name)


LOOPBACK_ONLY = HostPolicy(any_host=False)  # for an app served without a policy: fail closed


@dataclass
class Pacer:
    """Lets one event through per `every_s`; counts the ones held back until the next goes out."""

    every_s: float = LOG_EVERY_S
    last: float | None = None
    held: int = 0

    def tick(self, now: float) -> int | None:
        """None: stay quiet. Else log now, mentioning the returned count of events left out."""
        if self.last is not None and now - self.last < self.every_s:
            self.held += 1
            return None
        self.last, held, self.held = now, self.held, 0
        return held


@dataclass
class CrowdLog:
    """The gate's evictions and refusals, reported together at most once per `pacer.every_s`: each
    line says how many of each happened since the previous line (this one included)."""

    pacer: Pacer = field(default_factory=Pacer)
    evicted: int = 0
    refused: int = 0
    refused_by: Refusal | None = None  # the cap of the latest refusal counted

    def note(self, now: float, refusal: Refusal | None = None) -> dict[str, object] | None:
        """One eviction (`refusal` None) or refusal; the fields of a line to log now, or None."""
        if refusal is None:
            self.evicted += 1
        else:
            self.refused, self.refused_by = self.refused + 1, refusal
        if self.pacer.tick(now) is None:
            return None
        line: dict[str, object] = {"evicted": self.evicted, "refused": self.refused}
        if self.refused_by is not None:
            line["refused_by"] = str(self.refused_by)
        self.evicted = self.refused = 0
        self.refused_by = None
        return line
