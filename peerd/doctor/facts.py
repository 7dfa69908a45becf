"""What `peerd doctor` looks at, gathered beforehand, and what each check says (`Check`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from peerd import contracts as c
from peerd.store.health import StoreHealth

CheckStatus = Literal["ok", "warn", "fail", "skip"]
FileKind = Literal["dir", "file", "socket", "other", "missing"]

CERT_WARN_DAYS = 30
TOKEN_WARN_DAYS = 7
DAY_S = 86_400.0

INSTALL = {
    "codex": "the Codex CLI (`npm install -g @openai/codex`)",
    "claude": "Claude Code (`npm install -g @anthropic-ai/claude-code`)",
    "gemini": "the Gemini CLI (`npm install -g @google/gemini-cli`)",
}
LABELS: dict[CheckStatus, str] = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None
    table: tuple[str, ...] = ()  # lines shown below the check (what a confined run sees)

    def wire(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
        }
        if self.table:
            found["table"] = list(self.table)
        return found


@dataclass(frozen=True)
class FileFacts:
    """One path as `stat` saw it (following symlinks)."""

    path: str
    kind: FileKind
    mode: int = 0  # permission bits (S_IMODE)
    uid: int = -1
    owner: str = ""  # the owner's user name, else the uid as text
    error: str | None = None  # why it could not be looked at (kind is then "other")


@dataclass(frozen=True)
class CertFacts:
    path: str
    exists: bool
    error: str | None = None  # why it does not load
    not_before: float | None = None
    not_after: float | None = None
    fingerprint: str | None = None  # "sha256:<hex>" of the DER, as `peerd status` shows it
    for_key: bool | None = None  # made for identity/key.pem? None when the key cannot be read


@dataclass(frozen=True)
class DaemonFacts:
    """What the daemon answered on the socket, or why it did not."""

    status: c.Status | None  # /v1/status; None when it did not answer
    error: str | None = None
    answered: bool = False  # something answered on the socket (with an error, if no status)
    links: Sequence[c.LinkInfo] | None = None
    links_error: str | None = None
    providers: Sequence[c.ProviderInfo] | None = None
    providers_error: str | None = None


@dataclass(frozen=True)
class ConfinementFacts:
    works: bool
    detail: str  # what the probe found: the binary that works, or why none does
    allow_unconfined: bool = False  # links.allow_unconfined in the config file
    etc_left_out: tuple[str, ...] = ()  # what of this machine's /etc a confined run does not see
    readable: tuple[str, ...] = ()  # the owner's additions (PEERD_SANDBOX_READABLE)
    run_as: int | None = None  # the uid a confined run runs as, when peerd runs as root


@dataclass(frozen=True)
class Facts:
    home: str
    uid: int
    user: str
    now: float
    cli_version: str
    config_path: str  # the default config file, for fixes that edit it
    home_dir: FileFacts
    socket: FileFacts
    socket_dir: FileFacts | None  # the fallback dir in the temp dir, when the socket is not in the home
    db_files: Sequence[FileFacts]  # peerd.db, then -wal and -shm where they exist
    identity_dir: FileFacts
    identity_key: FileFacts
    key_error: str | None  # the key exists but does not load as an Ed25519 PEM key
    certificate: CertFacts
    daemon: DaemonFacts
    git_version: str | None = None  # what `git --version` printed
    git_path: str | None = None
    git_error: str | None = None
    # peerd's sandbox (runtime/sandbox.py): does bwrap work here, and does the config let a link's
    # runs go on without it. None: not looked at.
    confinement: ConfinementFacts | None = None
    # `PRAGMA quick_check` and friends on peerd.db (store/health.py). None: not looked at.
    store: StoreHealth | None = None

    @property
    def status(self) -> c.Status | None:
        return self.daemon.status

    @property
    def daemon_up(self) -> bool:
        return self.daemon.status is not None
