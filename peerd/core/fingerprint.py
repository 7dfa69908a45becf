"""TLS certificate fingerprints as people and the store write them, pure (standard library only).

A peer is pinned by the sha256 of its certificate's DER; it is shown and stored as
``sha256:<64 lowercase hex>`` and read back from that or from 64 hex digits with or without colons.
"""

from __future__ import annotations

import re

_FP_PREFIX = "sha256:"


def format_fingerprint(fp: bytes) -> str:
    """``"sha256:"`` + lowercase hex of a 32-byte sha256 digest."""
    if len(fp) != 32:
        raise ValueError(f"a sha256 fingerprint is 32 bytes, got {len(fp)}")
    return _FP_PREFIX + fp.hex()


def parse_fingerprint(text: str) -> bytes:
    """The 32 digest bytes of ``sha256:<64 hex>``, or plain 64 hex with or without colons."""
    s = text.strip()
    algo = re.match(r"([A-Za-z0-9-]+):", s)
    if algo and len(algo.group(1)) != 2:  # a two-character head is a hex byte pair, not a name
        if algo.group(1).lower() != "sha256":
            raise ValueError(f"fingerprint {s!r}: only sha256 is supported, not {algo.group(1)!r}")
        s = s[algo.end() :]
    digits = s.replace(":", "")
    if len(digits) != 64 or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
        raise ValueError(
            f"fingerprint {text.strip()!r} is not a sha256 fingerprint; expected 'sha256:' followed by "
            "64 hex characters (colons between byte pairs are allowed)"
        )
    return bytes.fromhex(digits)
