"""Made-up facts for `peerd doctor`'s checks: a home, its files, a daemon up or down, links and
providers as the daemon would report them."""

from __future__ import annotations

from typing import Any

from peerd import contracts as c
from peerd.doctor import CertFacts, DaemonFacts, Facts, FileFacts

UID, USER = 1000, "me"
NOW = 1_800_000_000.0
DAY = 86_400.0
HOME = "/h"
FP = "sha256:" + "ab" * 32
OTHER_FP = "sha256:" + "cd" * 32


def ff(
    path: str, kind: Any, mode: int, *, uid: int = UID, owner: str = USER, error: str | None = None
) -> FileFacts:
    return FileFacts(path, kind, mode, uid, owner, error)


def status(*, listeners: list[c.Listener] | None = None, version: str = "0.1.0") -> c.Status:
    return c.Status(
        env_id="AAAAAA-BBBBBB-CCCCCC-DDDDDD",
        label="laptop",
        version=version,
        fingerprint=FP,
        listeners=listeners
        if listeners is not None
        else [
            c.Listener(kind="unix", address=f"{HOME}/peerd.sock", tls=False),
            c.Listener(kind="tcp", address="https://100.64.0.1:7433", tls=True),
        ],
        counts=c.StatusCounts(projects=0, threads=0, live_runs=0),
        home=HOME,
    )


def link(**kw: Any) -> c.LinkInfo:
    fields: dict[str, Any] = {
        "env_id": "EEEEEE-FFFFFF-GGGGGG-HHHHHH",
        "label": "box",
        "urls": ["https://box:7433"],
        "access": "auto",
        "fingerprint": OTHER_FP,
        "status": "reachable",
        "linked_at": NOW - DAY,
        "last_reached_at": NOW,
        "last_error": None,
        "expires_at": NOW + 30 * DAY,
    }
    return c.LinkInfo(**{**fields, **kw})


def provider(**kw: Any) -> c.ProviderInfo:
    fields: dict[str, Any] = {
        "name": "codex",
        "kind": "codex",
        "binary": "codex",
        "path": "/usr/bin/codex",
        "found": True,
        "version": "codex-cli 0.171.0",
        "model": None,
    }
    return c.ProviderInfo(**{**fields, **kw})


def up(**kw: Any) -> DaemonFacts:
    fields: dict[str, Any] = {
        "status": status(),
        "answered": True,
        "links": [link()],
        "providers": [
            provider(),
            provider(name="script", kind="script", binary=None, path=None, version="built in"),
        ],
    }
    return DaemonFacts(**{**fields, **kw})


DOWN = DaemonFacts(None, f"peerd is not running (no daemon answers at {HOME}/peerd.sock).")


def facts(**kw: Any) -> Facts:
    fields: dict[str, Any] = {
        "home": HOME,
        "uid": UID,
        "user": USER,
        "now": NOW,
        "cli_version": "0.1.0",
        "config_path": "/cfg/peerd/config.toml",
        "home_dir": ff(HOME, "dir", 0o700),
        "socket": ff(f"{HOME}/peerd.sock", "socket", 0o600),
        "socket_dir": None,
        "db_files": [ff(f"{HOME}/peerd.db", "file", 0o600)],
        "identity_dir": ff(f"{HOME}/identity", "dir", 0o700),
        "identity_key": ff(f"{HOME}/identity/key.pem", "file", 0o600),
        "key_error": None,
        "certificate": CertFacts(
            f"{HOME}/identity/cert.pem",
            exists=True,
            not_before=NOW - DAY,
            not_after=NOW + 7000 * DAY,
            fingerprint=FP,
            for_key=True,
        ),
        "daemon": up(),
        "git_version": "git version 2.39.5",
        "git_path": "/usr/bin/git",
    }
    return Facts(**{**fields, **kw})
