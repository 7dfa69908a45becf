"""One asyncio lock per (kind of operation, directory) and event loop: two recoveries in one
checkout, or two merges in one integration worktree, would otherwise race on its index."""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path

__all__ = ["path_lock"]

_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, Path], asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def path_lock(kind: str, path: Path) -> asyncio.Lock:
    """The lock of `kind` (e.g. "merge", "checkout") for the directory `path` in this event loop."""
    locks = _LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault((kind, path.resolve()), asyncio.Lock())
