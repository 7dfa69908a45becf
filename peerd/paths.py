"""Where an environment keeps its files: `--home`, else `PEERD_HOME`, else the XDG data dir."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# sun_path is 108 bytes on Linux; keep a margin for the NUL and odd platforms.
MAX_SOCKET_PATH = 100


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("PEERD_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(xdg) / "peerd").resolve()


@dataclass(frozen=True)
class Paths:
    home: Path

    @property
    def db(self) -> Path:
        return self.home / "peerd.db"

    @property
    def lock(self) -> Path:
        return self.home / "peerd.lock"

    @property
    def worktrees(self) -> Path:
        return self.home / "worktrees"

    @property
    def provider_state(self) -> Path:
        return self.home / "providers"

    @property
    def socket(self) -> Path:
        """`<home>/peerd.sock`, or a short per-home path in the temp dir when that is too long."""
        direct = self.home / "peerd.sock"
        if len(os.fsencode(direct)) <= MAX_SOCKET_PATH:
            return direct
        digest = hashlib.sha256(os.fsencode(self.home)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"peerd-{os.getuid()}" / f"{digest}.sock"
