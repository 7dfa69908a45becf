"""This machine's long-lived Ed25519 identity: key, self-signed TLS cert, environment id, pin.

Files under ``<home>/identity/`` (directory 0700):

    key.pem    PKCS8 PEM, unencrypted, mode 0600. Losing it means a new environment id.
    cert.pem   self-signed X.509 over that key (CN = env id). Rebuilt when missing, unparsable or
               made for another key; a rebuilt cert keeps the env id but changes the fingerprint.

The environment id is derived from the public key the way Syncthing derives device ids, only
shorter: base32 of sha256(raw public key), first 20 characters, 4 groups of 5, each group followed
by one Luhn mod 32 check character (Syncthing's ``luhn32``), e.g. ``ABCDEF-GHIJKL-MNOPQR-STUVWX``.
100 bits of hash is plenty for a human-checked label; the TLS pin (full sha256) is what
authenticates a peer.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from peerd.core.envid import env_id_from_public_key, normalize_env_id
from peerd.core.fingerprint import format_fingerprint
from peerd.core.identityfiles import read_identity_files
from peerd.errors import IdentityError, InvalidRequest
from peerd.logs import get_logger

# `cryptography` (some 7 MiB) is imported where a key or a certificate is made, parsed or used to
# sign, not with this module: a daemon without a network listener reads its identity without it
# (`load_or_create_identity(light=True)`, issue 33).
if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "Identity",
    "env_id_from_certificate",
    "env_id_from_public_key",
    "env_id_matches",
    "load_or_create_identity",
    "pinned_fingerprint",
    "server_ssl_context",
    "write_atomic",
]

log = get_logger(__name__)

_CERT_VALIDITY = timedelta(days=20 * 365 + 5)  # 20 years, leap days included


@dataclass(frozen=True)
class Identity:
    """This machine's identity. ``fingerprint`` is what peers pin (see ``pinned_fingerprint``)."""

    public_key_raw: bytes
    env_id: str
    cert_pem: bytes = field(repr=False)
    cert_der: bytes = field(repr=False)
    key_path: Path
    cert_path: Path
    # The signing key once read: by the full reading, or on first use (`private_key`).
    _key: list[Ed25519PrivateKey] = field(default_factory=list, repr=False, compare=False)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The signing key (link tokens, the web certificate), read on first use."""
        if not self._key:
            self._key.append(_read_key(self.key_path))
        return self._key[0]

    @property
    def fingerprint(self) -> bytes:
        """sha256 of the certificate DER: the digest ``aiohttp.Fingerprint`` compares."""
        return hashlib.sha256(self.cert_der).digest()

    @property
    def fingerprint_text(self) -> str:
        """``"sha256:"`` + 64 lowercase hex characters; ``parse_fingerprint`` reads it back."""
        return format_fingerprint(self.fingerprint)


# --- environment ids ---------------------------------------------------------------------------


def env_id_from_certificate(cert_der: bytes, pin: bytes) -> str:
    """The environment id of the Ed25519 key in a peer's certificate, once it matches its pin.

    This, not a pairing code or a descriptor (which the peer writes), is the id a link is stored
    and shown under. ``ValueError`` when the DER is not ``pin``'s certificate or holds another
    kind of key.
    """
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: PLC0415

    if not hmac.compare_digest(hashlib.sha256(cert_der).digest(), pin):
        raise ValueError("the certificate does not match its pin")
    try:
        key = x509.load_der_x509_certificate(cert_der).public_key()
    except ValueError as exc:
        raise ValueError(f"the certificate cannot be read ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"the certificate holds a {type(key).__name__}, not an Ed25519 key")
    return env_id_from_public_key(
        key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def env_id_matches(env_id: str, raw_public_key: bytes) -> bool:
    """Whether ``env_id`` (any accepted spelling) names ``raw_public_key``. Never raises."""
    try:
        expected = env_id_from_public_key(raw_public_key)
        given = normalize_env_id(env_id)
    except (ValueError, InvalidRequest):
        return False
    return hmac.compare_digest(given, expected)


# aiohttp.Fingerprint has no __eq__/__hash__ and is part of the pool's ConnectionKey: a fresh
# object per request means a fresh TLS connection per request. One object per pin fixes that.
_PINS: dict[bytes, aiohttp.Fingerprint] = {}


def pinned_fingerprint(fp: bytes) -> aiohttp.Fingerprint:
    """The shared ``aiohttp.Fingerprint`` for a sha256 pin; pass it as ``ssl=`` on requests."""
    key = bytes(fp)
    pin = _PINS.get(key)
    if pin is None:
        if len(key) != 32:  # aiohttp would also take md5/sha1 lengths, only to refuse them
            raise ValueError(f"a sha256 fingerprint is 32 bytes, got {len(key)}")
        pin = _PINS[key] = aiohttp.Fingerprint(key)
    return pin


# --- TLS -----------------------------------------------------------------------------------------


def server_ssl_context(identity: Identity) -> ssl.SSLContext:
    """Server-side TLS with this identity's cert. TLS 1.3 only: Ed25519 certs need it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(certfile=identity.cert_path, keyfile=identity.key_path)
    return ctx


# --- files ---------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write via a temp file created with ``mode`` (never briefly world-readable), then rename."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    # Persist the rename itself, so a crash cannot leave a cert without its key.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _tighten(path: Path, wanted: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~wanted:
        path.chmod(wanted)
        log.warning("identity_permissions_tightened", path=str(path), was=oct(current), now=oct(wanted))


def _load_or_create_key(key_path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The key and whether it was just created."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

    if not key_path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_atomic(key_path, pem, 0o600)
        return key, True
    _tighten(key_path, 0o600)
    return _read_key(key_path), False


def _read_key(key_path: Path) -> Ed25519PrivateKey:
    """The stored key; never a new one (a new key would be a new environment)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

    try:
        loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        # Refuse rather than regenerate: a new key would silently become a new environment.
        raise IdentityError(
            f"identity key {key_path} is not a readable unencrypted PEM key ({exc}); "
            "restore it from a backup, or move it away to create a new identity"
        ) from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise IdentityError(
            f"identity key {key_path} is a {type(loaded).__name__}, not Ed25519; "
            "move it away to create a new identity"
        )
    return loaded


def _build_cert(key: Ed25519PrivateKey, env_id: str) -> x509.Certificate:
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, env_id)])
    now = datetime.now(UTC)
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))  # tolerate a peer whose clock is behind
        .not_valid_after(now + _CERT_VALIDITY)
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, algorithm=None)  # Ed25519 signs without a separate digest
    )


def _load_cert(cert_path: Path, public_key_raw: bytes) -> x509.Certificate | None:
    """The stored cert if it parses and is for this key, else None (caller rebuilds it)."""
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        cert_pub = cert.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    except (OSError, ValueError):
        return None
    return cert if hmac.compare_digest(cert_pub, public_key_raw) else None


def load_or_create_identity(home: Path, *, light: bool = False) -> Identity:
    """Load this machine's identity from ``home/identity``, creating what is missing.

    The key is never replaced once written, so the env id is stable across restarts; the cert is
    rebuilt if it is missing, unparsable or belongs to another key.

    ``light`` (a daemon without a network listener): when both files are exactly what this
    function writes, they are read with the standard library (`core/identityfiles.py`) and the
    key is parsed only when something signs with it; anything else takes the full reading.
    """
    id_dir = home / "identity"
    id_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(id_dir, 0o700)
    key_path, cert_path = id_dir / "key.pem", id_dir / "cert.pem"
    if light and key_path.exists():
        _tighten(key_path, 0o600)
        found = read_identity_files(key_path, cert_path)
        if found is not None:
            return Identity(
                public_key_raw=found.public_key_raw,
                env_id=env_id_from_public_key(found.public_key_raw),
                cert_pem=ssl.DER_cert_to_PEM_cert(found.cert_der).encode("ascii"),
                cert_der=found.cert_der,
                key_path=key_path,
                cert_path=cert_path,
            )

    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # see the note at the imports

    key, created = _load_or_create_key(key_path)
    public_key_raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    env_id = env_id_from_public_key(public_key_raw)
    if created:
        log.info("identity_created", env_id=env_id, path=str(key_path))

    cert = _load_cert(cert_path, public_key_raw)
    if cert is None:
        cert = _build_cert(key, env_id)
        write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        log.info("identity_cert_written", env_id=env_id, path=str(cert_path))

    return Identity(
        public_key_raw=public_key_raw,
        env_id=env_id,
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        cert_der=cert.public_bytes(serialization.Encoding.DER),
        key_path=key_path,
        cert_path=cert_path,
        _key=[key],
    )
