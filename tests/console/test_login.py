"""Signing in to the console in a real browser, and its security cases: a wrong token, a token
used twice, no cookie, a cross-site POST, a foreign Host, a change without the CSRF token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from peerd.daemon import Daemon
from tests.helpers import client_for, running_daemon
from tests.support.console import console_settings, console_url, login_url, shot, signed_in

pytestmark = pytest.mark.browser


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(tmp_path / "home", label="laptop", settings=console_settings()) as d:
        yield d


async def test_login_with_the_token_url_once_and_a_wrong_one_fails(browser: Any, daemon: Daemon) -> None:
    base = console_url(daemon)
    context = await browser.new_context()
    page = await context.new_page()
    # no cookie: every page is the login page
    await page.goto(base + "/threads")
    assert page.url == base + "/login"
    assert await page.locator("h1").inner_text() == "Sign in to peerd laptop"
    await shot(page, "login")
    # a wrong token
    answer = await page.goto(base + "/login?token=not-a-token")
    assert answer is not None and answer.status == 401
    assert "That login token is not valid" in await page.inner_text("main")
    # the right one: signed in, at the Environment page, with an HttpOnly, Secure, Strict cookie
    url = await login_url(daemon)
    await page.goto(url)
    await page.wait_for_url(base + "/")
    assert "Environment laptop" in await page.locator("h1").inner_text()
    [cookie] = await context.cookies()
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert cookie["name"].startswith("peerd_console_")
    assert daemon.console is not None and cookie["path"] == daemon.console.root
    assert "token" not in page.url
    await page.locator("#health .checks").wait_for()
    await shot(page, "environment")
    # keyboard: the first Tab reaches "Skip to the content", which moves the focus to the page
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Skip to the content"
    await page.keyboard.press("Enter")
    assert await page.evaluate("document.activeElement.id") == "main"
    await page.goto(base + "/approvals")
    assert "Nothing waits for your answer" in await page.inner_text("main")
    await shot(page, "approvals")
    # the same token again, in another browser: refused
    other = await (await browser.new_context()).new_page()
    again = await other.goto(url)
    assert again is not None and again.status == 401
    assert "That login token is not valid" in await other.inner_text("main")
    # a pasted token works too; signing out ends the session
    third = await (await browser.new_context()).new_page()
    await third.goto(base + "/login")
    token = (await login_url(daemon)).partition("token=")[2]
    await third.fill("#token", token)
    await third.click("button[type=submit]")
    await third.wait_for_url(base + "/")
    await third.click("text=Sign out")
    await third.wait_for_url(base + "/login")
    await third.goto(base + "/connections")
    assert third.url == base + "/login"


async def test_a_cross_site_post_is_refused(browser: Any, daemon: Daemon) -> None:
    """A page on another port of 127.0.0.1 is the same *site* (the Strict cookie goes along): the
    console's Origin rule refuses its POST, and no pairing code is made."""
    base = console_url(daemon)
    page = await signed_in(browser, daemon)
    evil = web.Application()

    async def form(_: web.Request) -> web.Response:
        return web.Response(
            text=f'<form id="f" method="post" action="{base}/connections/pair">'
            '<input name="access" value="full-access"><input name="csrf" value="guess"></form>'
            '<button id="go" onclick="document.getElementById(\'f\').submit()">go</button>',
            content_type="text/html",
        )

    evil.router.add_get("/", form)
    runner = web.AppRunner(evil)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        await page.goto(f"http://127.0.0.1:{port}/")
        async with page.expect_navigation():
            await page.click("#go")
        assert "only from the console's own pages" in await page.inner_text("body")
    finally:
        await runner.cleanup()
    assert await _codes(daemon) == [], "the cross-site POST made a pairing code"


async def _codes(daemon: Daemon) -> list[Any]:
    async with client_for(daemon.paths.home) as client:
        data = await client.call("GET", "/v1/pair")
    items: list[Any] = data["items"]
    return items


async def test_changes_need_the_origin_and_the_csrf_token(browser: Any, daemon: Daemon) -> None:
    base = console_url(daemon)
    page = await signed_in(browser, daemon)
    [cookie] = await page.context.cookies()
    jar = {cookie["name"]: cookie["value"]}
    await page.goto(base + "/connections")
    csrf = await page.locator("form[action$='/connections/pair'] input[name=csrf]").get_attribute("value")
    async with aiohttp.ClientSession(cookies=jar) as http:

        async def post(headers: dict[str, str], data: dict[str, str]) -> tuple[int, str]:
            async with http.post(
                base + "/connections/pair", data=data, headers=headers, allow_redirects=False
            ) as resp:
                return resp.status, await resp.text()

        assert daemon.console is not None and daemon.console.site is not None
        right = {"Origin": daemon.console.site.base_url}
        body = {"access": "read-only", "ttl": "600"}
        # the right origin without the CSRF token, or with a wrong one
        assert (await post(right, body))[0] == 403
        assert (await post(right, {**body, "csrf": "wrong"}))[0] == 403
        # the CSRF token from another origin, or with no Origin at all
        assert (await post({"Origin": "http://127.0.0.1:1"}, {**body, "csrf": csrf}))[0] == 403
        assert (await post({}, {**body, "csrf": csrf}))[0] == 403
        assert (await post({**right, "Sec-Fetch-Site": "cross-site"}, {**body, "csrf": csrf}))[0] == 403
        assert await _codes(daemon) == []
        # a foreign Host (DNS rebinding) is not answered, even for a page
        assert daemon.console is not None
        port = daemon.console.port
        async with http.get(base + "/", headers={"Host": f"evil.example:{port}"}) as resp:
            assert resp.status == 421
        # no cookie: a change is 401, whatever it carries
        async with (
            aiohttp.ClientSession() as bare,
            bare.post(
                base + "/connections/pair", data={**body, "csrf": csrf}, headers=right, allow_redirects=False
            ) as resp,
        ):
            assert resp.status == 401
        # and with both: done (the page shows the code)
        status, text = await post(right, {**body, "csrf": csrf})
        assert status == 200 and "peerd" in text
        assert len(await _codes(daemon)) == 1
        # every answer carries the strict headers
        async with http.get(base + "/connections") as resp:
            assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
            assert resp.headers["X-Frame-Options"] == "DENY"
            assert resp.headers["Referrer-Policy"] == "same-origin"
            assert resp.headers["Cache-Control"] == "no-store"


async def test_the_cookie_goes_to_no_other_server_on_this_host(browser: Any, daemon: Daemon) -> None:
    """Browsers do not keep cookies apart by port: a dev server an agent started on 127.0.0.1 that
    the user opens must not receive the console's session cookie (its Path is the console's root,
    random for each daemon start, and `/` does not say it)."""
    page = await signed_in(browser, daemon)
    seen: list[dict[str, str]] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(dict(request.cookies))
        return web.Response(text="<p>dev server</p>", content_type="text/html")

    other = web.Application()
    other.router.add_get("/{tail:.*}", anything)
    runner = web.AppRunner(other)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        port = runner.addresses[0][1]
        for path in ("/", "/c/", "/threads", "/static/console.css"):
            await page.goto(f"http://127.0.0.1:{port}{path}")
            await page.goto(f"http://localhost:{port}{path}")
    finally:
        await runner.cleanup()
    assert len(seen) >= 8, seen  # the pages (and the browser's favicon requests)
    assert [c for c in seen if any(k.startswith("peerd_console") for k in c)] == []
    assert len(await page.context.cookies()) == 1, "the browser does hold the session cookie"
    # the console's own `/` sends people to `peerd console` and does not give its root away
    assert daemon.console is not None and daemon.console.port is not None
    answer = await page.goto(f"http://127.0.0.1:{daemon.console.port}/")
    assert answer is not None and answer.status == 404
    body = await page.inner_text("body")
    assert "peerd console" in body and daemon.console.root not in body
