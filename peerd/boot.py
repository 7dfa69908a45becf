"""`peerd serve`'s first steps, light enough that `status` answers within a few hundred ms of exec.

Importing the whole daemon (`peerd.daemon`: aiohttp, pydantic contracts, cryptography, the MCP
bridge, orchestration...) is most of a second. So `serve` first does, with the standard library
only (and click, for the CLI; tests/integration/test_early_start.py keeps it so):

1. take the home lock (another daemon on this home: `already_running`);
2. read the identity (`key.pem`, `cert.pem`): the environment id and the certificate's
   fingerprint, the key's public half computed by peerd/core/ed25519.py (a home without both, or
   with anything unusual in them, skips the early answer: the full start makes or mends them);
3. bind the owner socket (0600 from birth) and serve it (`EarlyStart`): `GET /v1/status` is
   answered at once, counted from the store file read-only, with `"state": "starting"` and only
   the owner socket in `listeners`; every other request is *held*, unanswered, until the daemon is built, then handed
   to it on the same connection (so `peerd serve & peerd status --wait 10; peerd project add ...`
   works as written). If the start fails, held requests are answered `unavailable`.

Then, while the loop keeps answering `status`, the store is checked and opened (`store/health.py`:
never over a damaged or foreign one; its integrity check reads the whole file, which is what grows
with history; its modules are imported in a worker thread too: an import on the loop thread would
wait for the import lock the daemon's import holds) and, in a worker thread, the config file is
read and validated and logging set up (the CLI's `settle`; the early `status` has only the
`label` read with `tomllib`) and `peerd.daemon` is imported. Nothing but `status` is served
before the store passed its check and is open. `Daemon.start(early=...)` then builds the rest
over the same lock, store and socket. The answer of a started daemon's `status` has no `state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import signal
import socket
import sqlite3
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from peerd import __version__
from peerd.api.listener_rules import ListenerLimits
from peerd.core.console_bind import is_loopback
from peerd.core.envid import env_id_from_public_key
from peerd.core.identityfiles import read_identity_files
from peerd.errors import AlreadyRunning, HomeUnusable, InvalidRequest, PeerdError, ShuttingDown, Unavailable
from peerd.homeformat import check_home_format, record_home_format
from peerd.paths import Paths, config_file

if TYPE_CHECKING:
    from peerd.config import Config
    from peerd.store.db import Database

DEFAULT_LISTEN = "127.0.0.1:7433"
PROTOCOL_VERSION = 1  # contracts.PROTOCOL_VERSION (tests/integration/test_early_start.py compares)
WIRE_PROTOCOL = (
    2  # contracts.WIRE_PROTOCOL (tests/compat/test_protocol.py compares): the early answers say it too
)
MAX_EARLY_HEAD = 16 * 1024  # a request head the early server reads before it gives up on it


def light_label(path: Path | None, *, home: Path | None) -> str | None:
    """`label` from the config file, read with `tomllib` only, for the early `status` (the file
    is validated later, by `serve`'s `settle`); None when there is none or it cannot be read."""
    try:
        raw = tomllib.loads((path or config_file(home=home)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    label = raw.get("label")
    return label if isinstance(label, str) and label else None


def home_unusable(home: Path, exc: OSError) -> HomeUnusable:
    why = exc.strerror or type(exc).__name__
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(home) else ""
    return HomeUnusable(
        f"peerd cannot use {home} as its home: {why}{where}. Give another with --home or PEERD_HOME, "
        "or make it a directory this user can write."
    )


def _default_settings() -> Config:
    from peerd.config import Config  # noqa: PLC0415  # pydantic: not before `status` answers

    return Config()


@dataclass(frozen=True)
class EarlyConfig:
    """What the early start needs before the config file is validated (`serve(settle=...)`)."""

    home: Path
    label: str
    new_store: bool = False


@dataclass(frozen=True)
class DaemonConfig:
    home: Path
    label: str = field(default_factory=socket.gethostname)
    listen: str | None = DEFAULT_LISTEN  # None: no TCP listener
    tls: bool = True
    advertise: tuple[str, ...] = ()  # addresses pairing codes carry, when the bound one is not reachable
    watch_chunk_s: float = 50.0  # the follower's long-poll chunk (tests shorten it)
    settings: Config = field(default_factory=_default_settings)  # the config file (providers, approvals)
    listener_limits: ListenerLimits = field(
        default_factory=ListenerLimits
    )  # TCP caps, timeouts (tests lower them)
    new_store: bool = False  # `serve --new-store`: an existing identity may get a new, empty store


def parse_listen(listen: str, *, tls: bool) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:7433`); plain HTTP is refused off loopback."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise InvalidRequest(f"--listen {listen!r} must be HOST:PORT, e.g. 127.0.0.1:7433.")
    host = host.strip("[]")
    port = int(port_text)
    if port > 65535:
        raise InvalidRequest(f"--listen port {port} is out of range.")
    if not tls and not is_loopback(host):
        raise InvalidRequest(
            f"Refusing to listen on {host} without TLS: only loopback addresses may serve plain HTTP."
        )
    return host, port


def take_lock(paths: Paths) -> IO[str]:
    """The home lock, held for the daemon's lifetime."""
    try:
        paths.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = open(paths.lock, "a+")  # noqa: SIM115  # held for the daemon's lifetime
    except OSError as exc:
        raise home_unusable(paths.home, exc) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise AlreadyRunning(
            f"Another peerd is already running with home {paths.home} (`peerd status` shows it)."
        ) from None
    return handle


async def open_store(paths: Paths, *, new_store: bool) -> Database:
    """Never start over a damaged or foreign store (store/health.py): an existing file must be
    a healthy peerd store; a missing one is made only on a first start (no identity yet) or
    with `--new-store`. Refused: `StoreRefused`, one sentence naming the file and the way out."""
    identity_exists = (paths.home / "identity" / "key.pem").exists()
    # Imported and checked in a worker thread: an import on the loop thread would stop `status`
    # (the early server) until it is done, and it waits for the import lock the thread importing
    # the daemon holds, so it could take as long as the whole daemon's modules.
    check_home_format(paths.home)
    database = await asyncio.to_thread(_checked_store, paths.db, identity_exists, new_store)
    opened = await database.open(paths.db)
    await asyncio.to_thread(record_home_format, paths.home)  # migrated: the home is this format now
    return opened


def _checked_store(db: Path, identity_exists: bool, new_store: bool) -> type[Database]:
    from peerd.store import health  # noqa: PLC0415  # aiosqlite: only once serving
    from peerd.store.db import Database  # noqa: PLC0415  # aiosqlite: only once serving

    health.check(db, identity_exists=identity_exists, new_store=new_store)
    return Database


# --- the identity, read lightly ------------------------------------------------------------------


def light_identity(home: Path) -> tuple[str, str] | None:
    """(environment id, fingerprint text) from `home/identity`, or None when the files are missing
    or not exactly what `load_or_create_identity` writes (an unencrypted PKCS8 Ed25519 key and a
    certificate over that key): the full start then handles them. The standard library's:
    `cryptography` is not imported yet (`core/identityfiles.py`)."""
    found = read_identity_files(home / "identity" / "key.pem", home / "identity" / "cert.pem")
    if found is None:
        return None
    return env_id_from_public_key(found.public_key_raw), "sha256:" + hashlib.sha256(
        found.cert_der
    ).hexdigest()


# --- the early owner socket ---------------------------------------------------------------------


def prepare_socket_path(home: Path, path: Path) -> None:
    """Make `path`'s directory, check it is this user's and private when it is not the home, and
    remove a stale socket file (the caller holds the home lock, so no other daemon owns it). The
    caller then binds with umask 0177, so the socket is 0600 from birth."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.parent != home:
        # The short fallback socket dir is in a shared temp dir: it must be ours and private,
        # or another user could stand in for the daemon (and collect run tokens).
        st = path.parent.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise HomeUnusable(
                f"{path.parent} is not a private directory of this user; remove it or use a shorter --home."
            )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _response(status: int, reason: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Peerd-Protocol: {WIRE_PROTOCOL}\r\nPeerd-Version: {__version__}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + data


class _Held(asyncio.Protocol):
    """One connection accepted before the daemon is built: `status` is answered, anything else is
    held (its bytes kept) until `EarlyStart.handoff` gives it to the daemon's HTTP server."""

    def __init__(self, early: EarlyStart) -> None:
        self._early = early
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101  # a stream socket
        self._transport = transport
        self._early.held.add(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        head, sep, _ = bytes(self._buffer).partition(b"\r\n\r\n")
        if not sep:
            if len(self._buffer) > MAX_EARLY_HEAD:
                self._answer(
                    _response(431, "Request Header Fields Too Large", _refusal("request head too large"))
                )
            return
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0].partition(b"?")[0]
        if method == b"GET" and target == b"/v1/status":
            self._early.spawn(self._status())
        # anything else waits for the daemon (handoff), with what it sent so far

    def eof_received(self) -> bool:
        self._eof = True
        return True  # keep the socket open for our answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._early.held.discard(self)

    async def _status(self) -> None:
        try:
            body = await self._early.status()
        except Exception as exc:  # the store failed: say so, as the daemon would
            self._answer(_response(503, "Service Unavailable", _refusal(f"The daemon is starting: {exc}")))
            return
        self._answer(_response(200, "OK", body))

    def _answer(self, data: bytes) -> None:
        self._early.held.discard(self)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)
            self._transport.close()

    def handoff(self, factory: Callable[[], asyncio.Protocol]) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        protocol = factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._buffer:
            protocol.data_received(bytes(self._buffer))
        if self._eof:
            protocol.eof_received()

    def refuse(self, message: str) -> None:
        self._answer(_response(503, "Service Unavailable", _refusal(message)))


def _counts(db: Path) -> tuple[int, int, int]:
    """What `status` counts, read from the store file read-only (it may not be checked yet: a
    damaged one fails here, and the answer is `unavailable`); a store not made yet counts 0."""
    if not db.exists():
        return 0, 0, 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        one = [
            int(con.execute(sql).fetchone()[0])
            for sql in (
                "SELECT count(*) FROM projects",
                "SELECT count(*) FROM threads WHERE status = 'active'",
                "SELECT count(*) FROM runs WHERE status IN ('starting', 'running')",
            )
        ]
    finally:
        con.close()
    return one[0], one[1], one[2]


def _refusal(message: str) -> dict[str, str]:
    return {"code": Unavailable.code, "message": message}


class EarlyStart:
    """What `serve` holds before the daemon is built: the home lock, the open store, the identity
    read lightly, and the owner socket, served first by `_Held` connections, then (after
    `handoff`) by the daemon's own HTTP server on the very same listening socket."""

    def __init__(self, config: DaemonConfig | EarlyConfig) -> None:
        self.config = config
        self.paths = Paths(config.home)
        self.lock: IO[str] | None = None
        self.db: Database | None = None
        self.identity: tuple[str, str] | None = None
        self.held: set[_Held] = set()
        self._server: asyncio.Server | None = None
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        """The lock, the identity and (when both files are there) the socket. The store is then
        checked and opened by `open_store`: its integrity check reads the whole file, which with
        a long history is the slow part, so `status` is answered while it runs (read-only)."""
        self.lock = take_lock(self.paths)
        check_home_format(self.paths.home)  # a newer peerd's home: one sentence, nothing opened
        self.identity = await asyncio.to_thread(light_identity, self.paths.home)
        if self.identity is not None:  # else: the first start, answered once all is built
            await self.bind()

    async def open_store(self) -> None:
        self.db = await open_store(self.paths, new_store=self.config.new_store)

    async def bind(self) -> None:
        path = self.paths.socket
        prepare_socket_path(self.paths.home, path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
        try:
            sock.bind(str(path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        sock.listen(128)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._protocol, sock=sock)

    @property
    def bound(self) -> bool:
        return self._server is not None

    def _protocol(self) -> asyncio.Protocol:
        return self._factory() if self._factory is not None else _Held(self)

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def status(self) -> dict[str, Any]:
        assert self.identity is not None  # noqa: S101  # bound only with it
        env_id, fingerprint = self.identity
        projects, threads, live = await asyncio.to_thread(_counts, self.paths.db)
        return {
            "environmentId": env_id,
            "label": self.config.label,
            "version": __version__,
            "protocolVersion": PROTOCOL_VERSION,
            "fingerprint": fingerprint,
            "listeners": [{"kind": "unix", "address": str(self.paths.socket), "tls": False}],
            "counts": {"projects": projects, "threads": threads, "liveRuns": live},
            "home": str(self.paths.home),
            "state": "starting",
            "envId": env_id,  # deprecated: `environmentId`'s older name, as in c.Status
        }

    def handoff(self, factory: Callable[[], asyncio.Protocol]) -> None:
        """From now on the daemon's HTTP server serves the socket: new connections at once, and
        every held one with the bytes it already sent."""
        self._factory = factory
        for held in list(self.held):
            held.handoff(factory)
        self.held.clear()

    def refuse_held(self, message: str) -> None:
        for held in list(self.held):
            held.refuse(message)

    async def close(self) -> None:
        """Stop accepting (the daemon's shutdown, before its HTTP server closes its connections)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()


async def serve(
    config: DaemonConfig | EarlyConfig, *, settle: Callable[[], DaemonConfig] | None = None
) -> None:
    """`peerd serve`: the early steps above, then the whole daemon (`peerd.daemon.serve`).

    With `settle` (the CLI's), `config` is only what the early start needs, and `settle` reads and
    validates the config file, sets up logging and returns the daemon's config: run in the worker
    thread that imports the daemon, after `status` answers (on a first start, before the store is
    made). Its error (a wrong config file or flag) ends the start like any other.

    SIGTERM/SIGINT are handled from the first step: one that arrives while the daemon is still
    loading ends the start cleanly (held requests answered `unavailable`, lock and store closed,
    exit 0) instead of killing the process by the signal's default action."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    early = EarlyStart(config)
    settled: DaemonConfig | None = config if isinstance(config, DaemonConfig) else None
    try:
        await early.open()
        if settled is None and not early.bound:  # a first start: nothing is made before the file is read
            settled = await asyncio.to_thread(_settle, settle)
        started = time.monotonic()

        def load() -> tuple[DaemonConfig, Any]:
            full = settled if settled is not None else _settle(settle)
            return full, importlib.import_module("peerd.daemon")

        # The store's check and the whole daemon's modules, while the loop answers `status`.
        store = asyncio.ensure_future(early.open_store())
        try:
            full, daemon = await asyncio.to_thread(load)
            early.config = full  # `status` now says the validated label
        finally:
            await store  # raises StoreRefused for a damaged or foreign store: nothing else is served
        import_s = time.monotonic() - started
        if stop.is_set():
            raise ShuttingDown("The daemon was stopped while it was starting.")
    except ShuttingDown as exc:  # stopped while it started: nothing else is said
        await _abandon(early, exc.message)
        return
    except BaseException as exc:
        await _abandon(early, f"The daemon could not start: {getattr(exc, 'message', exc)}")
        raise
    await daemon.serve(full, early=early, import_s=import_s, stop=stop)


def _settle(settle: Callable[[], DaemonConfig] | None) -> DaemonConfig:
    if settle is None:  # pragma: no cover  # `config` is a DaemonConfig whenever settle is None
        raise PeerdError("peerd serve was started without its config.")
    return settle()


async def _abandon(early: EarlyStart, message: str) -> None:
    early.refuse_held(message)
    bound = early.bound
    await early.close()
    if bound:  # ours (the lock is held): no stale socket is left for `status` to find
        with contextlib.suppress(FileNotFoundError):
            early.paths.socket.unlink()
    if early.db is not None:
        await early.db.close()
    if early.lock is not None:
        early.lock.close()
