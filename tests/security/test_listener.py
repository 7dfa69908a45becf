"""A hostile network against the TCP listener: floods, slow clients, foreign Host names, EMFILE.

Real daemons on loopback. "Other addresses" are 127.0.0.2 and up (all of 127/8 is loopback on
Linux); the owner, the laptop's link and the descriptor fetch come from 127.0.0.1. Caps and timeouts
are set low per test through `DaemonConfig.listener_limits`; waits are generous upper bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import resource
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from peerd.api import listener_connection
from peerd.api.listener import GUARD
from peerd.api.listener_connection import Guard
from peerd.api.listener_rules import ListenerLimits
from peerd.daemon import Daemon
from peerd.peer.identity import load_or_create_identity
from peerd.peer.webcert import load_web_certificate, server_tls
from tests.faults.harness import free_port
from tests.helpers import Pair, client_for, make_repo, running_daemon, script


def box_daemon(
    tmp_path: Path, limits: ListenerLimits, advertise: tuple[str, ...] = ()
) -> contextlib.AbstractAsyncContextManager[Daemon]:
    return running_daemon(tmp_path / "box", label="box", advertise=advertise, listener_limits=limits)


@contextlib.asynccontextmanager
async def linked(tmp_path: Path, limits: ListenerLimits) -> AsyncIterator[Pair]:
    """A laptop linked (auto) to a box with these listener limits."""
    async with (
        running_daemon(tmp_path / "laptop", label="laptop") as laptop,
        box_daemon(tmp_path, limits) as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        pair = Pair(laptop, box, lc, bc)
        await pair.link("auto")
        yield pair


async def port_of(daemon: Daemon) -> int:
    tcp = next(x for x in (await daemon.status()).listeners if x.kind == "tcp")
    return int(tcp.address.rsplit(":", 1)[1])


class Flood:
    """Raw TCP connections that send nothing; each has a task that ends when the box closes it."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.ends: list[asyncio.Task[bytes]] = []

    async def open(self, port: int, source: str, count: int) -> None:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            self.writers.append(writer)
            self.ends.append(asyncio.create_task(_until_closed(reader)))

    def closed(self) -> int:
        return sum(task.done() for task in self.ends)

    async def closed_within(self, seconds: float) -> int:
        await asyncio.wait(self.ends, timeout=seconds)
        return sum(task.done() for task in self.ends)

    def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        for task in self.ends:
            task.cancel()


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    with contextlib.suppress(ConnectionError):
        return await reader.read()
    return b""


@contextlib.asynccontextmanager
async def flood() -> AsyncIterator[Flood]:
    f = Flood()
    try:
        yield f
    finally:
        f.close()


def insecure_tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the attacker does not care who answers
    return ctx


async def descriptor(port: int, host: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Host": host} if host is not None else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}/.well-known/peerd", ssl=False, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def test_a_flood_from_one_address_is_capped_and_everyone_else_still_answers(tmp_path: Path) -> None:
    limits = ListenerLimits(total=50, per_address=10, unauthenticated=40, handshake_timeout_s=3)
    async with linked(tmp_path, limits) as pair, flood() as f:
        port = await port_of(pair.box)
        with capture_logs() as logs:
            await f.open(port, "127.0.0.2", 300)
            assert await f.closed_within(1.0) == 290, (
                "past the per-address cap, its oldest are evicted at once"
            )
        assert len(logs) <= 3, f"refusals are logged once a second: {len(logs)} lines"
        status = await asyncio.wait_for(pair.bc.call("GET", "/v1/status"), 10)
        assert status["label"] == "box"
        code, desc = await asyncio.wait_for(descriptor(port), 10)
        assert (code, desc["label"]) == (200, "box")
        projects = await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 10)
        assert projects["items"] == []
        assert await f.closed_within(10.0) == 300, "the admitted ten are closed by the handshake timeout"


async def test_past_the_total_cap_the_oldest_unknown_connection_is_evicted(tmp_path: Path) -> None:
    limits = ListenerLimits(total=20, per_address=10, unauthenticated=100, handshake_timeout_s=5)
    async with box_daemon(tmp_path, limits) as box, client_for(box.paths.home) as bc, flood() as f:
        port = await port_of(box)
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            await f.open(port, source, 10)
        assert await f.closed_within(1.0) == 10, "each past the total evicted the oldest unknown one"
        fresh = Flood()
        try:
            await fresh.open(port, "127.0.0.9", 1)
            assert await f.closed_within(2.0) == 11, "a fresh address makes room too: the oldest goes"
            assert await fresh.closed_within(0.5) == 0
        finally:
            fresh.close()
        assert (await asyncio.wait_for(bc.call("GET", "/v1/status"), 10))["label"] == "box"


async def test_unauthenticated_connections_are_capped_but_an_authenticated_link_is_not(
    tmp_path: Path,
) -> None:
    limits = ListenerLimits(total=100, per_address=10, unauthenticated=20, handshake_timeout_s=5)
    async with linked(tmp_path, limits) as pair, flood() as f:
        await pair.remote("GET", "/v1/projects")  # the laptop's kept-alive connection is now known
        port = await port_of(pair.box)
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            await f.open(port, source, 10)
        assert await f.closed_within(1.0) == 10, "20 unknown connections at most"
        projects = await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 10)
        assert projects["items"] == []


async def guard_of(daemon: Daemon) -> Guard:
    """The daemon's network listener's connections (its gate: `(await guard_of(box)).gate`)."""
    port = await port_of(daemon)
    return next(
        runner.app[GUARD]
        for runner in daemon._runners
        if GUARD in runner.app and any(address[1] == port for address in runner.addresses)
    )


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait (a generous upper bound) until `check()` holds: a test's setup, not what it measures."""
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not within {timeout} s: {what}")


async def drop_kept_connections(pair: Pair) -> None:
    """The laptop's next call opens a new connection."""
    assert pair.laptop.peers is not None
    await pair.laptop.peers.close()
    await pair.laptop.peers.start()


async def new_connection_call(pair: Pair) -> Any:
    """A link call on a new connection."""
    await drop_kept_connections(pair)
    return await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 30)


async def test_a_links_new_connection_gets_in_when_unknown_ones_fill_the_budget(tmp_path: Path) -> None:
    """Issue 27 case 1: idle unknown connections from several addresses filled the budget, and every
    new connection of the linked laptop was reset. Now each evicts one of theirs."""
    limits = ListenerLimits(total=100, per_address=8, unauthenticated=16, handshake_timeout_s=30)
    async with linked(tmp_path, limits) as pair, flood() as f:
        gate = (await guard_of(pair.box)).gate
        port = await port_of(pair.box)
        for n in range(3):
            await drop_kept_connections(pair)
            await until(lambda: "127.0.0.1" not in gate.by_address, "the laptop's kept connections are gone")
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
                await f.open(port, source, 5)
            await until(lambda: gate.unauthenticated == 16, "the flood fills the budget")
            before = f.closed()
            assert (await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 30))["items"] == []
            await until(
                lambda b=before: f.closed() > b, f"call {n}: one of the flood's connections made room"
            )


class SlowRoute:
    """A TCP proxy in front of the box that holds every chunk `delay_s` each way (a long route, so a
    TLS handshake takes a few round trips of it); its connections reach the box from `source()`."""

    def __init__(self, box_port: int, delay_s: float, source: Callable[[], str]) -> None:
        self.box_port, self.delay_s, self.source = box_port, delay_s, source
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def __aenter__(self) -> SlowRoute:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.box_port, local_addr=(self.source(), 0)
            )
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


CHURN = r"""
import asyncio, sys
port, first, addresses, rate = (int(x) for x in sys.argv[1:5])


async def one(source, slots):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        try:
            await reader.read()  # sends nothing; until the box closes it
        finally:
            writer.transport.abort()
    except OSError:
        pass
    finally:
        slots.release()


async def main():
    slots = asyncio.Semaphore(4 * addresses)
    print("ready", flush=True)
    for n in range(10**9):
        await slots.acquire()
        asyncio.ensure_future(one(f"127.0.{first + n % addresses // 250}.{1 + n % addresses % 250}", slots))
        await asyncio.sleep(1 / rate)


asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def churn(port: int, first: int, addresses: int, rate: int = 400) -> AsyncIterator[None]:
    """Another process connects (plain TCP, nothing sent) about `rate` times a second, round robin
    from `addresses` addresses 127.0.FIRST.1 and up, and reconnects as the box closes them."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHURN,
        *(str(x) for x in (port, first, addresses, rate)),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"ready\n"
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def linked_over_a_slow_route(
    tmp_path: Path, limits: ListenerLimits, source: Callable[[], str]
) -> AsyncIterator[Pair]:
    box_port = free_port()
    async with (
        SlowRoute(box_port, 0.1, source) as route,
        running_daemon(tmp_path / "laptop", label="laptop") as laptop,
        running_daemon(
            tmp_path / "box",
            label="box",
            listen=f"127.0.0.1:{box_port}",
            advertise=(route.url,),
            listener_limits=limits,
        ) as box,
        client_for(laptop.paths.home) as lc,
        client_for(box.paths.home) as bc,
    ):
        pair = Pair(laptop, box, lc, bc)
        await pair.link("auto")
        yield pair


def fresh_addresses() -> Callable[[], str]:
    numbers: Iterator[int] = itertools.count(1)
    return lambda: f"127.0.1.{next(numbers)}"


CALLS_IN_A_FLOOD = 5
FLOOD_LIMITS = ListenerLimits(total=200, per_address=8, unauthenticated=16)


async def test_a_flood_reconnecting_faster_than_a_handshake_does_not_push_out_a_laptops_new_connection(
    tmp_path: Path,
) -> None:
    """The laptop's connections take 0.3 s from the box's accept to their first request's head (a
    slow route); the flood from four addresses replaces the whole budget many times meanwhile. Each
    call comes from an address the box has not seen a link at: only the flood's weight (its
    addresses hold more) keeps the laptop's connection in."""
    async with linked_over_a_slow_route(tmp_path, FLOOD_LIMITS, fresh_addresses()) as pair:
        port = await port_of(pair.box)
        async with churn(port, first=3, addresses=4):
            for _ in range(CALLS_IN_A_FLOOD):
                assert (await new_connection_call(pair))["items"] == []


async def test_a_flood_from_as_many_addresses_as_the_budget_does_not_push_out_a_laptops_new_connection(
    tmp_path: Path,
) -> None:
    """As above, but the flood comes from 64 addresses (at most one of its connections each in the
    budget of 16, as light as the laptop's): the laptop's address is where its link authenticated
    from, so its new connection goes last."""
    async with linked_over_a_slow_route(tmp_path, FLOOD_LIMITS, lambda: "127.0.1.1") as pair:
        assert (await new_connection_call(pair))["items"] == []  # the box knows the address now
        async with churn(await port_of(pair.box), first=3, addresses=64):
            for _ in range(CALLS_IN_A_FLOOD):
                assert (await new_connection_call(pair))["items"] == []


async def test_unknown_connections_holding_slow_requests_cannot_keep_a_link_out(tmp_path: Path) -> None:
    """A request in flight protects its connection only after the idle ones: sixteen token requests
    whose bodies never come fill the budget, and the laptop's new connection still gets in."""
    limits = ListenerLimits(total=100, per_address=8, unauthenticated=16, body_timeout_s=60)
    async with linked(tmp_path, limits) as pair:
        gate = (await guard_of(pair.box)).gate
        port = await port_of(pair.box)
        await drop_kept_connections(pair)
        await until(lambda: not gate.pending, "the laptop's kept connections are gone")
        writers = []
        try:
            for n in range(16):
                source = f"127.0.0.{2 + n % 4}"
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=insecure_tls(), server_hostname="box", local_addr=(source, 0)
                )
                writer.write(
                    b"POST /oauth/token HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\n"
                )
                writers.append(writer)
            await until(lambda: len(gate.busy) == 16, "sixteen requests in flight fill the budget")
            assert (await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 30))["items"] == []
            assert len(gate.busy) == 15, "one of them made room"
        finally:
            for writer in writers:
                writer.transport.abort()


async def test_a_links_connection_is_known_as_soon_as_its_token_is_checked(tmp_path: Path) -> None:
    """A long-poll on a new connection is a link's while it waits, not an unknown connection that
    holds a slot of the budget (and could be evicted) until it is answered."""
    async with linked(tmp_path, ListenerLimits()) as pair:
        gate = (await guard_of(pair.box)).gate
        project = await pair.bc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        body = {"projectId": project["id"], "prompt": script({"wait": 3}, {"reply": "slow"})}
        launched = await pair.bc.call("POST", "/v1/threads", body=body)
        await drop_kept_connections(pair)
        await until(lambda: not gate.known, "the laptop's earlier connections are gone")
        path = f"/v1/threads/{launched['threadId']}/wait"
        waiting = asyncio.create_task(pair.remote("GET", path, params={"timeout": 20}))
        try:
            await until(lambda: bool(gate.known) or waiting.done(), "the long-poll is known or answered")
            assert not waiting.done(), "known only once answered"
        finally:
            done = await asyncio.wait_for(waiting, 30)
        assert (done["terminal"], done["status"]) == (True, "completed")


async def test_a_link_call_20_s_after_the_last_reuses_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The laptop keeps an idle connection 25 s (aiohttp's default is 15 s), under the box's 30 s
    idle timeout: its next call reuses a connection the box knows as the link's, which no flood can
    evict. (The laptop's pool is told 20 s have passed; the box's idle timeout is not reached.)"""
    async with linked(tmp_path, ListenerLimits()) as pair:
        gate = (await guard_of(pair.box)).gate
        await drop_kept_connections(pair)
        await until(lambda: not gate.pending and not gate.known, "the laptop's connections are gone")
        await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 30)
        (first,) = gate.known
        real = aiohttp.connector.monotonic
        monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: real() + 20)
        await asyncio.wait_for(pair.remote("GET", "/v1/projects"), 30)
        assert (set(gate.known), set(gate.pending)) == ({first}, set()), "the same connection"


@pytest.mark.parametrize("first", ["set up", "being set up", "peeking at its hello"])
async def test_the_descriptors_stay_under_the_total_cap_while_a_burst_evicts(
    first: str, tmp_path: Path
) -> None:
    """The total cap counts descriptors. The listener accepts up to 64 connections in a row without
    a turn of the event loop; an evicted connection's descriptor is closed at once, or, while its
    transport is being made (a turn of the loop), counted until it is. Else a fast flood holds up
    to 64 descriptors past the cap (EMFILE at a low open-file limit). One still peeking at its
    ClientHello (two certificates, `core/tls_hello.py`) is closed at once too."""
    loop = asyncio.get_running_loop()
    tls = None
    if first == "peeking at its hello":
        identity = load_or_create_identity(tmp_path)
        tls = server_tls(identity, load_web_certificate(tmp_path, identity.env_id))
    guard = Guard(ListenerLimits(total=12, per_address=100, unauthenticated=8), 1024, tls, loop)

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response()

    guard.server = web.Server(answer)
    ours: list[socket.socket] = []
    theirs: list[socket.socket] = []

    def accept(source: str) -> None:
        server_side, client_side = socket.socketpair()
        server_side.setblocking(False)
        ours.append(server_side)
        theirs.append(client_side)
        guard.accepted(server_side, (source, 1))

    def open_descriptors() -> int:
        return sum(sock.fileno() != -1 for sock in ours)

    try:
        for _ in range(8):
            accept("10.0.0.1")
        if first == "set up":
            await until(lambda: all(conn._raw is not None for conn in guard.connections.values()), "set up")
        elif first == "peeking at its hello":
            await until(lambda: all(conn._peeking for conn in guard.connections.values()), "peeking")
            assert not guard.gate.opening, "a peeking connection can be closed at once"
        else:
            await asyncio.sleep(0)  # their start() ran: transports made, connection_made not yet
            assert guard.gate.opening == set(guard.gate.pending)
        for n in range(40):  # one burst: no turn of the loop between these accepts
            accept(f"10.0.1.{n}")
            assert open_descriptors() <= 12, f"accept {n}: {open_descriptors()} descriptors"
        assert guard.gate.total <= 12
        await until(lambda: not guard.gate.closing, "the evicted ones being set up are closed")
        assert open_descriptors() == guard.gate.total == 8
    finally:
        guard.close_all()
        for sock in theirs:
            sock.close()
        await asyncio.sleep(0.05)
        await guard.server.shutdown()


async def _tls_connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=insecure_tls(), server_hostname="box")


async def _dribble(port: int, head: bytes, body: bytes = b"", every_s: float = 1.0) -> int:
    """Send `head` at once (if `body`) or byte by byte, then `body` byte by byte; returns how many
    dribbled bytes went out before the box closed the connection (-1: it never did)."""
    reader, writer = await _tls_connect(port)
    ended = asyncio.create_task(_until_closed(reader))
    slow = body or head
    if body:
        writer.write(head)
    try:
        for sent in range(min(len(slow), 8)):  # 8 s at most
            if ended.done():
                return sent
            writer.write(slow[sent : sent + 1])
            await asyncio.wait({ended}, timeout=every_s)
        return -1
    finally:
        ended.cancel()
        writer.transport.abort()


@contextlib.asynccontextmanager
async def trickling(port: int, piece: int, pause_s: float) -> AsyncIterator[int]:
    """A TCP forwarder to `port` that passes what the client sends in `piece`-byte writes,
    `pause_s` apart (TCP_NODELAY: each is its own segment); yields its own port."""

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                step = piece if slow else len(data)
                for at in range(0, len(data), step):
                    writer.write(data[at : at + step])
                    await writer.drain()
                    if slow:
                        await asyncio.sleep(pause_s)
        writer.close()

    writers: list[asyncio.StreamWriter] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(up_writer)
        up_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(forward(reader, up_writer, True), forward(up_reader, writer, False))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


@pytest.fixture
def sniffs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths each call of the listener's ClientHello peek saw."""
    seen: list[int] = []
    real = listener_connection.sniff

    def counted(prefix: bytes) -> Any:
        seen.append(len(prefix))
        return real(prefix)

    monkeypatch.setattr(listener_connection, "sniff", counted)
    return seen


async def test_a_hello_arriving_in_pieces_is_peeked_at_whole_and_never_spun_on(
    tmp_path: Path, sniffs: list[int]
) -> None:
    """The listener waits for the ClientHello's whole first record with the socket's low-water mark
    set to it: a hello in 40 pieces wakes the peek twice, not 40 times (no busy loop on bytes that
    stay in the socket), and the handshake that follows reads them all."""
    async with box_daemon(tmp_path, ListenerLimits(handshake_timeout_s=10)) as box:
        async with trickling(await port_of(box), piece=16, pause_s=0.01) as port:
            code, desc = await asyncio.wait_for(descriptor(port), 20)
        assert (code, desc["label"]) == (200, "box")
    assert len(sniffs) <= 3, sniffs
    assert sniffs[-1] > 200, "the last peek saw the whole hello"


async def test_a_hello_that_stops_half_way_is_closed_at_the_handshake_timeout(
    tmp_path: Path, sniffs: list[int]
) -> None:
    async with box_daemon(tmp_path, ListenerLimits(handshake_timeout_s=2)) as box:
        reader, writer = await asyncio.open_connection("127.0.0.1", await port_of(box))
        try:
            writer.write(b"\x16\x03\x01\x02\x00" + b"\x01" * 20)  # a record of 512 bytes, 20 sent
            ended = await asyncio.wait_for(_until_closed(reader), 10)
            assert ended == b""
        finally:
            writer.transport.abort()
    assert len(sniffs) <= 2, sniffs


async def test_slowloris_head_one_byte_a_second_is_closed(tmp_path: Path) -> None:
    async with box_daemon(tmp_path, ListenerLimits(head_timeout_s=2)) as box:
        sent = await _dribble(await port_of(box), b"GET /.well-known/peerd HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert 0 < sent <= 4, f"closed after {sent} bytes"


async def test_a_body_sent_one_byte_a_second_is_closed(tmp_path: Path) -> None:
    head = (
        b"POST /oauth/token HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 64\r\n\r\n"
    )
    async with box_daemon(tmp_path, ListenerLimits(body_timeout_s=2)) as box:
        sent = await _dribble(await port_of(box), head, body=b"grant_type=x&" * 5)
        assert 0 < sent <= 4, f"closed after {sent} body bytes"


async def test_an_idle_kept_alive_connection_is_closed(tmp_path: Path) -> None:
    async with box_daemon(tmp_path, ListenerLimits(idle_timeout_s=2, head_timeout_s=10)) as box:
        reader, writer = await _tls_connect(await port_of(box))
        try:
            writer.write(b"GET /.well-known/peerd HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(
                next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
            )
            await reader.readexactly(length)
            # kept alive, then closed after the idle time (well before aiohttp's own 12 s backstop)
            assert await asyncio.wait_for(_until_closed(reader), 8) == b""
        finally:
            writer.transport.abort()


async def test_a_long_poll_outlives_every_client_timeout(tmp_path: Path) -> None:
    limits = ListenerLimits(head_timeout_s=1, body_timeout_s=1, idle_timeout_s=1)
    async with linked(tmp_path, limits) as pair:
        project = await pair.bc.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        body = {"projectId": project["id"], "prompt": script({"wait": 3}, {"reply": "slow"})}
        launched = await pair.bc.call("POST", "/v1/threads", body=body)
        done = await pair.remote("GET", f"/v1/threads/{launched['threadId']}/wait", params={"timeout": 20})
        assert (done["terminal"], done["status"]) == (True, "completed")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:7433", "10.0.0.1", "localhost.evil.example"])
async def test_a_foreign_host_on_a_loopback_listener_is_refused(tmp_path: Path, host: str) -> None:
    async with box_daemon(tmp_path, ListenerLimits(), advertise=("https://box.example.test:7433",)) as box:
        code, body = await descriptor(await port_of(box), host)
        assert (code, body["code"]) == (403, "capability_denied")
        for ok in ("localhost:7433", "127.0.0.1", "[::1]:7433", "box.example.test:7433"):
            assert (await descriptor(await port_of(box), ok))[0] == 200, ok


# --- descriptors: a subprocess daemon with a 200-descriptor limit -----------------------------

NOFILE = 200
DAEMON = """
import asyncio, logging, resource, sys
from pathlib import Path
from peerd.api.listener_rules import ListenerLimits
from peerd.daemon import DaemonConfig, serve
from peerd.logs import configure_logging
resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n}))
configure_logging(json=True, level=logging.INFO)
big = 10**6
uncapped = ListenerLimits(total=big, per_address=big, unauthenticated=big)
limits = ListenerLimits() if sys.argv[2] == "default" else uncapped
asyncio.run(serve(DaemonConfig(home=Path(sys.argv[1]), label="fd", listen="127.0.0.1:0", listener_limits=limits)))
"""


@contextlib.asynccontextmanager
async def fd_limited_daemon(tmp_path: Path, caps: str) -> AsyncIterator[tuple[int, Path]]:
    home, log = tmp_path / "fd", tmp_path / "fd.log"
    home.mkdir()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", DAEMON.format(n=NOFILE), str(home), caps],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "NOTIFY_SOCKET": ""},
        )
    try:
        yield await _tcp_port(home, proc, log), log
    finally:
        proc.kill()
        proc.wait()


async def _tcp_port(home: Path, proc: subprocess.Popen[bytes], log: Path) -> int:
    for _ in range(400):  # up to 20 s to start
        with contextlib.suppress(Exception):
            async with client_for(home) as client:
                status = await client.call("GET", "/v1/status")
            tcp = next(x["address"] for x in status["listeners"] if x["kind"] == "tcp")
            return int(tcp.rsplit(":", 1)[1])
        assert proc.poll() is None, log.read_text()
        await asyncio.sleep(0.05)
    pytest.fail("the daemon did not start: " + log.read_text())


async def _open_many(port: int, count: int, sources: int) -> list[asyncio.StreamWriter]:
    async def one(i: int) -> asyncio.StreamWriter | None:
        with contextlib.suppress(OSError, TimeoutError):
            connecting = asyncio.open_connection(
                "127.0.0.1", port, local_addr=(f"127.0.0.{2 + i % sources}", 0)
            )
            return (await asyncio.wait_for(connecting, 2))[1]
        return None

    return [w for w in await asyncio.gather(*(one(i) for i in range(count))) if w is not None]


def _log_lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()


def _about_accept(lines: list[str]) -> list[str]:
    return [line for line in lines if "socket.accept()" in line or "listener.accept_failed" in line]


@pytest.fixture(autouse=True)
def _enough_descriptors_here() -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1024:
        pytest.skip("the test process needs 1,024 descriptors for its floods")


async def test_at_a_low_descriptor_limit_the_default_caps_keep_the_owner_answering(tmp_path: Path) -> None:
    async with fd_limited_daemon(tmp_path, "default") as (port, log):
        before = len(_log_lines(log))
        writers = await _open_many(port, 400, sources=16)
        try:
            async with client_for(tmp_path / "fd") as client:
                status = await asyncio.wait_for(client.call("GET", "/v1/status"), 10)
            assert status["label"] == "fd"
        finally:
            for writer in writers:
                writer.transport.abort()
        lines = _log_lines(log)[before:]
        assert not _about_accept(lines), "never out of descriptors"
        assert len(lines) < 20, lines


async def test_accept_errors_are_logged_at_most_once_a_second(tmp_path: Path) -> None:
    async with fd_limited_daemon(tmp_path, "uncapped") as (port, log):
        before = len(_log_lines(log))
        writers = await _open_many(port, 400, sources=16)
        try:
            await asyncio.sleep(3)  # the box is out of descriptors meanwhile
        finally:
            for writer in writers:
                writer.transport.abort()
        async with client_for(tmp_path / "fd") as client:  # and recovers once they are gone
            assert (await asyncio.wait_for(client.call("GET", "/v1/status"), 15))["label"] == "fd"
        lines = _log_lines(log)[before:]
        accept = _about_accept(lines)
        assert accept and all("listener.accept_failed" in line for line in accept), accept[:3]
        assert len(accept) <= 8, f"once a second: {len(accept)} lines"
        assert len(lines) < 30, f"{len(lines)} lines, e.g. {lines[:3]}"
