"""A thread page stays true without a reload: its header's latest run, the usage total, the
usage-by-run table and the run's buttons follow the runs over the page's stream; a moved thread
says `moved`, links to its copy there and offers no Send, Interrupt or Stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.console import console_settings, console_url, shot, signed_in
from tests.support.handoff import WORK, linked, move_ended, worked_thread

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def used(n_in: int, n_out: int) -> dict[str, Any]:
    return {"usage": {"input_tokens": n_in, "output_tokens": n_out}}


async def test_header_usage_table_and_buttons_follow_the_runs_without_a_reload(
    browser: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    with signal_dir() as signals:
        async with (
            running_daemon(tmp_path / "home", label="laptop", settings=console_settings()) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            first = script({"reply": "one", **used(100, 10)}, {"wait_for_file": str(signals / "one")})
            launched = await client.call(
                "POST", "/v1/threads", body={"projectId": project["id"], "prompt": first, "title": "Live"}
            )
            page = await signed_in(browser, daemon)
            await page.goto(f"{console_url(daemon)}/threads/here/{launched['threadId']}")
            await page.locator("#run-state [data-run-status=running]").wait_for()
            await page.locator("#live-state[data-state=live]").wait_for()
            rows = page.locator("#usage-runs tr.run-usage")
            await page.locator("#usage-runs tr.run-usage[data-status=running]").wait_for()
            assert await page.locator("#run-controls button").count() == 2  # Interrupt, Stop

            # a second run queues behind the first: the table shows it, without a reload
            second = script({"reply": "two", **used(300, 30)})
            await client.call("POST", f"/v1/threads/{launched['threadId']}/runs", body={"text": second})
            await page.locator("#usage-runs tr.run-usage[data-status=queued]").wait_for()
            assert await rows.count() == 2

            # both end: the header, the table and the total say so; the buttons go
            (signals / "one").write_text("go")
            await wait_terminal(client, launched["threadId"])
            await page.locator("#run-state [data-run-status=completed]").wait_for()
            assert "run #2" in await page.inner_text("#run-state")
            await page.locator("#usage-runs tr.run-usage[data-status=completed] >> nth=1").wait_for()
            assert await page.locator("#usage-runs tr.run-usage:not([data-status=completed])").count() == 0
            await page.locator("#usage-total", has_text="440 tokens").wait_for()
            await page.locator("#run-controls:not(:has(button))").wait_for(state="attached")
            assert await page.locator("#run-controls button").count() == 0
            assert await page.locator("#send-text").count() == 1  # a message may still be sent
            await shot(page, "thread-live")


async def test_a_moved_thread_says_moved_links_to_its_copy_and_takes_no_messages(
    browser: Any, tmp_path: Path
) -> None:
    async with linked(tmp_path, settings=console_settings()) as pair:
        launched = await worked_thread(pair, WORK)
        here = launched["threadId"]
        answer = await pair.lc.call("POST", f"/v1/threads/{here}/move", body={"to": "box"})
        move = await move_ended(pair.lc, answer["move"]["moveId"])
        assert move["state"] == "moved", move
        there = move["movedTo"]["threadId"]

        page = await signed_in(browser, pair.laptop)
        base = console_url(pair.laptop)
        await page.goto(f"{base}/threads/here/{here}")
        state = page.locator("#run-state")
        await state.locator("[data-run-status=moved]").wait_for()
        assert "moved" in await state.inner_text()
        assert "completed" not in await state.locator(".badge").inner_text()
        assert await page.locator("#send-text").count() == 0
        assert await page.locator("button", has_text="Interrupt").count() == 0
        assert await page.locator("button", has_text="Stop").count() == 0
        await shot(page, "thread-moved")
        await state.locator("a.moved-to").click()
        await page.wait_for_url(f"{base}/threads/{pair.box_id}/{there}")
        await page.locator("#run-state [data-run-status]").wait_for()
        assert await page.locator("#send-text").count() == 1


async def test_an_interrupt_shows_in_the_conversation_with_its_reason(browser: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with signal_dir() as signals:
        async with (
            running_daemon(tmp_path / "home", label="laptop", settings=console_settings()) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            prompt = script({"reply": "working"}, {"wait_for_file": str(signals / "never")})
            launched = await client.call(
                "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt}
            )
            page = await signed_in(browser, daemon)
            await page.goto(f"{console_url(daemon)}/threads/here/{launched['threadId']}")
            await page.locator("#run-state [data-run-status=running]").wait_for()
            await page.locator("#live-state[data-state=live]").wait_for()
            async with page.expect_navigation():
                await page.click("#run-controls button[value='0']")
            assert "Interrupted." in await page.inner_text(".notices")
            await wait_terminal(client, launched["threadId"])
            mark = page.locator("#items li.run-boundary").first
            await mark.filter(has_text="interrupted").wait_for()
            assert "from the console" in await mark.inner_text()
            stopped = page.locator("#items li.item.kind-notice").last  # the item the interrupt left
            await stopped.locator(".interrupted").wait_for()
            assert "from the console" in await stopped.inner_text()
            assert "from the console" in await page.inner_text("#usage-runs")
            assert await page.locator("#run-controls button").count() == 0
