"""The listener's rules as plain values: caps, deadlines, Host names, log pacing, accept errors."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
from typing import Any

import pytest
from structlog.testing import capture_logs

from peerd.api.listener import AcceptErrorFilter, http_logger, raise_nofile_limit
from peerd.api.listener_rules import (
    IDLE_TIMEOUT_S,
    LINK_ADDRESSES_KEPT,
    MAX_PER_ADDRESS,
    Admitted,
    ConnectionGate,
    CrowdLog,
    HostPolicy,
    ListenerLimits,
    Pacer,
    Phase,
    Refusal,
    Timeline,
    address_key,
    host_name,
)
from peerd.peer.client import CONNECTIONS_PER_BOX, POOL_KEEPALIVE_S


class Admitter:
    """Numbers the connections it admits, as the listener does."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate, self.next = gate, 0

    def __call__(self, key: str) -> tuple[int, Admitted | Refusal]:
        self.next += 1
        return self.next, self.gate.admit(self.next, key)


def test_a_full_address_evicts_its_own_oldest_idle_connection() -> None:
    gate = ConnectionGate(total_cap=50, per_address_cap=2, unauthenticated_cap=100)
    admit = Admitter(gate)
    assert [admit("a") for _ in range(2)] == [(1, Admitted()), (2, Admitted())]
    assert admit("b") == (3, Admitted())
    assert admit("a") == (4, Admitted(evicted=1)), "the oldest of that address, not of b"
    assert admit("a") == (5, Admitted(evicted=2))
    assert list(gate.pending) == [3, 4, 5] and gate.by_address == {"a": 2, "b": 1}
    gate.release(1)  # the evicted one's own close comes later: nothing counted twice
    assert gate.total == 3


def test_a_full_budget_evicts_the_oldest_when_every_address_holds_as_many() -> None:
    gate = ConnectionGate(total_cap=50, per_address_cap=10, unauthenticated_cap=3)
    admit = Admitter(gate)
    for key in ("a", "b", "c"):
        admit(key)
    assert admit("laptop") == (4, Admitted(evicted=1))
    assert admit("d") == (5, Admitted(evicted=2))
    assert (gate.unauthenticated, gate.total) == (3, 3)


def test_a_flood_evicts_its_own_and_not_a_lighter_addresses_connection() -> None:
    """Issue 27 case 1: a flood that reconnects faster than a laptop's TLS handshake takes would push
    the laptop's new connection out if the oldest went first; the heaviest address goes first."""
    gate = ConnectionGate(total_cap=500, per_address_cap=32, unauthenticated_cap=16)
    admit = Admitter(gate)
    for _ in range(3):
        admit("a")
    laptop, _ = admit("laptop")  # a new connection, in its TLS handshake: idle, not yet known
    evicted = []
    for n in range(200):  # the flood reconnects from four addresses
        _, admission = admit("abcd"[n % 4])
        assert isinstance(admission, Admitted)
        evicted.append(admission.evicted)
    assert laptop in gate.pending and laptop not in evicted
    assert gate.by_address["laptop"] == 1 and sum(gate.by_address.values()) == 16


def test_among_the_heaviest_addresses_the_oldest_goes_first() -> None:
    gate = ConnectionGate(total_cap=50, per_address_cap=10, unauthenticated_cap=5)
    admit = Admitter(gate)
    for key in ("a", "b", "b", "a", "c"):
        admit(key)
    assert admit("d") == (6, Admitted(evicted=1)), "a and b hold two each: a's is the oldest"
    assert admit("d") == (7, Admitted(evicted=2)), "now b holds the most"


def test_a_connection_from_an_address_a_link_authenticated_from_is_evicted_last() -> None:
    """A flood spread over as many addresses as the budget has slots ties with, or is lighter than,
    a laptop's new connections; the laptop's address is known from its link's earlier connection."""
    gate = ConnectionGate(total_cap=500, per_address_cap=32, unauthenticated_cap=8)
    admit = Admitter(gate)
    earlier, _ = admit("laptop")
    gate.authenticated(earlier)
    gate.release(earlier)  # that connection is gone; its address is remembered
    laptop = [admit("laptop")[0] for _ in range(2)]  # the heaviest address now, and idle
    for n in range(100):  # every flood connection from its own address
        admit(f"10.0.{n}.1")
    assert [conn_id in gate.pending for conn_id in laptop] == [True, True]
    assert gate.by_address["laptop"] == 2 and gate.unauthenticated == 8


def test_the_link_addresses_remembered_are_bounded_most_recent_kept() -> None:
    gate = ConnectionGate(total_cap=10_000, per_address_cap=32, unauthenticated_cap=10_000)
    admit = Admitter(gate)
    for n in range(LINK_ADDRESSES_KEPT + 10):
        conn_id, _ = admit(f"10.0.{n // 250}.{n % 250}")
        gate.authenticated(conn_id)
        gate.release(conn_id)
    assert len(gate.link_addresses) == LINK_ADDRESSES_KEPT
    assert "10.0.0.0" not in gate.link_addresses and "10.0.1.15" in gate.link_addresses


def test_a_connection_with_a_request_in_flight_goes_after_idle_ones_and_a_busy_flood_refuses_nobody() -> None:
    gate = ConnectionGate(total_cap=50, per_address_cap=10, unauthenticated_cap=4)
    admit = Admitter(gate)
    admit("laptop")
    for _ in range(3):
        admit("x")
    gate.request(1, in_flight=True)  # the laptop's first request on it is being answered
    gate.request(2, in_flight=True)  # x sends a body one byte a second
    assert admit("y") == (5, Admitted(evicted=3)), "x's idle one, although x's busy one is older"
    gate.request(4, in_flight=True)
    gate.request(5, in_flight=True)
    assert admit("z") == (6, Admitted(evicted=2)), "all busy: the heaviest's oldest, never a refusal"
    assert list(gate.pending) == [1, 4, 5, 6] and gate.busy == {1, 4, 5}


def test_at_its_per_address_cap_an_address_only_pushes_out_its_own_idle_connections() -> None:
    gate = ConnectionGate(total_cap=50, per_address_cap=2, unauthenticated_cap=100)
    admit = Admitter(gate)
    admit("a")
    admit("a")
    gate.request(1, in_flight=True)
    gate.request(2, in_flight=True)
    assert admit("a") == (3, Refusal.PER_ADDRESS)
    gate.request(2, in_flight=False)
    assert admit("a") == (4, Admitted(evicted=2))


def test_an_evicted_connection_whose_transport_is_being_made_counts_until_its_descriptor_is_closed() -> None:
    """An evicted connection's descriptor is closed at once, except one whose transport is being
    made: that one counts against the total until it is closed, and at the total cap only one that
    can be closed at once makes room (else a fast flood holds more descriptors than the cap)."""
    gate = ConnectionGate(total_cap=4, per_address_cap=10, unauthenticated_cap=3)
    admit = Admitter(gate)
    for key in ("a", "a", "b"):
        conn_id, _ = admit(key)
        gate.transport(conn_id, ready=False)
    assert admit("c") == (4, Admitted(evicted=1)), "the budget is full, the total is not"
    assert (gate.closing, gate.unauthenticated, gate.total) == ({1}, 3, 4)
    gate.transport(4, ready=False)
    assert admit("d") == (5, Refusal.TOTAL), "at the total cap, and nothing can be closed at once"
    gate.transport(4, ready=True)
    assert admit("d") == (6, Admitted(evicted=4)), "c's can be closed at once: it goes"
    assert gate.closing == {1} and gate.total == 4
    gate.release(1)  # its transport was made, aborted, and its descriptor closed
    assert (gate.closing, gate.total) == (set(), 3)
    gate.transport(2, ready=True)
    gate.authenticated(3)
    assert gate.opening == set()


def test_an_authenticated_connection_is_never_evicted_nor_counted_as_unknown() -> None:
    gate = ConnectionGate(total_cap=10, per_address_cap=2, unauthenticated_cap=2)
    admit = Admitter(gate)
    admit("a")
    admit("a")
    gate.authenticated(1)  # a laptop's long-poll, say
    assert gate.by_address == {"a": 1} and gate.unauthenticated == 1 and gate.total == 2
    for _ in range(20):  # a flood from the laptop's own address and others
        for key in ("a", "b", "c"):
            assert isinstance(admit(key)[1], Admitted)
    assert 1 in gate.known and 1 not in gate.pending
    assert gate.unauthenticated == 2 and gate.total == 3


def test_past_the_total_cap_only_unauthenticated_connections_make_room() -> None:
    gate = ConnectionGate(total_cap=3, per_address_cap=10, unauthenticated_cap=10)
    admit = Admitter(gate)
    for _ in range(3):
        admit("link")
    gate.authenticated(1)
    gate.authenticated(2)
    assert admit("x") == (4, Admitted(evicted=3))
    assert admit("x") == (5, Admitted(evicted=4))
    gate.authenticated(5)
    assert admit("x") == (6, Refusal.TOTAL), "links are never evicted: the descriptors are theirs"
    gate.release(5)
    assert admit("x") == (7, Admitted())
    for conn_id in (1, 2, 7, 7):
        gate.release(conn_id)
    assert (gate.total, gate.unauthenticated, dict(gate.by_address), gate.busy) == (0, 0, {}, set())


def test_the_laptop_keeps_its_pooled_connections_less_long_than_the_box_keeps_them_idle() -> None:
    """A pooled connection the laptop reuses is one the box still holds (and knows as a link's)."""
    assert POOL_KEEPALIVE_S < IDLE_TIMEOUT_S
    assert CONNECTIONS_PER_BOX < MAX_PER_ADDRESS


def test_total_cap_is_half_the_open_file_limit_unless_set() -> None:
    assert ListenerLimits().total_for(1024) == 512
    assert ListenerLimits().total_for(100) == 36  # however low the limit, 64 stay for the rest
    assert ListenerLimits().total_for(65536) == 32768
    assert ListenerLimits(total=50).total_for(1024) == 50


def test_address_key_groups_ipv6_by_64_and_unmaps_ipv4() -> None:
    assert address_key(("127.0.0.2", 4000)) == "127.0.0.2"
    assert (
        address_key(("2001:db8::1", 1, 0, 0)) == address_key(("2001:db8::ffff", 2, 0, 0)) == "2001:db8::/64"
    )
    assert address_key(("2001:db8:0:1::1", 1, 0, 0)) != address_key(("2001:db8::1", 1, 0, 0))
    assert address_key(("::ffff:10.0.0.1", 1, 0, 0)) == "10.0.0.1"
    assert address_key(None) == "None"


def test_head_deadline_does_not_move_with_each_byte() -> None:
    limits = ListenerLimits(head_timeout_s=10, body_timeout_s=30, idle_timeout_s=30)
    t = Timeline.started(limits, now=0)
    for second in range(1, 10):
        t.on_bytes(now=second)  # slowloris: a byte a second
    assert t.deadline == 10
    assert not t.expired(9.9, body_complete=False)
    assert t.expired(10, body_complete=False)


def test_body_deadline_then_no_deadline_while_answering() -> None:
    limits = ListenerLimits(head_timeout_s=10, body_timeout_s=30, idle_timeout_s=30)
    t = Timeline.started(limits, now=0)
    t.on_request(now=2, body_complete=False)
    assert (t.phase, t.deadline) == (Phase.BODY, 32)
    assert t.expired(32, body_complete=False)  # the body is still dribbling in
    t = Timeline.started(limits, now=0)
    t.on_request(now=2, body_complete=False)
    assert not t.expired(32, body_complete=True)  # the body arrived; the answer takes its time
    assert (t.phase, t.deadline) == (Phase.ANSWERING, None)
    t.on_request(now=40, body_complete=True)
    assert not t.expired(1000, body_complete=True)  # a long-poll is never cut


def test_idle_after_an_answer_then_a_head_deadline_from_the_first_byte() -> None:
    limits = ListenerLimits(head_timeout_s=10, body_timeout_s=30, idle_timeout_s=30)
    t = Timeline.started(limits, now=0)
    t.on_request(now=1, body_complete=True)
    t.on_answered(now=5)
    assert (t.phase, t.deadline) == (Phase.IDLE, 35)
    t.on_bytes(now=20)
    assert (t.phase, t.deadline) == (Phase.HEAD, 30)
    t.on_request(now=21, body_complete=True)
    t.on_bytes(now=22)  # pipelined: sent while we answered
    t.on_answered(now=25)
    assert (t.phase, t.deadline) == (Phase.HEAD, 35)


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost", "localhost"),
        ("LOCALHOST:7433", "localhost"),
        ("127.0.0.1:7433", "127.0.0.1"),
        ("[::1]:7433", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("box.example.", "box.example"),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


def test_loopback_policy_allows_loopback_and_advertised_names_only() -> None:
    policy = HostPolicy.for_bind("127.0.0.1", ("https://box.tail1234.ts.net:7433",))
    for ok in ("localhost:7433", "127.0.0.1", "127.0.0.5:1", "[::1]:7433", "box.tail1234.ts.net:7433", None):
        assert policy.allows(ok), ok
    for bad in ("evil.example", "evil.example:7433", "10.0.0.1", "localhost.evil.example", ""):
        assert not policy.allows(bad), bad
    assert not HostPolicy.for_bind("[::1]").allows("evil.example")
    assert not HostPolicy.for_bind("localhost").allows("evil.example")


def test_off_loopback_policy_allows_any_name() -> None:
    assert HostPolicy.for_bind("0.0.0.0").allows("anything.example")  # noqa: S104
    assert HostPolicy.for_bind("[::]").allows("10.1.2.3:7433")
    assert HostPolicy.for_bind("192.168.1.5").allows("box.lan")


def test_pacer_lets_one_a_second_through_and_counts_the_rest() -> None:
    pacer = Pacer(every_s=1.0)
    got = [pacer.tick(now=i / 100) for i in range(250)]  # 100 a second for 2.5 s
    assert [(i, g) for i, g in enumerate(got) if g is not None] == [(0, 0), (100, 99), (200, 99)]


def test_evictions_and_refusals_together_are_logged_once_a_second_with_their_counts() -> None:
    crowd = CrowdLog(Pacer(every_s=1.0))
    lines = []
    for i in range(250):  # 100 a second for 2.5 s, one in five a refusal
        line = crowd.note(i / 100, Refusal.TOTAL if i % 5 == 4 else None)
        if line is not None:
            lines.append((i, line))
    assert lines == [
        (0, {"evicted": 1, "refused": 0}),
        (100, {"evicted": 80, "refused": 20, "refused_by": "total"}),
        (200, {"evicted": 80, "refused": 20, "refused_by": "total"}),
    ]


def _accept_context(code: int) -> dict[str, Any]:
    return {
        "message": "socket.accept() out of system resource",
        "exception": OSError(code, "Too many open files"),
        "socket": object(),
    }


async def test_accept_errors_are_logged_once_a_second_and_others_pass_through() -> None:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    accept_filter = AcceptErrorFilter(lambda _loop, context: seen.append(context))
    with capture_logs() as logs:
        for _ in range(1000):
            accept_filter(loop, _accept_context(errno.EMFILE))
        accept_filter(loop, _accept_context(errno.ENFILE))
        other = {"message": "something else", "exception": ValueError("x")}
        accept_filter(loop, other)
        not_accept = {"message": "a pipe", "exception": OSError(errno.EMFILE, "x")}  # no "socket"
        accept_filter(loop, not_accept)
    assert [e["event"] for e in logs] == ["listener.accept_failed"]
    assert logs[0]["error"] == "EMFILE"
    assert seen == [other, not_accept]
    accept_filter.pacer.last = loop.time() - 2  # a second later, the count of those left out
    with capture_logs() as logs:
        accept_filter(loop, _accept_context(errno.EMFILE))
    assert logs[0]["left_out"] == 1000


async def test_accept_filter_is_installed_once_per_loop() -> None:
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    try:
        AcceptErrorFilter.install(loop)
        first = loop.get_exception_handler()
        AcceptErrorFilter.install(loop)
        assert isinstance(first, AcceptErrorFilter) and loop.get_exception_handler() is first
    finally:
        loop.set_exception_handler(before)


def test_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert raise_nofile_limit() == (hard if hard != resource.RLIM_INFINITY else 65536)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] in (hard, 65536)
    finally:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (max(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]), hard)
        )


def test_aiohttp_request_errors_are_paced() -> None:
    logger = http_logger()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        for _ in range(100):  # e.g. a client sending garbage on 100 connections within a second
            logger.error("Error handling request from %s", "127.0.0.2")
    finally:
        logger.removeHandler(handler)
    assert len(records) <= 1
    assert http_logger() is logger and len(logger.filters) == 1, "one filter, however often asked"
