"""Environment ids: the Syncthing-style id of an Ed25519 public key, standard library only.

`peerd.peer.identity` (the daemon) and `peerd.boot` (which answers `status` before the daemon's
heavy modules are imported) both name an environment by it, so it lives here, with no imports
that cost start-up time.
"""

from __future__ import annotations

import base64
import hashlib

B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648 alphabet, also the Luhn code points
GROUPS, GROUP_LEN = 4, 5


def luhn32(s: str) -> str:
    """Syncthing's ``luhn32`` check character (lib/protocol/luhn.go).

    Not textbook Luhn: the factor starts at 1 on the *first* character. Kept as is so ids can be
    checked with Syncthing's algorithm and its published vectors.
    """
    factor, total = 1, 0
    for ch in s:
        addend = factor * B32.index(ch)
        factor = 1 if factor == 2 else 2
        total += addend // 32 + addend % 32
    return B32[(32 - total % 32) % 32]


def env_id_from_public_key(raw: bytes) -> str:
    """The environment id (``XXXXXX-XXXXXX-XXXXXX-XXXXXX``) of a raw 32-byte Ed25519 public key."""
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    body = base64.b32encode(hashlib.sha256(raw).digest()).decode("ascii")[: GROUPS * GROUP_LEN]
    chunks = (body[i : i + GROUP_LEN] for i in range(0, len(body), GROUP_LEN))
    return "-".join(chunk + luhn32(chunk) for chunk in chunks)
