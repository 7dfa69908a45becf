"""The real, pinned Codex CLI and Claude Code sign in to a daemon's `/mcp` (issue 29).

`codex mcp add peerd --url` and `claude mcp login --no-browser peerd` find the OAuth server
themselves and print the authorization URL; the test plays the person: it opens the page, types the
agent pairing code and hands the redirect back (to Codex's own callback server; to Claude Code by
pasting it, as a person over SSH does). The CLI then exchanges the code at `/oauth/token` (PKCE,
resource) and exits 0, and the box lists a client of kind `agent`.

Both sign in with a client ID metadata document (`https://chatgpt.com/oauth/codex/client.json`,
`https://claude.ai/oauth/claude-code-client-metadata`). This machine has no internet, so the fetch
is replaced by a stand-in document naming loopback callbacks (the fetch itself, and its SSRF guards,
are tested in test_client_metadata.py and test_agent_signin.py); everything else is the real CLI
against the real daemon."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api import client_metadata
from peerd.daemon import Daemon
from tests.helpers import client_for, running_daemon
from tests.realcli import cli_binary
from tests.support.signin import Person

pytestmark = pytest.mark.slow
NAMES = {
    "https://chatgpt.com/oauth/codex/client.json": "Codex",
    "https://claude.ai/oauth/claude-code-client-metadata": "Claude Code",
}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


async def stand_in(_: client_metadata.MetadataFetcher, url: str) -> dict[str, Any]:
    loopback = ["http://127.0.0.1/callback", "http://localhost/callback"]
    return {"client_id": url, "client_name": NAMES[url], "redirect_uris": loopback}


async def agent_code(daemon: Daemon) -> str:
    async with client_for(daemon.paths.home) as owner:
        data = await owner.call("POST", "/v1/pair", body={"access": "read-only", "purpose": "agent"})
    return str(data["code"])


async def signed_in(daemon: Daemon) -> list[tuple[str, str, str]]:
    async with client_for(daemon.paths.home) as owner:
        items = (await owner.call("GET", "/v1/clients"))["items"]
    return [(c["agentName"], c["access"], c["status"]) for c in items if c["kind"] == "agent"]


async def test_the_real_codex_cli_signs_in_with_a_pairing_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_metadata.MetadataFetcher, "fetch", stand_in)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    env = {**os.environ, "HOME": str(tmp_path), "CODEX_HOME": str(codex_home), "BROWSER": "true"}
    async with running_daemon(tmp_path / "peerd", tls=False) as daemon:
        url = daemon.advertised_urls()[0].rstrip("/") + "/mcp"
        async with client_for(daemon.paths.home) as owner:
            code = (await owner.call("POST", "/v1/pair", body={"access": "read-only", "purpose": "agent"}))[
                "code"
            ]
        codex = await asyncio.create_subprocess_exec(
            str(cli_binary("codex")), "mcp", "add", "peerd", "--url", url,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert codex.stdout is not None
        try:
            said: list[str] = []
            while not any("/oauth/authorize?" in line for line in said):
                line = (await asyncio.wait_for(codex.stdout.readline(), 30)).decode()
                assert line, f"codex ended before it printed an authorization URL: {said}"
                said.append(line.strip())
            authorization = next(line for line in said if "/oauth/authorize?" in line)
            assert "code_challenge_method=S256" in authorization
            async with Person(daemon) as person:
                approved = await person.approve(authorization, code)
            assert approved.status == 303
            async with aiohttp.ClientSession() as http, http.get(approved.headers["Location"]) as back:
                assert back.status == 200  # Codex's own callback server took the code
            rest = (await asyncio.wait_for(codex.stdout.read(), 60)).decode()
            assert await asyncio.wait_for(codex.wait(), 30) == 0, rest
        finally:
            if codex.returncode is None:
                codex.kill()
                await codex.wait()
        assert await signed_in(daemon) == [("Codex", "read-only", "active")]


def read_for(fd: int, seconds: float, until: str) -> str:
    """What the terminal shows within `seconds`, or until `until` appears (escape codes removed)."""
    out, end = "", time.monotonic() + seconds
    while time.monotonic() < end and until not in out:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            out += ANSI.sub("", chunk.decode(errors="replace"))
    return out


async def test_the_real_claude_code_signs_in_with_a_pairing_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_metadata.MetadataFetcher, "fetch", stand_in)
    claude = str(cli_binary("claude"))
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
        "TERM": "xterm",
    }
    async with running_daemon(tmp_path / "peerd", tls=False) as daemon:
        url = daemon.advertised_urls()[0].rstrip("/") + "/mcp"
        added = await asyncio.to_thread(
            subprocess.run, [claude, "mcp", "add", "--transport", "http", "-s", "user", "peerd", url],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr
        code = await agent_code(daemon)
        # `mcp login` wants a terminal (it asks for the redirect URL); a wide one, so the URL is one line.
        terminal, far = pty.openpty()
        fcntl.ioctl(far, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 2000, 0, 0))
        login = subprocess.Popen(
            [claude, "mcp", "login", "--no-browser", "peerd"],
            env=env, cwd=tmp_path, stdin=far, stdout=far, stderr=far, close_fds=True,
        )  # fmt: skip
        os.close(far)
        try:
            shown = await asyncio.to_thread(read_for, terminal, 60, "redirect URL here")
            found = re.search(r"(http://\S+/oauth/authorize\?\S+)", shown)
            assert found is not None, shown
            async with Person(daemon) as person:
                approved = await person.approve(found.group(1), code)
            assert approved.status == 303
            os.write(terminal, (approved.headers["Location"] + "\r").encode())
            said = await asyncio.to_thread(read_for, terminal, 60, "Authenticated")
            assert "Authenticated" in said, said
            assert await asyncio.to_thread(login.wait, 30) == 0
        finally:
            if login.poll() is None:
                login.kill()
                login.wait()
            os.close(terminal)
        assert await signed_in(daemon) == [("Claude Code", "read-only", "active")]
