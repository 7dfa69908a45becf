"""Delegation, tasks and orchestrations in the browser: lineage both ways (the box's thread opened
through the link), cancelling a task, and an orchestration's packet graph, report and cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import ConsoleConfig
from tests.helpers import client_for, git, make_repo, running_daemon, script, two_daemons, wait_terminal
from tests.realcli import signal_dir
from tests.support.console import console_settings, console_url, shot, signed_in
from tests.support.eventually import eventually
from tests.support.orchestrate import finished, packet, project_repo, settings, start, steps

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def task_status(client: Any, task_id: str, *, until: str, total: float = 30.0) -> dict[str, Any]:
    # The task's own events are its parent's; a short poll is simpler here.
    task: dict[str, Any] = await eventually(
        lambda: client.call("GET", f"/v1/tasks/{task_id}"),
        what=f"task {task_id} {until}",
        until=lambda task: task["status"] == until,
        within=total,
    )
    return task


async def test_lineage_both_ways_opens_the_boxs_thread_and_a_task_is_cancelled(
    browser: Any, tmp_path: Path
) -> None:
    origin = tmp_path / "origin.git"
    make_repo(tmp_path / "seed", origin=None)
    git(tmp_path, "clone", "-q", "--bare", str(tmp_path / "seed"), str(origin))
    with signal_dir() as signals:
        async with two_daemons(tmp_path, settings=console_settings()) as pair:
            for side, client in (("laptop", pair.lc), ("box", pair.bc)):
                git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
                await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
            await pair.link("auto")
            here = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
            child = script(
                {"reply": "working on it"},
                {"wait_for_file": str(signals / "go-on")},
                {"reply": "more from the box"},
                {"wait_for_file": str(signals / "never")},
            )
            delegate = {
                "tool": {
                    "name": "delegate_task",
                    "arguments": {
                        "task": child,
                        "title": "Fix it on the box",
                        "target": {"environmentId": "box"},
                    },
                    "check": True,
                }
            }
            launched = await pair.lc.call(
                "POST",
                "/v1/threads",
                body={
                    "projectId": here["id"],
                    "title": "Parent",
                    "prompt": script(delegate, {"reply": "sent"}),
                },
            )
            parent = launched["threadId"]
            await wait_terminal(pair.lc, parent, launched["runId"])
            [task] = (await pair.lc.call("GET", "/v1/tasks", params={"threadId": parent}))["items"]
            task = await task_status(pair.lc, task["taskId"], until="running")
            assert task["status"] == "running" and task["remoteChild"]["threadId"], task
            box_thread = task["remoteChild"]["threadId"]

            laptop = await signed_in(browser, pair.laptop)
            base = console_url(pair.laptop)
            # the parent: "delegated ... to box", a link that opens the box's thread through the link
            await laptop.goto(f"{base}/threads/here/{parent}")
            child_link = laptop.locator(".lineage .child a", has_text="Fix it on the box")
            assert "to box" in await laptop.locator(".lineage .child").inner_text()
            await shot(laptop, "thread-lineage")
            await child_link.click()
            await laptop.wait_for_url(f"{base}/threads/{pair.box_id}/{box_thread}")
            assert "box" in await laptop.inner_text(".facts")
            replies = laptop.locator("#items li.kind-assistant_message .text")
            await replies.filter(has_text="working on it").wait_for()
            # the box's items stream through the link too
            await laptop.locator("#live-state[data-state=live]").wait_for()
            (signals / "go-on").write_text("go")
            await replies.filter(has_text="more from the box").wait_for(timeout=20_000)
            # ... and the box's thread says whose subagent it is, with a link back here
            parent_line = laptop.locator(".lineage .parent")
            assert "Subagent of Parent on laptop" in await parent_line.inner_text()
            await parent_line.locator("a").click()
            await laptop.wait_for_url(f"{base}/threads/here/{parent}")

            # on the box's own console the same thread names the laptop (not a link there)
            box = await signed_in(browser, pair.box)
            await box.goto(f"{console_url(pair.box)}/threads/here/{box_thread}")
            assert "Subagent of Parent on laptop" in await box.inner_text(".lineage .parent")

            # the laptop's Threads page has both machines, the box's through the link
            await laptop.goto(base + "/threads")
            assert "Parent" in await laptop.inner_text("section.env[data-env=here]")
            assert "Fix it on the box" in await laptop.inner_text(f"section.env[data-env='{pair.box_id}']")
            await shot(laptop, "threads-fleet")

            # Tasks: where it runs, and cancel (with a confirmation)
            await laptop.goto(base + "/tasks")
            row = laptop.locator(f"tr.task[data-task='{task['taskId']}']")
            assert "running" in await row.inner_text() and "box" in await row.inner_text()
            await shot(laptop, "tasks")
            await row.locator("text=Cancel").click()
            assert (await laptop.locator("h1").inner_text()).startswith("Cancel the task")
            await laptop.click("button:text-is('Cancel the task')")
            await laptop.wait_for_url(base + "/tasks")
            ended = await task_status(pair.lc, task["taskId"], until="cancelled")
            assert ended["status"] == "cancelled", ended
            await laptop.reload()
            assert "cancelled" in await laptop.locator(f"tr.task[data-task='{task['taskId']}']").inner_text()
            await laptop.goto(base + "/tasks?status=running")
            assert await laptop.locator("tr.task").count() == 0


FIX_ADD = {"edit": {"path": "calc.py", "old": "return a - b", "new": "return a + b"}}
CHECK_ADD = "python3 -c 'import calc; assert calc.add(2, 3) == 5'"


async def test_an_orchestrations_packet_graph_report_and_cancel(browser: Any, tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    config = settings(tmp_path).model_copy(update={"console": ConsoleConfig(listen="127.0.0.1:0")})
    with signal_dir() as signals:
        async with (
            running_daemon(tmp_path / "home", label="laptop", settings=config) as daemon,
            client_for(daemon.paths.home) as client,
        ):
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            plan = [
                packet(
                    "fix-add", "Fix add().\n\n" + steps(FIX_ADD, {"reply": "fixed"}), ["calc.py"], CHECK_ADD
                ),
                packet(
                    "docs",
                    "Document it.\n\n"
                    + steps({"write": {"path": "docs/u.md", "content": "add\n"}}, {"reply": "ok"}),
                    ["docs"],
                    "test -f docs/u.md",
                    dependsOn=["fix-add"],
                ),
            ]
            info = await start(client, project, plan=plan, coders=["script"], verify=CHECK_ADD)
            page = await signed_in(browser, daemon)
            base = console_url(daemon)
            await page.goto(base + "/orchestrations")
            await shot(page, "orchestrations")
            await page.click(f"a:has-text('{info['id']}')")
            await page.wait_for_url(f"{base}/orchestrations/{info['id']}")
            nodes = page.locator("svg.graph g.node")
            assert await nodes.count() == 2
            assert await page.locator("svg.graph line.edge").count() == 1
            # the page follows the run by itself (a long-poll) until it ends
            await page.locator("#orc > p .badge.completed").wait_for(timeout=90_000)
            done = await finished(client, info["id"])
            assert done["status"] == "completed"
            for pid in ("fix-add", "docs"):
                assert "integrated" in (
                    await page.locator(f"svg.graph g[data-packet='{pid}']").text_content() or ""
                )
            report = await page.inner_text("section[aria-labelledby=report-h]")
            assert "merged fix-add, docs" in report and "passed" in report
            assert await page.locator("ul.receipts li").count() >= 5
            await shot(page, "orchestration")

            # a second one, held in its first packet, is cancelled from the page
            held = [
                packet(
                    "slow",
                    "Wait.\n\n" + steps({"wait_for_file": str(signals / "never")}, {"reply": "x"}),
                    ["calc.py"],
                    "true",
                ),
                packet("after", "Then.\n\n" + steps({"reply": "y"}), ["docs"], "true", dependsOn=["slow"]),
            ]
            second = await start(client, project, plan=held, coders=["script"])
            await page.goto(f"{base}/orchestrations/{second['id']}")
            await page.locator("svg.graph g[data-packet=slow] text", has_text="implementing").wait_for(
                timeout=30_000
            )
            assert "queued" in (await page.locator("svg.graph g[data-packet=after]").text_content() or "")
            await page.click("#orc a:text-is('Cancel')")
            await page.click("button:text-is('Cancel the orchestration')")
            await page.wait_for_url(f"{base}/orchestrations/{second['id']}")
            cancelled = await finished(client, second["id"], total=30)
            assert cancelled["status"] == "cancelled"
            await page.reload()
            assert "cancelled" in await page.inner_text("#orc > p")
