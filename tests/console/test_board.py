"""The Board and Needs you in the browser: every thread in a column by its state (queued, running,
needs you, done, failed), filters and search, keys, and a run ending moving its card without a
reload; the count of what waits for the person in every page's navigation, changing as a run asks
a question and the question is answered from the Needs you queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal
from tests.realcli import signal_dir
from tests.support.approvals import launch as launch_asking
from tests.support.approvals import pending_approvals
from tests.support.console import console_settings, console_url, shot, signed_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def card(page: Any, column: str, title: str) -> Any:
    return page.locator(f"#board .column[data-column={column}] li.card", has_text=title)


async def test_the_board_sorts_filters_follows_and_is_keyboard_usable(browser: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with signal_dir() as signals:
        async with (
            running_daemon(tmp_path / "home", label="laptop", settings=console_settings()) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})

            async def start(title: str, prompt: str, **more: Any) -> str:
                body = {"projectId": project["id"], "prompt": prompt, "title": title, **more}
                launched = await client.call("POST", "/v1/threads", body=body)
                return str(launched["threadId"])

            waiting = await start(
                "Waiting one", script({"reply": "hi"}, {"wait_for_file": str(signals / "go")})
            )
            done = await start("Finished one", script({"reply": "ok", "usage": {"input_tokens": 1200}}))
            broken = await start("Broken one", script({"run": "exit 3", "check": True}))
            budget = await start(
                "Over budget",
                script({"reply": "a", "usage": {"input_tokens": 5000}}, {"reply": "b"}),
                budget={"tokens": 10},
            )
            for thread in (done, broken, budget):
                await wait_terminal(client, thread)

            page = await signed_in(browser, daemon)
            base = console_url(daemon)
            await page.goto(base + "/board")
            await page.locator("#live-state[data-state=live]").wait_for()
            await card(page, "running", "Waiting one").wait_for()
            assert "1,200 tok" in await card(page, "done", "Finished one").inner_text()
            meta = await card(page, "done", "Finished one").locator(".meta").inner_text()
            assert "laptop" in meta and "script" in meta and "repo" in meta
            await card(page, "failed", "Broken one").wait_for()
            over = card(page, "needs", "Over budget")
            assert "needs you" in await over.inner_text()
            # the count in the navigation (the budget stop)
            await page.locator("#needs-watch[data-count='1']").wait_for()
            await shot(page, "board")

            # keys: "/" searches; arrows move between cards
            await page.locator("body").press("/")
            assert await page.evaluate("document.activeElement.id") == "b-q"
            await card(page, "running", "Waiting one").locator("a").focus()
            await page.keyboard.press("ArrowRight")
            assert await page.evaluate("document.activeElement.textContent") == "Over budget"
            await page.keyboard.press("ArrowRight")
            assert await page.evaluate("document.activeElement.textContent") == "Finished one"

            # the run ends: its card moves to Done without a reload
            (signals / "go").write_text("go")
            await wait_terminal(client, waiting)
            await card(page, "done", "Waiting one").wait_for()
            assert await card(page, "running", "Waiting one").count() == 0

            # search and filters
            await page.fill("#b-q", "brok")
            await page.click("form.filters button")
            await card(page, "failed", "Broken one").wait_for()
            assert await page.locator("#board li.card").count() == 1
            await page.goto(base + "/board?provider=codex")
            assert await page.locator("#board li.card").count() == 0
            await page.goto(base + "/board?env=here&project=repo&provider=script")
            assert await page.locator("#board li.card").count() == 4

            # the Threads page searches and filters by project too, newest first
            await page.goto(base + "/threads?q=brok")
            assert await page.locator("li.thread").count() == 1
            await page.goto(base + "/threads?project=repo")
            titles = await page.locator("li.thread strong").all_inner_texts()
            assert len(titles) == 4 and titles[0] == "Waiting one"  # the latest change first
            await page.goto(base + "/threads?project=other")
            assert await page.locator("li.thread").count() == 0

            # the queue: the budget stop, with what to do
            await page.goto(base + "/needs-you")
            need = page.locator("li.need.kind-budget")
            assert "Over budget" in await need.inner_text() and "budget exceeded" in await need.inner_text()


async def test_the_needs_you_count_follows_a_question_asked_and_answered(
    browser: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=console_settings()) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        page = await signed_in(browser, daemon)
        base = console_url(daemon)
        await page.goto(base + "/threads")
        await page.locator("#needs-watch[data-count='0']").wait_for(state="attached")
        # a run asks while the page is open: the count appears without a reload
        launched = await launch_asking(
            client, project, script({"run": "echo yes > ok.txt"}, {"reply": "done"})
        )
        (asked,) = await pending_approvals(client)
        await page.locator("#needs-watch[data-count='1']").wait_for(timeout=30_000)
        assert "1" in await page.inner_text("#needs-nav")
        # the queue lists it; Approve answers it; the count goes
        await page.click("#needs-nav")
        need = page.locator("li.need.kind-approval")
        assert "echo yes > ok.txt" in await need.inner_text()
        async with page.expect_navigation():
            await need.get_by_role("button", name="Approve", exact=True).click()
        assert "Approved." in await page.inner_text(".notices")
        assert (await client.call("GET", f"/v1/approvals/{asked['id']}"))["status"] == "approved"
        await page.locator("#needs-watch[data-count='0']").wait_for(state="attached")
        assert "Nothing waits for you" in await page.inner_text("main")
        done = await wait_terminal(client, launched["threadId"])
        assert done["status"] == "completed"
