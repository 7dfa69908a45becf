"""The pairing code: one string that carries what a laptop needs to link to a box, pure.

    peerd-pair:<base64url(JSON)>   JSON = {"v": 1, "i": code id, "s": secret,
                                           "e": box environment id, "f": sha256 cert fingerprint (hex),
                                           "u": [box addresses], "a": access ceiling}

The code id names the stored code (so wrong guesses can be counted per code); the secret is 128
random bits and is stored on the box only as a SHA-256 hash. The fingerprint pins the box's TLS
certificate: the laptop never trusts a CA and sends nothing secret to another key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass

from peerd.core.access import AccessLevel, parse_access
from peerd.core.envid import normalize_env_id
from peerd.errors import InvalidRequest

PREFIX = "peerd-pair:"
VERSION = 1
SECRET_BYTES = 16  # 128 bits


@dataclass(frozen=True)
class PairingCode:
    code_id: str
    secret: str
    env_id: str
    fingerprint: bytes
    urls: tuple[str, ...]
    access: AccessLevel

    def encode(self) -> str:
        body = {
            "v": VERSION,
            "i": self.code_id,
            "s": self.secret,
            "e": self.env_id,
            "f": self.fingerprint.hex(),
            "u": list(self.urls),
            "a": self.access,
        }
        raw = json.dumps(body, separators=(",", ":")).encode()
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def __repr__(self) -> str:  # the secret never reaches a log through repr()
        return f"PairingCode(code_id={self.code_id!r}, env_id={self.env_id!r}, urls={self.urls!r})"


def new_secret() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).decode().rstrip("=")


def new_code_id() -> str:
    return secrets.token_hex(6)


def secret_hash(secret: str) -> str:
    """128 random bits need no slow hash: SHA-256 is enough to make the stored value useless."""
    return hashlib.sha256(secret.encode()).hexdigest()


def decode(text: str) -> PairingCode:
    """Parse a pasted code; whitespace and line breaks from copying are ignored."""
    compact = "".join(text.split())
    if not compact.startswith(PREFIX):
        raise InvalidRequest(
            "This is not a peerd pairing code (it should start with 'peerd-pair:'). "
            "Run `peerd pair` on the machine to link to, and copy the whole line it prints."
        )
    payload = compact[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError):
        raise InvalidRequest("The pairing code is damaged; copy the whole line again.") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise InvalidRequest(
            "This pairing code comes from a peerd version this one does not understand; update both."
        )
    try:
        code_id, secret, env_id = str(body["i"]), str(body["s"]), str(body["e"])
        fingerprint = bytes.fromhex(str(body["f"]))
        urls = tuple(str(u) for u in body["u"])
        access = parse_access(str(body["a"]))
    except (KeyError, TypeError, ValueError, InvalidRequest):
        raise InvalidRequest("The pairing code is damaged; copy the whole line again.") from None
    if len(fingerprint) != 32 or not urls or not code_id or len(secret) < 22:
        raise InvalidRequest("The pairing code is damaged; copy the whole line again.")
    try:
        env_id = normalize_env_id(env_id)
    except InvalidRequest:
        raise InvalidRequest("The pairing code is damaged; copy the whole line again.") from None
    return PairingCode(code_id, secret, env_id, fingerprint, urls, access)
