"""A new question is announced where a person looks: a webhook (a real HTTP server on loopback)
and a desktop notification (`notify-send`), neither carrying the command line or its secrets."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from peerd.config import ApprovalsConfig, Config
from tests.helpers import client_for, make_repo, running_daemon, script
from tests.support.eventually import eventually

SECRET = "sk-live-0123456789abcdef"  # a stand-in secret a command line might carry


async def test_a_question_is_announced_without_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/topic", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shown = tmp_path / "notify-send.args"
    fake = bin_dir / "notify-send"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {shown}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")

    repo = make_repo(tmp_path / "repo")
    settings = Config(approvals=ApprovalsConfig(webhook_url=f"http://127.0.0.1:{port}/topic"))
    try:
        async with (
            running_daemon(tmp_path / "home", settings=settings) as daemon,
            client_for(daemon.paths.home) as c,
        ):
            project = await c.call("POST", "/v1/projects", body={"path": str(repo)})
            command = f"curl -H 'Authorization: Bearer {SECRET}' https://example.invalid/deploy"
            await c.call(
                "POST",
                "/v1/threads",
                body={
                    "projectId": project["id"],
                    "prompt": script({"run": command}),
                    "runtimeMode": "approval-required",
                },
            )
            await eventually(
                lambda: received and shown.exists(),
                what="the webhook's post and the desktop notice",
                within=15,
            )
            (pending,) = (await c.call("GET", "/v1/approvals"))["items"]
            assert pending["detail"]["command"] == command  # the full question stays on the machine
    finally:
        await runner.cleanup()
    (body,) = received
    assert body["approvalId"] == pending["id"] and body["kind"] == "command"
    assert "curl" in body["message"] and f"peerd approval show {pending['id']}" in body["message"]
    assert SECRET not in json.dumps(body) and "example.invalid" not in json.dumps(body)
    desktop = shown.read_text()
    assert "curl" in desktop and SECRET not in desktop
