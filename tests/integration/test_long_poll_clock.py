"""A long-poll's deadline is on the daemon's one clock (`Daemon(config, clock=...)`, through the
change feed: `runtime/feed.py`): a daemon on a fake clock holds a long-poll until the test moves
that clock past its timeout, however long it really takes, and answers it then."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from peerd.config import Config
from peerd.daemon import Daemon, DaemonConfig
from tests.fakeclock import FakeClock
from tests.helpers import client_for, make_repo, script, wait_terminal
from tests.support.eventually import eventually
from tests.support.inflight import awaiting


async def test_a_long_poll_times_out_when_the_daemon_s_clock_says_so(tmp_path: Path) -> None:
    clock = FakeClock(wall=time.time())
    daemon = Daemon(
        DaemonConfig(home=tmp_path / "home", label="t", listen=None, settings=Config()), clock=clock
    )
    await daemon.start()
    try:
        async with client_for(daemon.paths.home) as client:
            project = await client.call(
                "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))}
            )
            launched = await client.call(
                "POST", "/v1/threads", body={"projectId": project["id"], "prompt": script({"reply": "done"})}
            )
            thread_id = launched["threadId"]
            assert (await wait_terminal(client, thread_id))["status"] == "completed"
            cursor = (await client.call("GET", f"/v1/threads/{thread_id}/events", params={"limit": 100}))[
                "nextCursor"
            ]
            poll = asyncio.ensure_future(
                client.call("GET", f"/v1/threads/{thread_id}/events", params={"after": cursor, "timeout": 40})
            )
            await eventually(
                lambda: awaiting("Operations.thread_events", "ChangeFeed.wait_any"), what="the poll parked"
            )
            clock.advance(39)  # not yet: it waits on
            await asyncio.sleep(0)
            assert awaiting("Operations.thread_events", "ChangeFeed.wait_any") and not poll.done()
            clock.advance(1)  # its 40 s are up on the daemon's clock: it answers now, with nothing new
            answer = await asyncio.wait_for(poll, 5)
            assert answer == {"events": [], "nextCursor": cursor}
    finally:
        await daemon.shutdown()
