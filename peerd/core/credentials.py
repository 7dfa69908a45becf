"""Refresh tokens as the box mints and stores them, pure (standard library only).

A refresh token is 256 random bits, rotated on every use; the box keeps only its SHA-256 (the
store's `clients.refresh_hash`), which is enough for a secret that long. The signed access tokens
are in `peerd/peer/tokens.py`.
"""

from __future__ import annotations

import hashlib
import secrets


def new_refresh_token() -> str:
    return secrets.token_urlsafe(32)


def refresh_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
