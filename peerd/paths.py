"""Where an environment keeps its files: `--home`, else `PEERD_HOME`, else the XDG data dir; and
which config file it reads (`config_file`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


def config_file(env: Mapping[str, str] | None = None, *, home: Path | None = None) -> Path:
    """The config file to read: PEERD_CONFIG; else `<home>/config.toml` for a home named by
    `--home` (pass it as `home`) or PEERD_HOME, so environments side by side never share one;
    else the default home's XDG config file, `$XDG_CONFIG_HOME/peerd/config.toml`."""
    env = os.environ if env is None else env
    if explicit := env.get("PEERD_CONFIG"):
        return Path(explicit).expanduser()
    if home is None and env.get("PEERD_HOME"):
        home = Path(env["PEERD_HOME"]).expanduser().resolve()
    if home is not None:
        return home / "config.toml"
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "peerd" / "config.toml"


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
        import hashlib  # noqa: PLC0415  # only here: every CLI command imports this module
        import tempfile  # noqa: PLC0415  # (tempfile pulls in shutil, random, bz2, lzma)

        digest = hashlib.sha256(os.fsencode(self.home)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"peerd-{os.getuid()}" / f"{digest}{suffix}.sock"
