"""The identity's files read with the standard library only: the key's public half (computed by
`core/ed25519.py`) and the certificate's DER, when the files are exactly what
`peer/identity.py:load_or_create_identity` writes (an unencrypted PKCS8 Ed25519 key, a certificate
over that key). `peerd serve`'s early `status` (`boot.py`) and a daemon without a network listener
(`peer/identity.py`, issue 33: no `cryptography` at idle) read the identity this way; anything
else is left to the full reading, which rebuilds what it must."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from peerd.core.ed25519 import public_key

SPKI_ED25519 = bytes.fromhex("302a300506032b6570032100")  # SubjectPublicKeyInfo prefix of a raw key
PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")  # PKCS8 prefix of a 32-byte seed


@dataclass(frozen=True)
class IdentityFiles:
    public_key_raw: bytes
    cert_der: bytes


def pem_der(text: str, label: str) -> bytes | None:
    begin, end = f"-----BEGIN {label}-----", f"-----END {label}-----"
    if text.count(begin) != 1 or end not in text:
        return None
    body = text.split(begin, 1)[1].split(end, 1)[0]
    try:
        return base64.b64decode("".join(body.split()), validate=True)
    except ValueError:
        return None


def read_identity_files(key_path: Path, cert_path: Path) -> IdentityFiles | None:
    """The public key and the certificate, or None when either file is missing or not exactly
    what peerd writes (the full reading then handles them)."""
    try:
        key_der = pem_der(key_path.read_text(encoding="ascii"), "PRIVATE KEY")
        cert_der = pem_der(cert_path.read_text(encoding="ascii"), "CERTIFICATE")
    except (OSError, UnicodeDecodeError):
        return None
    if key_der is None or cert_der is None or len(key_der) != 48 or not key_der.startswith(PKCS8_ED25519):
        return None
    raw = public_key(key_der[16:])
    if cert_der.count(SPKI_ED25519 + raw) != 1:
        return None  # a certificate for another key: rebuilt by the full reading
    return IdentityFiles(public_key_raw=raw, cert_der=cert_der)
