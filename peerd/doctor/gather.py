"""`peerd doctor`'s facts, gathered: file modes and owners, the daemon's answers or why there were
none, the certificate, `git --version`, confinement and the store's integrity. The checks that
judge them are pure (`peerd/doctor/__init__.py:run_checks`); `peerd doctor` (`cli/doctor.py`) and
the console's health page (`console/pages.py:health`) gather with `gather`."""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import hmac
import os
import pwd
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd import __version__
from peerd import config as settings_file
from peerd import contracts as c
from peerd.api.localclient import LocalClient
from peerd.core.fingerprint import format_fingerprint
from peerd.doctor.facts import CertFacts, ConfinementFacts, DaemonFacts, Facts, FileFacts
from peerd.doctor.text import kind_of
from peerd.errors import DaemonNotRunning, PeerdError
from peerd.paths import Paths
from peerd.runtime import runas, sandbox, sandbox_profile
from peerd.runtime.git import probe_version
from peerd.store import health as store_health

GIT_TIMEOUT_S = 10.0
T = TypeVar("T")


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def file_facts(path: Path) -> FileFacts:

    try:
        st = path.stat()
    except FileNotFoundError:
        return FileFacts(str(path), "missing")
    except OSError as exc:
        return FileFacts(str(path), "other", error=exc.strerror or str(exc))
    return FileFacts(str(path), kind_of(st.st_mode), st.st_mode & 0o7777, st.st_uid, _owner(st.st_uid))


def _raw_public(key: Any) -> bytes:

    raw: bytes = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def identity_facts(identity_dir: Path) -> tuple[str | None, CertFacts]:
    """Whether the key loads (None, or why not) and what the certificate is."""

    key_path, cert_path = identity_dir / "key.pem", identity_dir / "cert.pem"
    key_raw: bytes | None = None
    key_error: str | None = None
    if key_path.is_file():
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            key_error = str(exc) or type(exc).__name__
        else:
            if isinstance(key, Ed25519PrivateKey):
                key_raw = _raw_public(key.public_key())
            else:
                key_error = f"it is a {type(key).__name__}"
    if not cert_path.exists():
        return key_error, CertFacts(str(cert_path), exists=False)
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        return key_error, CertFacts(str(cert_path), exists=True, error=str(exc) or type(exc).__name__)
    try:
        cert_raw: bytes | None = _raw_public(cert.public_key())
    except (ValueError, TypeError):  # not an Ed25519 key: no raw form
        cert_raw = None
    for_key = None if key_raw is None else cert_raw is not None and hmac.compare_digest(cert_raw, key_raw)
    return key_error, CertFacts(
        str(cert_path),
        exists=True,
        not_before=cert.not_valid_before_utc.timestamp(),
        not_after=cert.not_valid_after_utc.timestamp(),
        fingerprint=format_fingerprint(
            hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest()
        ),
        for_key=for_key,
    )


async def git_facts() -> tuple[str | None, str | None, str | None]:
    """(what `git --version` printed, where git is, why it did not run), through peerd's git runner."""
    found = await probe_version(GIT_TIMEOUT_S)
    return found.text, found.path, found.error


async def _attempt(call: Callable[[], Awaitable[T]]) -> tuple[T | None, str | None]:
    """`call()`'s answer or why not. Takes the call, not its coroutine: a gather cancelled before
    this starts leaves no coroutine behind never awaited."""
    try:
        return await call(), None
    except PeerdError as exc:
        return None, f"{exc.code}: {exc.message}"
    except (DaemonNotRunning, ValueError) as exc:  # ValueError: an answer of an unexpected shape
        return None, str(exc)


async def _links(client: LocalClient) -> list[c.LinkInfo]:

    data = await client.call("GET", "/v1/environments", params={"probe": True})
    return [c.LinkInfo.model_validate(x) for x in data["items"]]


async def _providers(client: LocalClient) -> list[c.ProviderInfo]:

    data = await client.call("GET", "/v1/providers")
    return [c.ProviderInfo.model_validate(x) for x in data["items"]]


async def daemon_facts(socket: Path) -> DaemonFacts:

    async with LocalClient(socket) as client:
        try:
            status = c.Status.model_validate(await client.call("GET", "/v1/status"))
        except DaemonNotRunning as exc:
            return DaemonFacts(None, str(exc))
        except PeerdError as exc:
            return DaemonFacts(None, f"{exc.code}: {exc.message}", answered=True)
        except ValueError as exc:  # an answer of an unexpected shape
            return DaemonFacts(None, f"an unexpected answer: {exc}", answered=True)
        (links, links_error), (providers, providers_error) = await asyncio.gather(
            _attempt(lambda: _links(client)), _attempt(lambda: _providers(client))
        )
    return DaemonFacts(
        status,
        answered=True,
        links=links,
        links_error=links_error,
        providers=providers,
        providers_error=providers_error,
    )


def confinement_facts(config_home: Path | None = None) -> ConfinementFacts:

    found = sandbox.probe()
    try:
        allow = settings_file.load(home=config_home).links.allow_unconfined
    except PeerdError:
        allow = False  # the config check says what is wrong with the file
    return ConfinementFacts(
        works=found.ok,
        detail=found.detail,
        allow_unconfined=allow,
        etc_left_out=tuple(str(p) for p in sandbox_profile.system_mounts().etc_denied),
        readable=tuple(str(p) for p in sandbox_profile.extra_readable()),
        run_as=who.uid if (who := runas.decide_here(os.environ)) is not None else None,
    )


async def _store_health(db: Path) -> store_health.StoreHealth | None:
    """The integrity check, only on a store file of mode 0600: SQLite gives an empty -wal or -shm
    file it opens the mode of the database, and the doctor must change nothing (the `database`
    check says how to fix the mode first)."""

    try:
        if db.stat().st_mode & 0o777 != 0o600:
            return None
    except OSError:
        return None
    return await asyncio.to_thread(store_health.inspect, db)


async def gather(paths: Paths, *, now: float | None = None, config_home: Path | None = None) -> Facts:
    """`config_home`: the home `--home` named (its `config.toml` is the config file)."""

    socket = paths.socket
    identity_dir = paths.home / "identity"
    (daemon, (git_version, git_path, git_error)) = await asyncio.gather(daemon_facts(socket), git_facts())
    key_error, certificate = identity_facts(identity_dir)
    db = paths.db
    extra_db = [db.with_name(db.name + suffix) for suffix in ("-wal", "-shm")]
    uid = os.getuid()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = _owner(uid)
    return Facts(
        home=str(paths.home),
        uid=uid,
        user=user,
        now=time.time() if now is None else now,
        cli_version=__version__,
        config_path=str(settings_file.default_path(home=config_home)),
        home_dir=file_facts(paths.home),
        socket=file_facts(socket),
        socket_dir=None if socket.parent == paths.home else file_facts(socket.parent),
        db_files=[file_facts(db), *(file_facts(p) for p in extra_db if p.exists())],
        identity_dir=file_facts(identity_dir),
        identity_key=file_facts(identity_dir / "key.pem"),
        key_error=key_error,
        certificate=certificate,
        git_version=git_version,
        git_path=git_path,
        git_error=git_error,
        daemon=daemon,
        confinement=await asyncio.to_thread(confinement_facts, config_home),
        store=await _store_health(db),
    )
