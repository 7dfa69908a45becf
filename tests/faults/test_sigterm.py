"""SIGTERM while a forwarded long-poll waits: the laptop (which forwards it) and the box (which
holds the wait) each stop at once, and the waiting client gets an answer, not a dropped connection.
Real `peerd serve` subprocesses; times are measured from the signal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.errors import DaemonNotRunning, PeerdError
from tests.faults.harness import FULL, REPORT, Outcome, Row, linked_world, table
from tests.helpers import script

pytestmark = pytest.mark.slow  # two daemons

WAIT_S = 40.0  # the forwarded wait's own timeout: far longer than a stop may take
STOP_WITHIN_S = 1.0


async def forwarded_wait(w: Any, thread_id: str, run_id: str) -> str:
    """What the laptop's client got for `thread wait --env box` once the signal came."""
    try:
        async with w.client("laptop", environment_id=w.box_id) as c:
            await c.call("GET", f"/v1/threads/{thread_id}/wait", params={"run": run_id, "timeout": WAIT_S})
    except PeerdError as exc:
        return exc.code
    except (DaemonNotRunning, OSError) as exc:
        return f"dropped ({type(exc).__name__})"
    return "an answer"


async def test_sigterm_with_a_forwarded_wait(tmp_path: Path) -> None:
    row = Row("SIGTERM, forwarded wait open")
    REPORT.append(row)
    for stopped in ("laptop", "box") if FULL else ("laptop",):
        async with linked_world(tmp_path / stopped) as w:
            launched = await w.call(
                "laptop",
                "POST",
                "/v1/threads",
                body={"environmentId": w.box_id, "projectId": w.there, "prompt": script({"wait": 60})},
            )
            waiting = asyncio.create_task(forwarded_wait(w, launched["threadId"], launched["runId"]))
            await asyncio.sleep(1.0)  # the wait is on the wire (nothing reports that it arrived)
            assert not waiting.done(), waiting.result()
            loop = asyncio.get_running_loop()
            signalled = loop.time()
            w.side(stopped).term()
            got = await asyncio.wait_for(waiting, 30)
            answered = loop.time() - signalled
            code = await w.side(stopped).exited()
            exited = loop.time() - signalled
        out = Outcome(settled=True, settle_s=exited)
        out.notes.append(
            f"{stopped} stopped: the client got {got} after {answered:.1f} s; exit {code} after {exited:.1f} s"
        )
        if exited > STOP_WITHIN_S or answered > STOP_WITHIN_S or got.startswith("dropped"):
            out.stuck = 1
        row.add(out)
    assert row.clean, "\n".join(table(REPORT))


async def test_sigterm_with_runs_and_a_follower_live(tmp_path: Path) -> None:
    """Issue 30: stop within a second with a run live here, its delegated task's child live on the
    box, and the follower long-polling the box for it (a 50 s chunk in flight)."""
    row = Row("SIGTERM, run + follower live")
    REPORT.append(row)
    async with linked_world(tmp_path) as w:
        child = script({"wait": 60})
        parent = script(
            {
                "tool": {
                    "name": "delegate_task",
                    "arguments": {"task": child, "target": {"environmentId": w.box_id}},
                }
            },
            {"wait": 60},
        )
        await w.call("laptop", "POST", "/v1/threads", body={"projectId": w.here, "prompt": parent})

        async def followed() -> bool:
            tasks = (await w.call("laptop", "GET", "/v1/tasks"))["items"]
            return bool(tasks) and tasks[0]["status"] == "running" and tasks[0].get("remoteChild") is not None

        deadline = asyncio.get_running_loop().time() + 30
        while not await followed():
            assert asyncio.get_running_loop().time() < deadline, "the delegation never ran on the box"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # the follower's long-poll is on the wire
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        w.side("laptop").term()
        code = await w.side("laptop").exited()
        exited = loop.time() - signalled
    out = Outcome(settled=True, settle_s=exited)
    out.notes.append(f"laptop stopped with a run and a follower live: exit {code} after {exited:.2f} s")
    if exited > STOP_WITHIN_S:
        out.stuck = 1
    row.add(out)
    assert row.clean, "\n".join(table(REPORT))


async def test_sigterm_with_the_console_streaming(tmp_path: Path) -> None:
    """Issue 30's 4-5.6 s stop, a case not built before: the console open in a browser, streaming
    a box's thread through the link (SSE) and waiting on the approvals page's live poll, plus a
    CLI `approval watch` long-poll; the laptop must still stop within a second."""
    row = Row("SIGTERM, console streams open")
    REPORT.append(row)
    async with linked_world(tmp_path) as w:
        launched = await w.call(
            "laptop",
            "POST",
            "/v1/threads",
            body={"environmentId": w.box_id, "projectId": w.there, "prompt": script({"wait": 60})},
        )
        login = await w.call("laptop", "POST", "/v1/console/login-token")
        base = login["url"].split("/login", 1)[0]
        async with aiohttp.ClientSession() as browser:
            async with browser.get(login["url"]) as signed:
                assert signed.status == 200
                # A Secure cookie, which a browser keeps for http://127.0.0.1; aiohttp does not.
                cookie = "; ".join(f"{k}={m.value}" for k, m in signed.cookies.items())
            browser.headers["Cookie"] = cookie  # type: ignore[index]
            stream = await browser.get(f"{base}/threads/{w.box_id}/{launched['threadId']}/stream")
            assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
            live = asyncio.create_task(
                browser.get(f"{base}/approvals/live", params={"changedFrom": "0" * 16})
            )
            watching = asyncio.create_task(
                w.call("laptop", "GET", "/v1/approvals", params={"changedFrom": "0" * 16, "timeout": 45})
            )
            await asyncio.sleep(1.0)  # each is in its long wait (nothing reports that it arrived)
            loop = asyncio.get_running_loop()
            signalled = loop.time()
            w.side("laptop").term()
            code = await w.side("laptop").exited()
            exited = loop.time() - signalled
            stream.close()
            for task in (live, watching):
                task.cancel()
            results = await asyncio.gather(live, watching, return_exceptions=True)
            for result in results:
                if isinstance(result, aiohttp.ClientResponse):
                    result.close()
    out = Outcome(settled=True, settle_s=exited)
    out.notes.append(
        f"laptop stopped with console streams and a watch open: exit {code} after {exited:.2f} s"
    )
    if exited > STOP_WITHIN_S:
        out.stuck = 1
    row.add(out)
    assert row.clean, "\n".join(table(REPORT))
