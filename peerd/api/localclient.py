"""The local daemon's API from inside an event loop: aiohttp over the owner's Unix socket.

For code that runs in the loop a daemon may share (the tests' in-process daemons, the benches,
`peerd doctor`'s concurrent checks): a blocking call there would stall the daemon it talks to. The
command line uses the synchronous, standard-library `peerd.cli.client.LocalClient`; both shape
requests and read answers with the same functions (`peerd/clientwire.py`), and raise the same errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import yarl

from peerd.clientwire import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    decode_answer,
    query_value,
    with_environment,
)
from peerd.errors import DaemonNotRunning


class LocalClient:
    """`async with LocalClient(socket) as c: await c.call(...)`; one pooled session per block."""

    def __init__(self, socket_path: Path, *, environment_id: str | None = None) -> None:
        self.socket_path = socket_path
        # `--env`: every call names this linked environment, so it runs there through the link.
        self.environment_id = environment_id
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LocalClient:
        connector = aiohttp.UnixConnector(path=str(self.socket_path))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        if self._session is None:
            raise RuntimeError("LocalClient used outside `async with`")
        body, params = with_environment(method, body, params, self.environment_id)
        query = {k: query_value(v) for k, v in (params or {}).items() if v is not None}
        try:
            # `path` is already encoded (ids as `path_segment`s): taken as is, never re-quoted.
            url = yarl.URL(f"http://peerd{path}", encoded=True).with_query(query)
            async with self._session.request(method, url, json=body) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError):
            raise DaemonNotRunning.at(self.socket_path) from None
        return decode_answer(status, raw)
