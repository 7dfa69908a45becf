"""Requests sent raw to a real box (its local socket, or its network listener as a link: what a
client library would refuse to send), the store's row counts around them, and what a typed 400
answer must be."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp

from peerd.core import pairing_code
from peerd.peer.identity import pinned_fingerprint
from tests.helpers import Pair

Answer = tuple[int, Any]


async def local_raw(pair: Pair, method: str, path: str, data: bytes | None = None) -> Answer:
    """A request on the box's local socket, body sent as given."""
    connector = aiohttp.UnixConnector(path=str(pair.box.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(
            method, f"http://peerd{path}", data=data, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def network_raw(
    pair: Pair,
    method: str,
    path: str,
    data: bytes | dict[str, str] | None = None,
    *,
    token: bool = True,
) -> Answer:
    """A request on the box's TLS listener (pinned), with the laptop's link token unless `token=False`."""
    assert pair.laptop.peers is not None and pair.box.identity is not None
    headers = {"Content-Type": "application/json"} if isinstance(data, bytes) else {}
    if token:
        _row, access = await pair.laptop.peers.access_token(pair.box_id)
        headers["Authorization"] = f"Bearer {access}"
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            pair.box_url + path,
            data=data,
            headers=headers,
            ssl=pinned_fingerprint(pair.box.identity.fingerprint),
        ) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def row_counts(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}  # noqa: S608


def snapshot(pair: Pair) -> tuple[dict[str, int], dict[str, int]]:
    return row_counts(pair.laptop.paths.db), row_counts(pair.box.paths.db)


def assert_invalid(answer: Answer) -> str:
    status, body = answer
    assert status == 400, body
    assert isinstance(body, dict) and body.get("code") == "invalid_request", body
    message: str = body["message"]
    return message


def code_parts(code: str) -> tuple[str, str]:
    decoded = pairing_code.decode(code)
    return decoded.code_id, decoded.secret
