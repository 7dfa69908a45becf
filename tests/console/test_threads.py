"""A thread in the browser: launched from the Threads page, its items streaming as they arrive,
resumed after a dropped connection with no item lost or shown twice, and a follow-up sent."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.faultproxy import FaultProxy
from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.console import console_settings, console_url, shot, signed_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def reply(items: Any, text: str) -> Any:
    """The assistant's reply `text` among the items (the user message holds the whole script)."""
    return items.locator("li.kind-assistant_message .text", has_text=re.compile(f"^{re.escape(text)}$"))


async def positions_shown(page: Any) -> list[int]:
    found: list[str] = await page.eval_on_selector_all(
        "#items > li.item", "els => els.map(e => e.dataset.position)"
    )
    return [int(p) for p in found]


async def test_launch_watch_items_stream_resume_after_a_drop_and_send(browser: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with signal_dir() as signals:
        # The browser reaches the console through a proxy a test can cut (its address is the
        # console's public_url, so Host and Origin are the console's own).
        async with (
            FaultProxy(1) as proxy,
            running_daemon(
                tmp_path / "home",
                label="laptop",
                settings=console_settings(public_url=f"http://127.0.0.1:{proxy.port}"),
            ) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            assert daemon.console is not None and daemon.console.port is not None
            proxy.upstream = ("127.0.0.1", daemon.console.port)
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            page = await signed_in(browser, daemon)
            base = console_url(daemon)
            await page.goto(base + "/threads")
            await page.select_option("#l-target", f"here|{project['id']}")
            await page.fill("#l-title", "Streamed")
            prompt = script(
                {"reply": "first"},
                {"wait_for_file": str(signals / "one")},
                {"reply": "second"},
                {"wait_for_file": str(signals / "two")},
                {"reply": "third"},
            )
            await page.fill("#l-prompt", prompt)
            await page.click("button:text-is('Launch')")
            await page.wait_for_url(f"{base}/threads/here/thr_*")
            thread_id = page.url.rsplit("/", 1)[1]
            items = page.locator("#items")
            await reply(items, "first").wait_for()
            await page.locator("#live-state[data-state=live]").wait_for()
            await page.locator("#run-state [data-run-status=running]").wait_for()

            # an item that arrives while the page is open appears without a reload
            (signals / "one").write_text("go")
            await reply(items, "second").wait_for()
            await shot(page, "thread")

            # the connection drops (the proxy resets it and refuses new ones); the page says so;
            # items arrive meanwhile; once the network is back the stream resumes from its last id
            await proxy.refuse()
            await page.locator("#live-state[data-state=reconnecting]").wait_for()
            assert "Reconnecting" in await page.inner_text("#live-state")
            (signals / "two").write_text("go")
            done = await wait_terminal(client, thread_id)
            assert done["status"] == "completed"
            await asyncio.sleep(0.5)  # a time for "third" not to show: nothing reports an absence
            assert await reply(items, "third").count() == 0
            await proxy.forward()
            await reply(items, "third").wait_for(timeout=20_000)
            await page.locator("#live-state[data-state=live]").wait_for()
            await page.locator("#run-state [data-run-status=completed]").wait_for()

            # a follow-up from the send form (htmx: the page, and its stream, stay)
            await page.fill("#send-text", "and now?")
            await page.click("#send button:text-is('Send')")
            await page.locator("#send .notice", has_text="Sent.").wait_for()
            await reply(items, "(script) and now?").wait_for()

            read = await client.call("GET", f"/v1/threads/{thread_id}/items")
            want = [item["position"] for item in read["items"]]
            shown = await positions_shown(page)
            assert shown == want, "every item once, in order"
            assert len(set(shown)) == len(shown)

            # the Threads page lists it under this machine and its project, and filters by status
            await page.goto(base + "/threads?status=completed")
            assert "Streamed" in await page.inner_text("section.env[data-env=here]")
            await shot(page, "threads")
            await page.goto(base + "/threads?status=failed")
            assert "Streamed" not in await page.inner_text("main")
