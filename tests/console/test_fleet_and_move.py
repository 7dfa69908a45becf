"""The fleet from the browser: the Fleet page (each machine's capacity report and preference), a
launch with provider, model, access, budget and `auto` placement, the Move button (the dry run's
candidates, then the move; the page then says `moved`), and styled error pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_terminal
from tests.support.console import console_settings, console_url, shot, signed_in
from tests.support.handoff import WORK, linked, worked_thread

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def test_fleet_launch_choices_move_button_and_error_pages(browser: Any, tmp_path: Path) -> None:
    async with linked(tmp_path, settings=console_settings()) as pair:
        page = await signed_in(browser, pair.laptop)
        base = console_url(pair.laptop)

        # the Fleet page: both machines, their runs, providers and preference
        await page.goto(base + "/fleet")
        box = page.locator(f"tr.fleet-env[data-env='{pair.box_id}']")
        assert "box" in await box.inner_text() and "reachable" in await box.inner_text()
        assert "script" in await box.locator("td[data-label=Providers]").inner_text()
        assert await box.locator("td.preference").inner_text() == "normal"
        assert "of 4" in await page.locator(f"tr.fleet-env[data-env='{pair.laptop_id}']").inner_text()
        await shot(page, "fleet")

        # a launch with a provider (and where it is installed), a model, access, a budget
        await page.goto(base + "/threads")
        assert "script (laptop, box)" in await page.locator("#l-provider").inner_text()
        await page.select_option("#l-target", f"here|{pair.here}")
        await page.select_option("#l-provider", "script")
        await page.fill("#l-model", "tiny")
        await page.select_option("#l-mode", "read-only")
        await page.fill("#l-tokens", "50000")
        await page.fill("#l-title", "Chosen")
        await page.fill("#l-prompt", "hello")
        await page.click("button:text-is('Launch')")
        await page.wait_for_url(f"{base}/threads/here/thr_*")
        chosen = await pair.lc.call("GET", f"/v1/threads/{page.url.rsplit('/', 1)[1]}")
        assert (chosen["model"], chosen["runtimeMode"], chosen["title"]) == ("tiny", "read-only", "Chosen")
        # ... and with `auto`: peerd places it and says why
        await page.goto(base + "/threads")
        await page.select_option("#l-target", f"auto|{pair.here}")
        await page.fill("#l-prompt", "anywhere")
        await page.click("button:text-is('Launch')")
        await page.wait_for_url(f"{base}/threads/*/thr_*")
        assert "Placed on" in await page.inner_text(".notices")

        # the Move button: the dry run's candidates, then the move; the page then says moved
        launched = await worked_thread(pair, WORK)
        here = launched["threadId"]
        await page.goto(f"{base}/threads/here/{here}")
        await page.click("a.move-link")
        candidate = page.locator(f"li.candidate[data-env='{pair.box_id}']")
        assert "can take it" in await candidate.inner_text()
        await shot(page, "move")
        await candidate.get_by_role("button", name="Move to box").click()
        await page.wait_for_url(f"{base}/threads/here/{here}")
        assert "Moving to box" in await page.inner_text(".notices")
        # the move ends while the page is open: its header says so (live, over the page's stream)
        await page.locator("#run-state [data-run-status=moved]").wait_for(timeout=60_000)
        await page.locator("#send-area .moved-note").wait_for()  # and Send goes, live too
        assert await page.locator("#send-text").count() == 0
        there = (await pair.lc.call("GET", f"/v1/threads/{here}"))["movedTo"]["threadId"]
        await wait_terminal(pair.bc, there)

        # styled error pages: a thread's address without its machine, an unknown page
        for bad in (f"/threads/{here}", "/no/such/page"):
            response = await page.goto(base + bad)
            assert response is not None and response.status == 404
            assert await page.inner_text("h1") == "Not found"
            assert await page.locator("nav a", has_text="Board").count() == 1
        await shot(page, "not-found")
        # ... and the guard's own refusals, to a browser: outside the console's root path
        assert pair.laptop.console is not None and pair.laptop.console.site is not None
        response = await page.goto(pair.laptop.console.site.base_url + "/elsewhere")
        assert response is not None and response.status == 404
        assert await page.inner_text("h1") == "Not found"
        assert "peerd console" in await page.inner_text("main")
