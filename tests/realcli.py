"""Run the real coder CLIs offline: provider settings that point each one at the fake model.

The CLIs are the pinned npm packages `make clis` installs into `.cache/coder-clis` (`make test`
does it first). When they are missing the tests fail and say why; they never skip silently.
Each setting here is one the offline research found necessary (see the harness notes): isolated
HOME / CODEX_HOME, no telemetry or update checks (which would reach outside hosts), no retries
(a failure is reported at once instead of after minutes of backoff), and for Codex a one-model
catalog so the slug `fake-model` gets real metadata (an unknown slug adds an error item).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from peerd.config import Config, ProviderConfig
from peerd.providers.coders import writable_ancestor
from peerd.runtime import sandbox_profile
from peerd.runtime.sandbox import Mount
from tests.fakemodel import FakeModel

REPO = Path(__file__).resolve().parent.parent
# Resolved: a worktree may share its .cache as a symlink, which a sandbox shows as nothing.
CACHE = (REPO / ".cache").resolve()
CLI_DIR = Path(os.environ.get("PEERD_TEST_CLIS", CACHE / "coder-clis"))
CLIS = ("codex", "claude", "gemini")
CODEX_MODEL = "fake-model"
GEMINI_MODEL = "gemini-2.5-flash"


def cli_binary(name: str) -> Path:
    path = CLI_DIR / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(
            f"The real {name} CLI is not installed at {path}. Run `make clis` (npm install of the pinned "
            "versions in tests/coder-clis); if that failed, its output says why.",
            pytrace=False,
        )
    return path


def codex_catalog(scratch: Path) -> Path:
    """Codex's bundled catalog entry for gpt-5.5, as the slug `fake-model`, without tool search
    (so MCP tools are offered directly). Built once per CLI install."""
    path = CLI_DIR / "fake-model-catalog.json"
    if path.exists():
        return path
    home = scratch / "catalog-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / "codex")}
    out = subprocess.run(  # the pinned codex binary
        [str(cli_binary("codex")), "debug", "models", "--bundled"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    models = json.loads(out)["models"]
    entry = next(m for m in models if m["slug"] == "gpt-5.5")
    entry.update(slug=CODEX_MODEL, display_name=CODEX_MODEL, supports_search_tool=False)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"models": [entry]}))
    tmp.replace(path)
    return path


def offline_settings(scratch: Path, fake: FakeModel, **extra: ProviderConfig) -> Config:
    """Provider settings that run the three real CLIs against `fake`, each with its own HOME."""
    scratch.mkdir(parents=True, exist_ok=True)
    homes = {name: scratch / f"{name}-home" for name in CLIS}
    for home in homes.values():
        home.mkdir(exist_ok=True)
    (homes["codex"] / "codex").mkdir(exist_ok=True)
    gemini_settings = {
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 1},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    }
    (homes["gemini"] / ".gemini").mkdir(exist_ok=True)
    (homes["gemini"] / ".gemini" / "settings.json").write_text(json.dumps(gemini_settings))
    mock = (
        f'model_providers.mock={{name="mock", base_url="{fake.base_url}/v1", wire_api="responses", '
        'env_key="MOCK_API_KEY", request_max_retries=0, stream_max_retries=0}'
    )
    providers = {
        "codex": ProviderConfig(
            binary=str(cli_binary("codex")),
            model=CODEX_MODEL,
            args=[
                "-c",
                "model_provider=mock",
                "-c",
                mock,
                "-c",
                f'model_catalog_json="{codex_catalog(scratch)}"',
                "-c",
                "analytics.enabled=false",
                "--disable",
                "plugins",
                "--disable",
                "unbounded_connection_retries",
            ],
            env={
                "HOME": str(homes["codex"]),
                "CODEX_HOME": str(homes["codex"] / "codex"),
                "MOCK_API_KEY": "fake-offline-key",
            },
        ),
        "claude": ProviderConfig(
            binary=str(cli_binary("claude")),
            env={
                "HOME": str(homes["claude"]),
                "ANTHROPIC_BASE_URL": fake.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-fake-offline-key",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
            },
        ),
        "gemini": ProviderConfig(
            binary=str(cli_binary("gemini")),
            model=GEMINI_MODEL,
            env={
                "HOME": str(homes["gemini"]),
                "GOOGLE_GEMINI_BASE_URL": fake.base_url,
                "GEMINI_API_KEY": "fake-offline-key",
            },
        ),
    }
    providers.update(extra)
    return Config(providers=providers)


def secure_base() -> Path:
    """The repository's .cache when no directory above it is writable by others, else one in the
    user's own cache directory (a clone under /tmp, as CI may make, is below such a directory)."""
    for base in (CACHE / "test-homes", Path.home() / ".cache" / "peerd-test-homes"):
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        if writable_ancestor(base / "x") is None:
            return base
    pytest.fail("No directory without group/other write access above it for the test homes.", pytrace=False)


@contextmanager
def secure_dir() -> Iterator[Path]:
    """A private directory whose ancestors only their owners can write (unlike /tmp): Gemini CLI
    ignores a settings file below a directory others can write, and peerd gives it one per run."""
    path = Path(tempfile.mkdtemp(dir=secure_base(), prefix="h"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


SIGNALS = CACHE / "test-signals"


def signal_base() -> Path:
    """Where tests put files a linked machine's confined run waits for: a test fixture the suite
    makes readable in every sandbox (tests/conftest.py), wherever the clone lives. Others may enter
    it: a run has a uid of its own when peerd runs as root."""
    SIGNALS.mkdir(parents=True, exist_ok=True)
    SIGNALS.chmod(0o755)
    return SIGNALS


@contextmanager
def signal_dir() -> Iterator[Path]:
    """A fresh directory for files a confined (linked) run waits for (see `signal_base`)."""
    path = Path(tempfile.mkdtemp(dir=signal_base(), prefix="s"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sandbox_binds() -> tuple[Mount, ...]:
    """What the run manager's profile binds for every confined run (peerd's Python and the
    directories `PEERD_SANDBOX_READABLE` names), for tests that build a `Confinement` themselves."""
    return (
        *(Mount(p) for p in sandbox_profile.python_dirs()),
        *(Mount(p, optional=True) for p in sandbox_profile.extra_readable()),
    )


def system_view() -> dict[str, Any]:
    """The system part of every confined run's profile (deny by default: nothing else of `/`),
    for tests that build a `Confinement` themselves: `Confinement(..., **system_view())`."""
    found = sandbox_profile.system_mounts()
    return {"system": found.mounts, "symlinks": found.symlinks}


def fake_marker(name: str) -> str:
    """The marker that picks the fake model's script `name` for a conversation."""
    return f"[[fake:{name}]]"
