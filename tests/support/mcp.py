"""A scripted run kept live while a block runs, with the run token it wrote (`live_run`): what the
MCP tests call tools as; and `peerd mcp` fed lines on stdin (`bridge`, `INITIALIZE`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import LocalClient, script, wait_terminal


@dataclass
class LiveRun:
    token: str
    token_file: Path
    thread_id: str
    run_id: str
    release: Path


@asynccontextmanager
async def live_run(client: LocalClient, project: dict[str, Any], tmp_path: Path) -> AsyncIterator[LiveRun]:
    """A scripted run that is live until the block ends; its token, which it wrote to a file."""
    token_file, release = tmp_path / "token", tmp_path / "release"
    prompt = script(
        {"run": f'printf %s "$PEERD_RUN_TOKEN" > {token_file}'},
        {"wait_for_file": str(release)},
        {"reply": "done"},
    )
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    while not token_file.exists() or not token_file.read_text():
        await client.call("GET", f"/v1/threads/{launched['threadId']}/wait", params={"timeout": 0.2})
    run = LiveRun(token_file.read_text(), token_file, launched["threadId"], launched["runId"], release)
    try:
        yield run
    finally:
        release.write_text("go")
        await wait_terminal(client, run.thread_id, run.run_id)


async def bridge(env: dict[str, str], *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """Run `python -m peerd.mcp_proxy` with these lines on stdin (the daemon answers meanwhile:
    it runs in this loop); the lines it wrote."""
    lines = "".join(json.dumps(m) + "\n" for m in messages)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd.mcp_proxy"],
        input=lines,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
