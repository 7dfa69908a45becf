"""The listener's second certificate, for browsers, and the pair of TLS contexts the listener holds.

Links pin the identity certificate (Ed25519, `peer/identity.py`). Browsers take no Ed25519 server
certificate, so the sign-in page an outside agent opens (`api/agent_signin_routes.py`) needs another:
the **web certificate**, ECDSA P-256. The listener shows each client one of the two, by what its
ClientHello offers (`core/tls_hello.py`): a client offering Ed25519 (every peerd, Python, Node,
rustls) gets the identity certificate as before; one that does not (a browser) gets this one.

Which web certificate:

- the owner's, when config.toml names `web_cert` and `web_key` (a browser-trusted one: `tailscale
  cert`, an ACME client, a company CA), loaded as given and never written;
- else a self-signed one peerd makes once, in ``<home>/identity/web-cert.pem`` and
  ``web-key.pem`` (0600): ECDSA P-256, 397 days, names `localhost`, this machine's host name and
  the loopback addresses; rebuilt when missing, unreadable, not an ECDSA key, or within 30 days of
  its end. The browser warns about it once; `peerd status` prints its fingerprint to compare.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from peerd.core.fingerprint import format_fingerprint
from peerd.core.tls_hello import Cert
from peerd.errors import ConfigInvalid
from peerd.logs import get_logger
from peerd.peer.identity import Identity, server_ssl_context, write_atomic

# `cryptography` is imported where a certificate is read or made (a TLS listener), not with this
# module (`ServerTls` is the listener's type): see peer/identity.py.
if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["ServerTls", "WebCertificate", "load_web_certificate", "server_tls"]

log = get_logger(__name__)

WEB_CERT_VALIDITY = timedelta(days=397)  # what browsers accept of any server certificate
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class WebCertificate:
    cert_path: Path
    key_path: Path
    fingerprint_text: str  # "sha256:" + hex of the leaf's DER, as a browser's certificate viewer shows
    own: bool  # the owner's (config.toml), not one peerd made


@dataclass(frozen=True)
class ServerTls:
    """The listener's two TLS contexts; `for_cert` is what `core/tls_hello.sniff` chose."""

    identity: ssl.SSLContext
    web: ssl.SSLContext | None  # None: one certificate only (the identity one), no peeking

    def for_cert(self, cert: Cert) -> ssl.SSLContext:
        return self.web if cert is Cert.WEB and self.web is not None else self.identity


def server_tls(identity: Identity, web: WebCertificate | None) -> ServerTls:
    return ServerTls(identity=server_ssl_context(identity), web=None if web is None else _web_context(web))


def _web_context(web: WebCertificate) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile=web.cert_path, keyfile=web.key_path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigInvalid(
            f"The web certificate or its key cannot be loaded ({web.cert_path}, {web.key_path}): "
            f"{getattr(exc, 'strerror', None) or exc}. Fix web_cert and web_key in config.toml, or "
            "remove both to let peerd make its own."
        ) from None
    return ctx


def load_web_certificate(
    home: Path, env_id: str, *, cert: str | None = None, key: str | None = None
) -> WebCertificate:
    """The owner's web certificate when `cert` and `key` are given, else peerd's own (made once)."""
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    if cert is not None and key is not None:
        cert_path = Path(cert).expanduser()
        try:
            leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigInvalid(
                f"web_cert {cert_path} cannot be read as a PEM certificate: "
                f"{getattr(exc, 'strerror', None) or exc}."
            ) from None
        return WebCertificate(cert_path, Path(key).expanduser(), _fingerprint(leaf), own=True)
    id_dir = home / "identity"
    cert_path, key_path = id_dir / "web-cert.pem", id_dir / "web-key.pem"
    now = datetime.now(UTC)
    kept = _usable(cert_path, key_path, now)
    if kept is not None:
        leaf = kept
    else:
        id_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        private = ec.generate_private_key(ec.SECP256R1())
        leaf = _build(private, env_id, now)
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_atomic(key_path, pem, 0o600)
        write_atomic(cert_path, leaf.public_bytes(serialization.Encoding.PEM), 0o644)
        log.info(
            "identity.web_cert_written",
            path=str(cert_path),
            until=leaf.not_valid_after_utc.date().isoformat(),
        )
    return WebCertificate(cert_path, key_path, _fingerprint(leaf), own=False)


def _fingerprint(leaf: x509.Certificate) -> str:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # see the note at the imports

    return format_fingerprint(hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).digest())


def _usable(cert_path: Path, key_path: Path, now: datetime) -> x509.Certificate | None:
    """peerd's own web certificate when it can still serve: readable, over its own ECDSA key, and
    not within `RENEW_BEFORE` of its end."""
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    try:
        leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
        private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        return None
    if leaf.public_key() != private.public_key():
        return None
    if leaf.not_valid_after_utc - RENEW_BEFORE < now:
        return None
    return leaf


def _build(private: ec.EllipticCurvePrivateKey, env_id: str, now: datetime) -> x509.Certificate:
    from cryptography import x509  # noqa: PLC0415  # see the note at the imports
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peerd"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{env_id} web"),
        ]
    )
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    host = socket.gethostname()
    if host and host != "localhost":
        with contextlib.suppress(UnicodeError):  # a name IDNA cannot spell: the browser warns of it too
            names.append(x509.DNSName(host.encode("idna").decode("ascii")))
    names += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1"))]
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + WEB_CERT_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(private, hashes.SHA256())
    )
