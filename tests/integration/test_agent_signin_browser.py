"""The sign-in page in a real browser (Debian's Chromium through Playwright, as tests/console does):
a person types the agent pairing code and the browser lands on the agent's redirect URI with the
code, under the page's strict CSP (its form action and the 303 after it are allowed, nothing else
runs). On the plain loopback listener, and on the TLS listener, where the browser gets the web
certificate (ECDSA; Chromium takes no Ed25519 server certificate) while agents and links on the same
port keep getting the identity one (docs/security.md, "Two certificates")."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import async_playwright

from tests.helpers import client_for, running_daemon
from tests.support.signin import Agent, pkce

pytestmark = pytest.mark.slow


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    path = os.environ.get("PEERD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "These tests need Chromium: apt-get install -y chromium (or make chromium)", pytrace=False
        )
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=path)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def callback() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """The agent's loopback redirect URI, and what reached it."""
    seen: list[dict[str, str]] = []

    async def land(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        return web.Response(text="signed in; you may close this page", content_type="text/html")

    app = web.Application()
    app.router.add_get("/callback", land)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/callback", seen
    finally:
        await runner.cleanup()


async def test_a_person_signs_an_agent_in_from_a_real_browser(
    tmp_path: Path, browser: Any, callback: tuple[str, list[dict[str, str]]]
) -> None:
    redirect, seen = callback
    async with (
        running_daemon(tmp_path / "home", tls=False) as daemon,
        Agent(daemon, redirect_uri=redirect) as agent,
    ):
        await agent.register(name="browser-agent")
        async with client_for(daemon.paths.home) as owner:
            code = (await owner.call("POST", "/v1/pair", body={"access": "read-only", "purpose": "agent"}))[
                "code"
            ]
        verifier, challenge = pkce()
        page = await browser.new_page()
        problems: list[str] = []
        page.on("console", lambda msg: problems.append(msg.text) if "Refused" in msg.text else None)
        await page.goto(agent.authorize_url(challenge, state="s t/ate"))
        assert "browser-agent" in await page.inner_text("body")
        await page.fill("input[name=pairing_code]", code)
        await page.click("button[type=submit]")
        await page.wait_for_url(redirect + "?*")
        await page.close()
        assert problems == []  # no CSP violation (the form and its 303 are allowed)
        (back,) = seen
        assert back["state"] == "s t/ate" and back["iss"] == agent.base + "/"
        status, tokens = await agent.exchange(back["code"], verifier)
        assert status == 200 and tokens["scope"] == "read-only", tokens


async def test_a_wrong_code_in_the_browser_stays_on_the_page(
    tmp_path: Path, browser: Any, callback: tuple[str, list[dict[str, str]]]
) -> None:
    redirect, seen = callback
    async with (
        running_daemon(tmp_path / "home", tls=False) as daemon,
        Agent(daemon, redirect_uri=redirect) as agent,
    ):
        await agent.register()
        page = await browser.new_page()
        await page.goto(agent.authorize_url(pkce()[1]))
        await page.fill("input[name=pairing_code]", "peerd-agent:0123456789ab.wrong")
        await page.click("button[type=submit]")
        await page.wait_for_load_state()
        assert "no such agent pairing code" in await page.inner_text("body")
        assert page.url.startswith(agent.base + "/oauth/authorize")
        await page.close()
    assert seen == []


async def test_on_the_tls_listener_the_browser_gets_the_web_certificate_and_signs_in(
    tmp_path: Path, browser: Any, callback: tuple[str, list[dict[str, str]]]
) -> None:
    redirect, seen = callback
    async with running_daemon(tmp_path / "home") as daemon, Agent(daemon, redirect_uri=redirect) as agent:
        assert agent.base.startswith("https://")
        await agent.register(name="tls-agent")
        async with client_for(daemon.paths.home) as owner:
            code = (await owner.call("POST", "/v1/pair", body={"access": "read-only", "purpose": "agent"}))[
                "code"
            ]
            status = await owner.call("GET", "/v1/status")
        verifier, challenge = pkce()
        context = await browser.new_context(ignore_https_errors=True)  # self-signed: the person accepts it
        page = await context.new_page()
        response = await page.goto(agent.authorize_url(challenge))
        assert response is not None and response.status == 200
        details = await response.security_details()
        assert details is not None and "web" in (details.get("subjectName") or ""), details
        await page.fill("input[name=pairing_code]", code)
        await page.click("button[type=submit]")
        await page.wait_for_url(redirect + "?*")
        await context.close()
        (back,) = seen
        # The agent, on the same port, trusts only the identity certificate (`tls_for`): it still
        # gets that one, and so does every link that pins it.
        status_code, tokens = await agent.exchange(back["code"], verifier)
        assert status_code == 200 and tokens["scope"] == "read-only", tokens
        web = daemon.web_certificate
        assert web is not None and status["webFingerprint"] == web.fingerprint_text
        assert status["webFingerprint"] != status["fingerprint"]
