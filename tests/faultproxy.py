"""A TCP proxy on loopback that a test switches between forwarding, refusing and black-holing.

    laptop ──> FaultProxy (127.0.0.1:port) ──> box listener

- `forward()`: bytes flow both ways (held bytes of a black hole are delivered, as TCP would).
- `refuse()`: the listening socket is closed and every open connection is reset: new
  connections are refused (ECONNREFUSED), as when the box's daemon or host is down.
- `black_hole()`: new connections are accepted and never answered; open connections stop
  carrying bytes (nothing is lost: it is held until `forward()`, or until a side gives up), as
  when a route drops every packet.

The port stays the same across modes, so a link that stored the proxy's address keeps it. Point
a box's link at the proxy with `running_daemon(..., advertise=(proxy.url,))`.

    async with FaultProxy(box_port) as proxy:
        ...
        await proxy.refuse()
        await proxy.forward()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import TracebackType
from typing import Literal

Mode = Literal["forward", "refuse", "black_hole"]
CHUNK = 65536


class FaultProxy:
    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.mode: Mode = "forward"
        self.accepted = 0  # connections accepted since the start (all modes)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The box's address through the proxy (TLS: the link pins the box's certificate)."""
        return f"https://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        await self._listen()

    async def close(self) -> None:
        await self._stop_listening()
        self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def forward(self) -> None:
        self.mode = "forward"
        self._flowing.set()
        if self._server is None:
            await self._listen()

    async def refuse(self) -> None:
        self.mode = "refuse"
        await self._stop_listening()
        self._reset_all()
        self._flowing.set()  # nothing is held: every connection is gone

    async def black_hole(self) -> None:
        self.mode = "black_hole"
        self._flowing.clear()
        if self._server is None:
            await self._listen()

    # --- internals ---------------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _reset_all(self) -> None:
        for client, upstream in list(self._links):
            for writer in (client, upstream):
                if writer is not None:
                    _reset(writer)
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        entry: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None] = (writer, None)
        self._links.add(entry)
        try:
            await self._flowing.wait()  # a black hole accepts and says nothing
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self._links.discard(entry)
            entry = (writer, up_writer)
            self._links.add(entry)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._links.discard(entry)
            for w in entry:
                if w is not None:
                    _close(w)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self._flowing.wait()  # held, not lost, while the route is a black hole
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a vanished peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.close()
