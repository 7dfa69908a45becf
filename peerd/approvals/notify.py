"""Telling a person that an approval waits: a desktop notification where one can be shown
(`notify-send`, with a session bus or a display), and an optional webhook (`[approvals]
webhook_url`, e.g. an ntfy topic) that gets a JSON summary.

No secrets leave this way: a command's arguments may hold a token, so what is sent names the
program and the thread, never the command line, a file's content or a tool's arguments. The full
question is on this machine (`peerd approval show ID`). Best effort: a notification that fails is
logged and never delays or changes the approval.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from peerd.approvals.rules import Approval

log = structlog.get_logger(__name__)

WEBHOOK_TIMEOUT_S = 5.0


def public_summary(approval: Approval) -> str:
    """The question without its arguments: what may be said outside this machine."""
    detail = approval.detail
    if approval.kind == "command":
        try:
            words = shlex.split(str(detail.get("command", "")))
        except ValueError:
            words = str(detail.get("command", "")).split()
        program = Path(words[0]).name if words else "a command"
        return f"run {program} (a command)"
    if approval.kind == "file_change":
        changes = detail.get("changes") or []
        count = len(changes) if isinstance(changes, list) else 0
        return f"change {count} file{'s' if count != 1 else ''}" if count else "change files"
    if approval.kind == "mcp_tool":
        return f"call the MCP tool {detail.get('tool', '?')} of {detail.get('server', '?')}"
    return f"use the tool {approval.tool}"


def webhook_body(approval: Approval, *, environment: str) -> dict[str, Any]:
    where = f" (from {approval.link_label})" if approval.link_label else ""
    return {
        "title": f"peerd: approval needed on {environment}",
        "message": f"A run asks to {public_summary(approval)}{where}. peerd approval show {approval.id}",
        "approvalId": approval.id,
        "threadId": approval.thread_id,
        "environment": environment,
        "kind": approval.kind,
        "deadline": approval.deadline_at,
    }


def desktop_available(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    has_session = bool(
        env.get("DBUS_SESSION_BUS_ADDRESS") or env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")
    )
    return has_session and shutil.which("notify-send", path=env.get("PATH")) is not None


class Notifier:
    def __init__(self, *, environment: str, desktop: bool, webhook_url: str | None) -> None:
        self.environment = environment
        self.desktop = desktop and desktop_available()
        self.webhook_url = webhook_url
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent: list[dict[str, Any]] = []  # what was sent, for `peerd doctor` and tests

    def announce(self, approval: Approval) -> None:
        if not self.desktop and not self.webhook_url:
            return
        task = asyncio.create_task(self._announce(approval))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _announce(self, approval: Approval) -> None:
        body = webhook_body(approval, environment=self.environment)
        if self.desktop:
            await self._desktop(body)
        if self.webhook_url:
            await self._webhook(self.webhook_url, body)
        self.sent.append(body)

    async def _desktop(self, body: dict[str, Any]) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                "notify-send",
                "--app-name=peerd",
                str(body["title"]),
                str(body["message"]),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(proc.wait(), WEBHOOK_TIMEOUT_S)
        except (OSError, TimeoutError):
            log.info("desktop notification not shown")

    async def _webhook(self, url: str, body: dict[str, Any]) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_S)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(url, json=body, headers={"Title": str(body["title"])}) as response,
            ):
                if response.status >= 400:
                    log.info("approval webhook refused", status=response.status)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            log.info("approval webhook not reached")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
