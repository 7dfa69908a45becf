"""An Ed25519 public key from its private seed, with the standard library only (RFC 8032, 5.1.5).

Used by `peerd serve`'s early start (peerd/boot.py:light_identity) to check that the identity's
certificate is over its key before `cryptography` is imported (importing it is tens of ms of the
300 ms `status` budget). Only the public key is computed, once, at start-up: nothing is signed or
verified here (signatures are `cryptography`'s, in peer/identity.py). Checked against
`cryptography` in tests/unit/test_ed25519.py. The arithmetic is not constant-time: it runs once per
daemon start, on this machine, with nothing an observer can repeat or time (a signing or
verifying path must never use it).
"""

from __future__ import annotations

import hashlib

_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_Point = tuple[int, int, int, int]  # extended homogeneous coordinates (X, Y, Z, T)


def _recover_x(y: int, sign: int) -> int:
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    return _P - x if (x & 1) != sign else x


_BY = 4 * pow(5, _P - 2, _P) % _P
_BX = _recover_x(_BY, 0)
_BASE: _Point = (_BX, _BY, 1, _BX * _BY % _P)


def _add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _times_base(scalar: int) -> _Point:
    result: _Point = (0, 1, 1, 0)
    point = _BASE
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def public_key(seed: bytes) -> bytes:
    """The 32-byte public key of a 32-byte Ed25519 private key (its seed)."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 private key is 32 bytes")
    digest = hashlib.sha512(seed).digest()
    scalar = int.from_bytes(digest[:32], "little")
    scalar = (scalar & ((1 << 254) - 8)) | (1 << 254)
    x, y, z, _ = _times_base(scalar)
    z_inv = pow(z, _P - 2, _P)
    x, y = x * z_inv % _P, y * z_inv % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")
