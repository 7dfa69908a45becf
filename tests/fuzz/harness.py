"""What the fuzz tests stand on: two real daemons in a thread of their own, and HTTP clients for the
box's two listeners that schemathesis's (synchronous, `requests`-based) calls can use.

- `Fleet`: a laptop and a box (`tests.helpers.two_daemons`: real sockets, real TLS, real SQLite)
  running in their own event loop in a background thread, linked with `auto` access, with a seeded
  project and a finished scripted thread on the box, so some generated requests reach real rows.
- `unix_session`: a `requests.Session` whose every request goes over a Unix socket (the owner
  socket is never put on TCP for the tests).
- `pinned_session`: a `requests.Session` for the box's TLS listener that checks the box's pinned
  certificate fingerprint (its self-signed certificate has no name to verify).
- `Rows`: every table's row count and a digest of its rows, read straight from the box's SQLite
  file, for "a rejected request changes nothing".
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import sqlite3
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection

from tests.helpers import Pair, make_repo, script, two_daemons, wait_terminal
from tests.support.eventually import eventually

T = TypeVar("T")
START_TIMEOUT_S = 60.0
LIVE = ("queued", "starting", "running")
# Columns a request may change by design even when it is refused: a link's last contact (every
# authenticated request, refused or not, says the link is alive).
VOLATILE = {"clients": ("last_seen_at", "last_address")}
TOKEN_FILE = ".run-token"
# A scripted run that hands the test its run token and stays live until the daemons stop.
HOLD_RUN = ({"run": f'printf %s "$PEERD_RUN_TOKEN" > {TOKEN_FILE}'}, {"wait_for_file": ".never"})


@dataclass(frozen=True)
class Seeds:
    """Real ids on the box that generated requests may name."""

    project_id: str
    thread_id: str
    run_id: str
    agent_thread_id: str  # its run is kept live: the agent socket's requests carry its token
    run_token: str


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pair: Pair | None = None
        self.seeds: Seeds | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-daemons", daemon=True)

    def __enter__(self) -> Fleet:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the fuzz daemons did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__ (or lost at exit: the test saw its answers)
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        async with two_daemons(self.tmp) as pair:
            await pair.link("auto")
            repo = make_repo(self.tmp / "repo")
            project = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
            launched = await pair.bc.call(
                "POST",
                "/v1/threads",
                body={
                    "projectId": project["id"],
                    "prompt": script({"reply": "seeded"}),
                    "provider": "script",
                },
            )
            await wait_terminal(pair.bc, launched["threadId"])
            agent = await pair.bc.call(
                "POST",
                "/v1/threads",
                body={"projectId": project["id"], "prompt": script(*HOLD_RUN), "provider": "script"},
            )
            token = await _read_when_written(Path(agent["worktreePath"]) / TOKEN_FILE)
            self.seeds = Seeds(
                project["id"], launched["threadId"], launched["runId"], agent["threadId"], token
            )
            self.pair = pair
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run `coro` in the daemons' loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def box(self) -> Pair:
        assert self.pair is not None
        return self.pair

    def access_token(self) -> str:
        """The laptop's access token for the box (refreshed by the laptop when near its expiry)."""
        pair = self.box
        assert pair.laptop.peers is not None
        _link, token = self.call(pair.laptop.peers.access_token(pair.box_id))
        return token

    @property
    def owner_socket(self) -> Path:
        return self.box.box.paths.socket

    @property
    def box_url(self) -> str:
        return self.box.box_url

    @property
    def fingerprint(self) -> bytes:
        identity = self.box.box.identity
        assert identity is not None
        return identity.fingerprint

    @property
    def db_path(self) -> Path:
        return self.box.box.paths.db


async def _read_when_written(path: Path) -> str:
    # The run writes it from its own process: no event to wait on.
    return await eventually(
        lambda: path.exists() and path.read_text().strip(),
        what=f"{path.name} written by the held run",
        within=START_TIMEOUT_S / 2,
    )


class _UnixConnection(HTTPConnection):
    def __init__(self, path: str, **kw: Any) -> None:
        super().__init__("localhost", **kw)
        self.unix_path = path

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout if isinstance(self.timeout, int | float) else None)
        sock.connect(self.unix_path)
        return sock


class _UnixPool(urllib3.HTTPConnectionPool):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", maxsize=2)
        self.unix_path = path

    def _new_conn(self) -> HTTPConnection:
        return _UnixConnection(self.unix_path, timeout=self.timeout.connect_timeout)


class _UnixAdapter(HTTPAdapter):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.pool = _UnixPool(str(path))

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> urllib3.HTTPConnectionPool:
        return self.pool

    def close(self) -> None:
        self.pool.close()
        super().close()


def unix_session(path: Path) -> requests.Session:
    """Requests to `http://localhost/...` go over the Unix socket at `path`."""
    session = requests.Session()
    session.mount("http://", _UnixAdapter(path))
    session.trust_env = False  # no proxy from the environment
    return session


class _PinnedAdapter(HTTPAdapter):
    """TLS checked by the certificate's sha256, as the laptop pins it (the certificate names no host)."""

    def __init__(self, fingerprint: bytes) -> None:
        self.fingerprint = fingerprint.hex()
        super().__init__()

    def get_connection_with_tls_context(
        self, request: Any, verify: Any, proxies: Any = None, cert: Any = None
    ) -> urllib3.HTTPConnectionPool:
        url = urllib3.util.parse_url(request.url)
        pinned = {"assert_fingerprint": self.fingerprint, "cert_reqs": "CERT_NONE", "assert_hostname": False}
        pool: urllib3.HTTPConnectionPool = self.poolmanager.connection_from_host(
            url.host, url.port, scheme="https", pool_kwargs=pinned
        )
        return pool

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """Nothing: the pool's fingerprint check is the verification."""


def pinned_session(fingerprint: bytes) -> requests.Session:
    session = requests.Session()
    session.mount("https://", _PinnedAdapter(fingerprint))
    session.trust_env = False
    return session


class Rows:
    """Every table of the box's store: row counts and a digest of the rows."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10, check_same_thread=False)

    def snapshot(self) -> dict[str, tuple[int, str]]:
        tables = [
            name
            for (name,) in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        shot = {}
        for table in tables:
            cursor = self.conn.execute(f'SELECT * FROM "{table}"')  # noqa: S608  # our own table names
            names = [d[0] for d in cursor.description]
            skip = {names.index(col) for col in VOLATILE.get(table, ()) if col in names}
            rows = sorted(repr(tuple(v for i, v in enumerate(row) if i not in skip)) for row in cursor)
            count = len(rows)
            digest = hashlib.sha256("\n".join(rows).encode())
            shot[table] = (count, digest.hexdigest()[:16])
        return shot

    def live_runs(self, held: str) -> int:
        """Runs still going, but for the `held` thread's (its run is kept live on purpose, so what
        it is sent waits) and queued runs that cannot start (their thread's queue is held)."""
        (n,) = self.conn.execute(
            "SELECT count(*) FROM runs WHERE thread_id != ? AND (status IN ('starting', 'running') OR (status = "
            "'queued' AND thread_id NOT IN (SELECT id FROM threads WHERE queue_held = 1)))",
            (held,),
        ).fetchone()
        return int(n)

    def close(self) -> None:
        self.conn.close()
