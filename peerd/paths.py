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
        """The owner's socket: `<home>/peerd.sock`, or a short per-home path in the temp dir when
        that is too long. No run ever sees it (see `agent_socket`)."""
        return self._socket("peerd.sock", "")

    @property
    def agent_socket(self) -> Path:
        """The agents' socket: `<home>/agent.sock` (same fallback). It serves only the agent tools,
        and only to a live run's token; it is the one socket a run is given."""
        return self._socket("agent.sock", "-agent")

    def _socket(self, name: str, suffix: str) -> Path:
        direct = self.home / name
        if len(os.fsencode(direct)) <= MAX_SOCKET_PATH:
            return direct
        digest = hashlib.sha256(os.fsencode(self.home)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"peerd-{os.getuid()}" / f"{digest}{suffix}.sock"
