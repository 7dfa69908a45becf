"""The Approvals page in the browser: a run at approval-required asks (the scripted coder before each
`run` step), the question appears on an open page by itself, approve and deny (with a reason)
decide it through the console's forms (CSRF and all), and a decided one says who decided."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import client_for, make_repo, running_daemon, script, two_daemons, wait_terminal
from tests.support.approvals import launch, launch_on_box, new_approval, pending_approvals, set_up
from tests.support.console import console_settings, console_url, shot, signed_in

pytestmark = pytest.mark.browser
WAIT_MS = 30_000


async def pending(client: Any, *, seconds: float = 20) -> dict[str, Any]:
    return (await pending_approvals(client, seconds=seconds))[0]


async def test_a_pending_approval_appears_live_and_the_buttons_decide_it(
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
        await page.goto(base + "/approvals")
        assert "Nothing waits for your answer" in await page.inner_text("main")
        # The page is open before the run asks: the question appears by itself.
        launched = await launch(
            client,
            project,
            script({"run": "echo yes > approved.txt"}, {"run": "echo no > denied.txt"}, {"reply": "done"}),
        )
        first = await pending(client)
        card = page.locator(f'li.approval[data-approval="{first["id"]}"]')
        await card.wait_for(timeout=WAIT_MS)
        text = await card.inner_text()
        assert "run `echo yes > approved.txt`" in text and "echo yes > approved.txt" in text
        assert str(repo) in text and "here" in text
        await shot(page, "approvals")
        async with page.expect_navigation():
            await card.get_by_role("button", name="Approve", exact=True).click()
        assert "Approved." in await page.inner_text(".notices")
        decided = await client.call("GET", f"/v1/approvals/{first['id']}")
        assert decided["status"] == "approved" and decided["decidedBy"] == "owner"
        row = page.locator(f'tr.decided[data-approval="{first["id"]}"]')
        assert "approved" in await row.inner_text() and "the owner" in await row.inner_text()

        # The second question (after a reload, or live): deny it with a reason.
        second = await new_approval(client, {first["id"]}, seconds=20)
        card = page.locator(f'li.approval[data-approval="{second["id"]}"]')
        await card.wait_for(timeout=WAIT_MS)
        await card.get_by_label("Reason (the model is told)").fill("not that file")
        await card.get_by_role("button", name="Deny").click()
        await page.wait_for_url(base + "/approvals")
        denied = await client.call("GET", f"/v1/approvals/{second['id']}")
        assert denied["status"] == "denied" and denied["reason"] == "not that file"
        await wait_terminal(client, launched["threadId"], launched["runId"], total=30)
        assert (repo / "approved.txt").exists() and not (repo / "denied.txt").exists()
        row = page.locator(f'tr.decided[data-approval="{second["id"]}"]')
        await row.wait_for(timeout=WAIT_MS)
        assert "not that file" in await row.inner_text()
        await shot(page, "approvals-decided")


async def test_a_decision_needs_the_sessions_csrf_token_and_the_consoles_origin(
    browser: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=console_settings()) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        await launch(client, project, script({"run": "echo hi"}, {"reply": "done"}))
        asked = await pending(client)
        page = await signed_in(browser, daemon)
        base = console_url(daemon)
        await page.goto(base + "/approvals")
        form = page.locator(f"form[action$='/approvals/{asked['id']}/approve']")
        csrf = await form.locator("input[name=csrf]").get_attribute("value")
        [cookie] = await page.context.cookies()
        assert daemon.console is not None and daemon.console.site is not None and csrf
        right = {"Origin": daemon.console.site.base_url}
        url = f"{base}/approvals/{asked['id']}/approve"
        async with aiohttp.ClientSession(cookies={cookie["name"]: cookie["value"]}) as http:

            async def post(headers: dict[str, str], data: dict[str, str]) -> int:
                async with http.post(url, data=data, headers=headers, allow_redirects=False) as resp:
                    return resp.status

            assert await post(right, {"scope": "once"}) == 403
            assert await post(right, {"scope": "once", "csrf": "wrong"}) == 403
            assert await post({"Origin": "http://127.0.0.1:1"}, {"scope": "once", "csrf": csrf}) == 403
            assert (await client.call("GET", f"/v1/approvals/{asked['id']}"))["status"] == "pending"
            assert await post(right, {"scope": "run", "csrf": csrf}) == 303
        decided = await client.call("GET", f"/v1/approvals/{asked['id']}")
        assert decided["status"] == "approved" and decided["scope"] == "run"


async def test_a_boxs_approval_shows_on_the_laptops_page_and_is_decided_over_the_link(
    browser: Any, tmp_path: Path
) -> None:
    async with two_daemons(tmp_path, settings=console_settings()) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(pair, project, script({"run": "echo hi > there.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        page = await signed_in(browser, pair.laptop)
        base = console_url(pair.laptop)
        await page.goto(base + "/approvals")
        card = page.locator(f'li.approval[data-approval="{seen["id"]}"]')
        assert "on box" in await card.inner_text()
        thread = card.get_by_role("link", name=launched["threadId"])
        assert pair.laptop.console is not None
        root = pair.laptop.console.root  # the thread on the box, opened through the link
        assert await thread.get_attribute("href") == f"{root}/threads/{pair.box_id}/{launched['threadId']}"
        async with page.expect_navigation():
            await card.get_by_role("button", name="Approve", exact=True).click()
        assert "Approved." in await page.inner_text(".notices")
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
        record = await pair.bc.call("GET", f"/v1/approvals/{seen['id']}")
        assert record["status"] == "approved" and record["decidedBy"].startswith("link:")
