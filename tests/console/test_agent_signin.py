"""The console mints a pairing code for an agent, an agent signs in with it, and the console lists
it as a client of kind agent and revokes it (issue 29; the sign-in itself: tests/integration/
test_agent_signin.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import running_daemon
from tests.support.console import console_settings, console_url, signed_in
from tests.support.signin import Agent, Person, pkce, query_of

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def test_the_console_mints_an_agent_code_lists_the_agent_and_revokes_it(
    browser: Any, tmp_path: Path
) -> None:
    async with (
        running_daemon(tmp_path / "home", settings=console_settings()) as daemon,
        Agent(daemon) as agent,
    ):
        page = await signed_in(browser, daemon)
        await page.goto(console_url(daemon) + "/connections")
        await page.select_option("#pair-access", "read-only")
        await page.select_option("#pair-for", "agent")
        await page.click("text=Make a pairing code")
        code = await page.input_value("#pair-code")
        assert code.startswith("peerd-agent:")
        assert "sign-in page the agent opens" in await page.inner_text("main")

        await agent.register(name="console-agent")
        tokens = await agent.sign_in(code)
        assert tokens["scope"] == "read-only"

        await page.goto(console_url(daemon) + "/connections")
        client = page.locator("tr.client")
        assert "console-agent" in await client.inner_text() and "agent" in await client.inner_text()
        await client.locator("text=Revoke console-agent").click()
        await page.click("button:text-is('Revoke')")
        await page.wait_for_url(console_url(daemon) + "/connections")
        await page.click("details.ended-clients summary")  # revoked clients are folded away
        assert "revoked" in await page.locator("details.ended-clients tr.client").inner_text()
        assert (await agent.mcp(tokens["access_token"], "tools/list")).status == 401


async def test_the_owner_approves_an_agents_sign_in_in_the_console(browser: Any, tmp_path: Path) -> None:
    async with (
        running_daemon(tmp_path / "home", settings=console_settings()) as daemon,
        Agent(daemon) as agent,
    ):
        await agent.register(name="asking-agent")
        verifier, challenge = pkce()
        async with Person(daemon) as person:
            waiting, request_id = await person.ask_owner(agent.authorize_url(challenge))
            assert waiting.status == 202

            page = await signed_in(browser, daemon)
            await page.goto(console_url(daemon) + "/connections")
            asked = page.locator(f"li.signin[data-request='{request_id}']")
            assert "asking-agent" in await asked.inner_text()
            await asked.locator("select").select_option("auto-accept-edits")
            await asked.locator("button:text-is('Approve')").click()
            await page.wait_for_url(console_url(daemon) + "/connections")
            assert "Approved asking-agent (auto-accept-edits)." in await page.inner_text(".notices")
            assert await page.locator("li.signin").count() == 0

            back = await person.poll(request_id)
        assert back.status == 303
        status, tokens = await agent.exchange(query_of(back.headers["Location"])["code"], verifier)
        assert status == 200 and tokens["scope"] == "auto-accept-edits", tokens
