"""Which of the listener's two certificates a TLS client gets, read from its ClientHello (pure).

The network listener holds two certificates (docs/security.md, "Two certificates"):

- the **identity** certificate: Ed25519, the one links pin (`peer/identity.py`). Every peerd of
  every release, Python's and Node's TLS and rustls offer Ed25519 and get it, as before;
- the **web** certificate: ECDSA P-256 (self-signed, or the owner's own), for clients that do not
  offer Ed25519 in TLS: browsers (Chromium, Firefox and Safari do not) opening the sign-in page.

OpenSSL would pick by its own preference order (ECDSA first), which would hand every link the web
certificate and break its pin; so the listener peeks at the first TLS record before the handshake
(`api/listener_connection.py`) and asks `sniff` which one this client gets.

`sniff(prefix)` takes the bytes received so far (never consumed: the TLS layer reads them again) and
answers `Sniffed(cert=None, need=N)` while the first record is incomplete (N: its whole length, at
most `MAX_RECORD`), else the certificate. Anything that is not a well-formed ClientHello whose
extensions could all be read gets the identity certificate: the handshake then goes as it always did.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ED25519", "MAX_RECORD", "Cert", "Sniffed", "sniff"]

ED25519 = 0x0807  # TLS SignatureScheme ed25519 (RFC 8446 4.2.3)
_HANDSHAKE = 0x16  # TLSPlaintext content type
_CLIENT_HELLO = 0x01  # HandshakeType
_SIGNATURE_ALGORITHMS = 13  # ExtensionType
_HEADER = 5  # content type, legacy version (2), length (2)
MAX_RECORD = _HEADER + 2**14  # a TLSPlaintext fragment is at most 2^14 bytes


class Cert(StrEnum):
    IDENTITY = "identity"
    WEB = "web"


@dataclass(frozen=True)
class Sniffed:
    cert: Cert | None  # None: the first record is not in yet
    need: int = 0  # while cert is None: the bytes the first record takes, header included


class _Short(Exception):
    """The hello ends before a field it announced."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Short
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        value: int = struct.unpack(">H", self.take(2))[0]
        return value

    def vector8(self) -> bytes:
        return self.take(self.u8())

    def vector16(self) -> bytes:
        return self.take(self.u16())


def sniff(prefix: bytes) -> Sniffed:
    """The certificate for a client whose connection began with `prefix` (see the module's doc)."""
    if len(prefix) < _HEADER:
        if prefix and prefix[0] != _HANDSHAKE:
            return Sniffed(Cert.IDENTITY)  # not TLS at all: the handshake refuses it as before
        return Sniffed(None, need=_HEADER)
    if prefix[0] != _HANDSHAKE or prefix[1] != 0x03:
        return Sniffed(Cert.IDENTITY)
    length = struct.unpack(">H", prefix[3:5])[0]
    if length == 0 or length > 2**14:
        return Sniffed(Cert.IDENTITY)
    if len(prefix) < _HEADER + length:
        return Sniffed(None, need=_HEADER + length)
    offered = _signature_algorithms(prefix[_HEADER : _HEADER + length])
    if offered is None:
        return Sniffed(Cert.IDENTITY)
    return Sniffed(Cert.IDENTITY if ED25519 in offered else Cert.WEB)


def _signature_algorithms(fragment: bytes) -> frozenset[int] | None:
    """The schemes a ClientHello offers (empty: it names none), or None when the hello cannot be
    read whole from this record (not a ClientHello, malformed, or continued in the next record)."""
    try:
        r = _Reader(fragment)
        if r.u8() != _CLIENT_HELLO:
            return None
        body = _Reader(r.take(int.from_bytes(r.take(3), "big")))  # _Short when fragmented
        body.take(2 + 32)  # legacy_version, random
        body.vector8()  # legacy_session_id
        body.vector16()  # cipher_suites
        body.vector8()  # legacy_compression_methods
        if body.at == len(body.data):
            return frozenset()  # no extensions at all: no Ed25519 (and no TLS 1.3)
        extensions = _Reader(body.vector16())
        offered: frozenset[int] = frozenset()
        while extensions.at < len(extensions.data):
            kind = extensions.u16()
            data = extensions.vector16()
            if kind == _SIGNATURE_ALGORITHMS:
                schemes = _Reader(data).vector16()
                if len(schemes) % 2:
                    return None
                offered = frozenset(struct.unpack(f">{len(schemes) // 2}H", schemes))
        return offered
    except _Short:
        return None
