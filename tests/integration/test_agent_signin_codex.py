"""The real, pinned Codex CLI signs in to a daemon's `/mcp` (issue 29): `codex mcp add peerd --url`
finds the OAuth server itself, prints the authorization URL, and the test plays the person: it opens
the page, types the agent pairing code and follows the redirect to Codex's own callback server;
Codex then exchanges the code at `/oauth/token` (PKCE, resource) and exits 0.

Codex signs in with a client ID metadata document, `https://chatgpt.com/oauth/codex/client.json`.
This machine has no internet, so the fetch is replaced by a stand-in document naming loopback
callbacks (the fetch itself, and its SSRF guards, are tested in test_client_metadata.py and
test_agent_signin.py); everything else is the real CLI against the real daemon."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.api import client_metadata
from tests.helpers import client_for, running_daemon
from tests.realcli import cli_binary
from tests.support.signin import Person

pytestmark = pytest.mark.slow
CODEX_CLIENT = "https://chatgpt.com/oauth/codex/client.json"


async def stand_in(_: client_metadata.MetadataFetcher, url: str) -> dict[str, Any]:
    assert url == CODEX_CLIENT
    return {"client_id": url, "client_name": "Codex", "redirect_uris": ["http://127.0.0.1/callback"]}


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
        async with client_for(daemon.paths.home) as owner:
            signed_in = [c for c in (await owner.call("GET", "/v1/clients"))["items"] if c["kind"] == "agent"]
    assert [(c["agentName"], c["access"], c["status"]) for c in signed_in] == [
        ("Codex", "read-only", "active")
    ]
