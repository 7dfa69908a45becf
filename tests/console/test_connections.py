"""Pairing on the box's Connections page, linking on the laptop's, the link live, and revoking it."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import two_daemons
from tests.support.console import console_settings, console_url, shot, signed_in


def moment(text: str) -> float:
    """A time as the console prints it ("2026-12-31 14:03:07 CET ..."), in seconds."""
    found = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
    assert found is not None, text
    return datetime.strptime(found.group(0), "%Y-%m-%d %H:%M:%S").timestamp()  # both local


pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def test_pair_on_the_box_link_on_the_laptop_see_it_live_and_revoke_it(
    browser: Any, tmp_path: Path
) -> None:
    async with two_daemons(tmp_path, settings=console_settings()) as pair:
        box = await signed_in(browser, pair.box)
        laptop = await signed_in(browser, pair.laptop)

        # the box makes a code: text, QR code and a countdown
        await box.goto(console_url(pair.box) + "/connections")
        await box.select_option("#pair-access", "auto")
        await box.fill("#pair-label", "laptop")
        await box.click("text=Make a pairing code")
        code = await box.input_value("#pair-code")
        assert code.startswith("peerd")
        assert await box.locator("figure.qr svg path").count() >= 1
        countdown = box.locator(".countdown")
        first = await countdown.inner_text()
        assert first.startswith("expires in "), first
        await box.wait_for_function(
            "t => document.querySelector('.countdown').textContent !== t", arg=first, timeout=5000
        )
        await shot(box, "pair")

        # the laptop pastes it
        await laptop.goto(console_url(pair.laptop) + "/connections")
        await laptop.fill("#link-code", code)
        await laptop.select_option("#link-access", "auto")
        await laptop.click("button:text-is('Link')")
        await laptop.wait_for_url(console_url(pair.laptop) + "/connections")
        assert "Linked box (auto)." in await laptop.inner_text(".notices")
        row = laptop.locator(f"#links tr[data-env='{pair.box_id}']")
        # the live check (htmx, on load) asks the box now
        await row.locator("text=asked now").wait_for()
        assert "reachable" in await row.inner_text()
        await shot(laptop, "connections")

        # the box sees its client, and revokes it after a confirmation
        await box.goto(console_url(pair.box) + "/connections")
        client = box.locator("tr.client")
        assert "laptop" in await client.inner_text() and "active" in await client.inner_text()
        # one expiry on both sides: the box's client lapses when the laptop's link says it does
        theirs = await row.locator("td[data-label=Expires]").inner_text()
        ours = await client.locator("td[data-label=Expires]").inner_text()
        assert "never" not in ours and "never" not in theirs
        assert abs(moment(ours) - moment(theirs)) <= 2, (ours, theirs)
        await client.locator("text=Revoke laptop").click()
        assert await box.locator("h1").inner_text() == "Revoke laptop?"
        await shot(box, "revoke-confirm")
        await box.click("button:text-is('Revoke')")
        await box.wait_for_url(console_url(pair.box) + "/connections")
        assert "Revoked laptop" in await box.inner_text(".notices")
        # a revoked client is folded away under its own heading
        folded = box.locator("details.ended-clients")
        assert await folded.get_attribute("open") is None
        assert "Revoked and expired (1)" in await folded.locator("summary").inner_text()
        await folded.locator("summary").click()
        assert "revoked" in await folded.locator("tr.client").inner_text()

        # the laptop's page shows the revocation live (asked again on its next refresh)
        await laptop.reload()
        await row.locator(".badge.revoked").wait_for(timeout=10_000)
        assert "revoked" in await row.inner_text()
