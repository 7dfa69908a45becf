"""A thread page reads like a conversation: the agent's Markdown rendered (and hostile HTML in it
shown as text, never run: no element, no handler, no `javascript:` link), tool calls folded with
their arguments and result, command output folded, and each run's boundary with its status and
usage, a new run's added live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal
from tests.support.console import console_settings, console_url, shot, signed_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]

HOSTILE = (
    "**bold** and `code`\n\n"
    "<script>window.pwned = 1</script>\n\n"
    '<img src=x onerror="window.pwned = 2">\n\n'
    "[click](javascript:window.pwned=3) [ok](https://example.com/a)\n\n"
    "- one\n- two\n"
)


async def test_markdown_is_rendered_hostile_html_escaped_tools_and_output_folded(
    browser: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", label="laptop", settings=console_settings()) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        prompt = script(
            {"reply": HOSTILE, "usage": {"input_tokens": 1000, "output_tokens": 20}},
            {"run": "printf 'l1\\nl2\\nl3\\nl4\\nl5\\n'"},
            {"tool": {"name": "project_list", "arguments": {"limit": 1}}},
        )
        launched = await client.call(
            "POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt}
        )
        await wait_terminal(client, launched["threadId"])
        page = await signed_in(browser, daemon)
        dialogs: list[str] = []
        page.on("dialog", lambda d: dialogs.append(d.message))
        base = console_url(daemon)
        await page.goto(f"{base}/threads/here/{launched['threadId']}")
        said = page.locator("li.kind-assistant_message .md")
        await said.wait_for()
        # Markdown: bold, code, a list, a safe link
        assert await said.locator("strong", has_text="bold").count() == 1
        assert await said.locator("code", has_text="code").count() == 1
        assert await said.locator("li").count() == 2
        assert await said.locator("a[href='https://example.com/a']").count() == 1
        # hostile HTML is text: no script, no image, no handler, no javascript: link
        text = await said.inner_text()
        assert "<script>window.pwned = 1</script>" in text and "onerror" in text
        assert await said.locator("script, img, [onerror]").count() == 0
        assert await page.locator("#items a[href^='javascript']").count() == 0
        assert await page.evaluate("window.pwned === undefined")
        assert dialogs == []
        # a command's long output is folded; a tool call is folded with its arguments and result
        output = page.locator("li.kind-command details.output-fold")
        assert await output.get_attribute("open") is None
        assert "5 lines" in await output.locator("summary").inner_text()
        tool = page.locator("li.kind-tool_call details.tool")
        assert await tool.get_attribute("open") is None
        await tool.locator("summary").click()
        assert '"limit": 1' in await tool.inner_text()
        assert "Result" in await tool.inner_text()
        # the run's boundary with its status and usage
        mark = page.locator("#items li.run-boundary").first
        assert "Run #1" in await mark.inner_text()
        assert "completed" in await mark.inner_text() and "1,020 tokens" in await mark.inner_text()
        await shot(page, "thread-conversation")

        # a second run: its boundary appears live, and says how it ended
        await page.locator("#live-state[data-state=live]").wait_for()
        await client.call(
            "POST", f"/v1/threads/{launched['threadId']}/runs", body={"text": script({"reply": "again"})}
        )
        second = page.locator("#items li.run-boundary", has_text="Run #2")
        await second.wait_for()
        await page.locator("#items li.run-boundary", has_text="completed").nth(1).wait_for()
        assert await page.locator("#items li.run-boundary").count() == 2
