"""The real `peerd` command line as a subprocess (`peerd`, through a thread so the daemon in this
event loop keeps serving), and what a test checks of its answer (`ok`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from peerd.cli.common import EXIT_OK
from peerd.daemon import Daemon

CLI_TIMEOUT_S = 90.0


async def peerd(home: Path, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), *args]
    return await asyncio.to_thread(
        subprocess.run,
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == EXIT_OK, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


def home_of(daemon: Daemon) -> Path:
    return daemon.paths.home
