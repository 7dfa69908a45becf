"""Object ids: a short type prefix and 80 random bits, readable in logs and CLIs."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
