from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from peerd.runtime.sandbox_profile import READABLE_ENV
from tests.helpers import client_for, make_repo, running_daemon
from tests.realcli import CLI_DIR, REPO, SIGNALS
from tests.support import transport_trace


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp_path / "home") as d:
        yield d


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[LocalClient]:
    async with client_for(daemon.paths.home) as c:
        yield c


@pytest.fixture
async def project(client: LocalClient, repo: Path) -> dict[str, object]:
    data: dict[str, object] = await client.call("POST", "/v1/projects", body={"path": str(repo)})
    return data


@pytest.fixture(autouse=True, scope="session")
def _repository_readable_in_sandboxes() -> None:
    """A clone under /tmp (as CI may make) is hidden by the sandbox's private /tmp: its test
    fixtures (scripts, the pinned CLIs) stay readable to confined runs, as they are from a clone
    elsewhere. Only those: the test homes in `.cache/test-homes` stay out of sight (deny by
    default is what the security tests check)."""
    fixtures = [REPO / "tests", REPO / "examples", CLI_DIR, SIGNALS]
    os.environ[READABLE_ENV] = ":".join(str(p) for p in fixtures)


def pytest_configure(config: pytest.Config) -> None:
    # Run in the background (`make test &`, nohup), this process ignores SIGINT and SIGQUIT, and
    # every CLI subprocess the tests start would inherit that: the Ctrl-C tests would fail. The
    # daemon restores them for its runs itself (runtime/process.with_default_signals).
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, handler)
    if os.environ.get(transport_trace.ENV):  # where an "unclosed transport" warning's transport was made
        transport_trace.install()
        config.pluginmanager.register(transport_trace, "peerd-transport-trace")
