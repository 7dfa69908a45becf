"""`peerd console` as a real process against a real daemon: the URL and its one-time token,
`--open` without the token in any command line, and what it says when there is no console."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from peerd.config import Config, ConsoleConfig
from peerd.daemon import Daemon
from tests.helpers import running_daemon
from tests.support.console import console_settings


async def peerd(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PEERD_HOME", "PEERD_CONFIG", "BROWSER")}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", "--home", str(home), "console", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**base, **(env or {})},
        check=False,
    )


async def login_status(url: str) -> tuple[int, bool]:
    async with aiohttp.ClientSession() as http, http.get(url, allow_redirects=False) as resp:
        return resp.status, any(c.startswith("peerd_console_") for c in resp.cookies)


async def test_console_prints_a_url_whose_token_works_once(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home", settings=console_settings()) as daemon:
        done = await peerd(daemon.paths.home)
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        assert daemon.console is not None and url.startswith(f"{daemon.console.url}/login?token=")
        assert "works once" in done.stderr
        assert await login_status(url) == (200, True)
        assert await login_status(url) == (401, False)
        as_json = await peerd(daemon.paths.home, "--json")
        data = json.loads(as_json.stdout)
        assert set(data) == {"url", "expiresAt"} and data["url"] != url


async def test_open_hands_the_browser_a_private_page_not_the_token(tmp_path: Path) -> None:
    seen = tmp_path / "browser-argv.json"
    fake = tmp_path / "fake-browser"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(seen)!r}, 'w').write(json.dumps(sys.argv))\n"
    )
    fake.chmod(0o755)
    async with running_daemon(tmp_path / "home", settings=console_settings()) as daemon:
        done = await peerd(daemon.paths.home, "--open", env={"BROWSER": str(fake)})
        assert done.returncode == 0, done.stderr
        url = done.stdout.strip()
        token = url.partition("token=")[2]
        argv = json.loads(seen.read_text())
        assert token not in " ".join(argv), "the token was on a command line"
        page = Path(argv[1].removeprefix("file://"))
        assert page.parent == daemon.paths.home
        assert stat.S_IMODE(page.stat().st_mode) == 0o600
        assert url.replace("&", "&amp;") in page.read_text()


@pytest.mark.slow
async def test_without_a_console_it_says_why_and_a_taken_port_moves_it(tmp_path: Path) -> None:
    off = Config(console=ConsoleConfig(enabled=False))
    async with running_daemon(tmp_path / "off", settings=off) as daemon:
        done = await peerd(daemon.paths.home)
        assert done.returncode == 1
        assert done.stderr.strip() == (
            "error: not_found: The console is off here (console.enabled = false in config.toml)."
        )
        assert daemon.console is not None and daemon.console.url is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = Config(console=ConsoleConfig(listen=f"127.0.0.1:{port}"))
        async with running_daemon(tmp_path / "busy", settings=busy) as started:
            assert isinstance(started, Daemon)
            # The port is taken (another peerd on this machine, say): the console listens on a free
            # one and says so (issue 30); `peerd console` still gives a working link.
            done = await peerd(started.paths.home)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("http://127.0.0.1:") and f":{port}/" not in done.stdout
            assert started.console is not None and started.console.status().state == "moved"
