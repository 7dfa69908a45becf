"""The CLI's client for the local daemon: HTTP over the Unix socket, typed errors back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import yarl

from peerd.errors import PeerdError, from_wire


class DaemonNotRunning(Exception):
    def __init__(self, socket_path: Path) -> None:
        super().__init__(
            f"peerd is not running (no daemon answers at {socket_path}). Start it with `peerd serve`."
        )


class LocalClient:
    def __init__(self, socket_path: Path, *, environment_id: str | None = None) -> None:
        self.socket_path = socket_path
        # `--env`: every call names this linked environment, so it runs there through the link.
        self.environment_id = environment_id
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LocalClient:
        connector = aiohttp.UnixConnector(path=str(self.socket_path))
        # Long-polls last up to 50 s on the wire; allow for that plus slack.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=70)
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
        if self.environment_id is not None:
            if method == "GET":
                params = {"environmentId": self.environment_id, **(params or {})}
            else:
                body = {"environmentId": self.environment_id, **(body or {})}
        query = {k: _q(v) for k, v in (params or {}).items() if v is not None}
        try:
            # `path` is already encoded (ids as `path_segment`s): taken as is, never re-quoted.
            url = yarl.URL(f"http://peerd{path}", encoded=True).with_query(query)
            async with self._session.request(method, url, json=body) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    raise PeerdError(
                        f"The daemon sent a response that is not JSON (HTTP {resp.status})."
                    ) from None
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError):
            raise DaemonNotRunning(self.socket_path) from None
        if resp.status >= 400:
            if isinstance(data, dict) and "code" in data and "message" in data:
                raise from_wire(str(data["code"]), str(data["message"]))
            raise PeerdError(f"The daemon answered HTTP {resp.status}.")
        return data


def _q(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
