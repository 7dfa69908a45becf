"""Environment ids: the Syncthing-style id of an Ed25519 public key, standard library only.

`peerd.peer.identity` (the daemon) and `peerd.boot` (which answers `status` before the daemon's
heavy modules are imported) both name an environment by it, so it lives here, with no imports
that cost start-up time. `normalize_env_id` reads one back as a person typed it (the pairing
code, `--env`, the forwarder).
"""

from __future__ import annotations

import base64
import hashlib

from peerd.errors import InvalidRequest

B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648 alphabet, also the Luhn code points
GROUPS, GROUP_LEN = 4, 5
ENV_ID_LEN = GROUPS * (GROUP_LEN + 1)  # 24 significant characters, dashes not counted
_TYPOS = str.maketrans({"0": "O", "1": "I", "8": "B"})  # Syncthing's untypeoify


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


def normalize_env_id(text: str) -> str:
    """Canonical form of a typed environment id, or ``InvalidRequest`` saying what is wrong.

    Accepts any case, missing or misplaced dashes and spaces, and the typos 0->O, 1->I, 8->B
    (base32 has none of 0, 1, 8). Every group's check character must be right.
    """
    example = "e.g. ABCDEF-GHIJKL-MNOPQR-STUVWX"
    compact = "".join(text.split()).replace("-", "").upper().translate(_TYPOS)
    if not compact:
        raise InvalidRequest(f"environment id is empty; expected 4 groups of 6 characters, {example}")
    bad = sorted({ch for ch in compact if ch not in B32})
    if bad:
        shown = ", ".join(repr(ch) for ch in bad)
        raise InvalidRequest(
            f"environment id {text.strip()!r} contains {shown}; only letters A-Z and digits 2-7 are used"
        )
    if len(compact) != ENV_ID_LEN:
        raise InvalidRequest(
            f"environment id {text.strip()!r} has {len(compact)} characters without dashes; "
            f"expected {ENV_ID_LEN} (4 groups of 6, {example})"
        )
    groups = [compact[i : i + GROUP_LEN + 1] for i in range(0, ENV_ID_LEN, GROUP_LEN + 1)]
    for n, group in enumerate(groups, start=1):
        if luhn32(group[:-1]) != group[-1]:
            raise InvalidRequest(
                f"environment id {text.strip()!r}: group {n} ({group}) fails its check character, "
                "so a character in it was mistyped; copy the id again from the other machine"
            )
    return "-".join(groups)
