"""A thread's changes in the browser: committed, uncommitted and new files against its base, file
by file with added and removed counts, for a thread here and for a box's thread through the link;
the link sees only the diffs of the threads it started (the API fences it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.errors import ThreadNotFound
from tests.helpers import script, wait_terminal
from tests.support.console import console_settings, console_url, shot, signed_in
from tests.support.handoff import WORK, linked, worked_thread

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def files_shown(page: Any) -> dict[str, tuple[int, int]]:
    found: list[list[str]] = await page.eval_on_selector_all(
        "details.diff-file",
        "els => els.map(e => [e.dataset.path, e.querySelector('[data-added]').dataset.added,"
        " e.querySelector('[data-removed]').dataset.removed])",
    )
    return {path: (int(a), int(r)) for path, a, r in found}


async def test_the_diff_of_a_thread_here_and_of_a_boxs_thread_through_the_link(
    browser: Any, tmp_path: Path
) -> None:
    async with linked(tmp_path, settings=console_settings()) as pair:
        here = (await worked_thread(pair, WORK))["threadId"]
        page = await signed_in(browser, pair.laptop)
        base = console_url(pair.laptop)
        await page.goto(f"{base}/threads/here/{here}")
        await page.click("a.diff-link")
        await page.wait_for_url(f"{base}/threads/here/{here}/diff")
        shown = await files_shown(page)
        assert shown == {"committed.txt": (1, 0), "README.md": (1, 1), "new.txt": (1, 0)}, shown
        readme = page.locator("details.diff-file[data-path='README.md'] pre.diff")
        assert "+# demo, edited here" in await readme.locator("span.add").inner_text()
        assert "-# demo" in await readme.locator("span.del").inner_text()
        summary = await page.inner_text(".diff-summary")
        assert "+3" in summary and "\u22121" in summary  # a minus sign
        await shot(page, "thread-diff")

        # a thread the laptop started on the box: its diff through the link
        prompt = script({"write": {"path": "there.txt", "content": "one\ntwo\n"}}, {"reply": "ok"})
        projects = await pair.lc.call("GET", "/v1/projects", params={"environmentId": pair.box_id})
        launched = await pair.lc.call(
            "POST",
            "/v1/threads",
            body={"projectId": projects["items"][0]["id"], "prompt": prompt, "environmentId": pair.box_id},
        )
        await wait_terminal(pair.bc, launched["threadId"])
        await page.goto(f"{base}/threads/{pair.box_id}/{launched['threadId']}/diff")
        assert await files_shown(page) == {"there.txt": (2, 0)}
        # the board shows the box's threads too (through the link), filtered by machine
        await page.goto(f"{base}/board?env={pair.box_id}")
        card = page.locator(f"#board li.card[data-thread='{launched['threadId']}']")
        assert "box" in await card.locator(".meta").inner_text()
        assert await page.locator("#board li.card", has_text="laptop").count() == 0

        # the box's own thread (not the link's): the link is not shown its diff
        own = await pair.bc.call(
            "POST", "/v1/threads", body={"projectId": projects["items"][0]["id"], "prompt": prompt}
        )
        await wait_terminal(pair.bc, own["threadId"])
        assert (await pair.bc.call("GET", f"/v1/threads/{own['threadId']}/diff"))["files"]
        with pytest.raises(ThreadNotFound):
            await pair.lc.call(
                "GET", f"/v1/threads/{own['threadId']}/diff", params={"environmentId": pair.box_id}
            )
        await page.goto(f"{base}/threads/{pair.box_id}/{own['threadId']}/diff")
        assert "thread_not_found" in await page.inner_text("main")
