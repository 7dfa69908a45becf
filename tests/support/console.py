"""The console's browser tests: their daemons' settings (a console on port 0), signing a browser in,
and screenshots of each page at desktop and phone width into `.cache/console-shots/` (git-ignored)
for a person to look at; `docs/user/console/` holds the few the user guide shows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from peerd.config import Config, ConsoleConfig
from peerd.daemon import Daemon
from tests.helpers import client_for

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / ".cache" / "console-shots"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def console_settings(*, public_url: str | None = None, **extra: Any) -> Config:
    return Config(console=ConsoleConfig(listen="127.0.0.1:0", public_url=public_url), **extra)


def console_url(daemon: Daemon) -> str:
    assert daemon.console is not None and daemon.console.url is not None, daemon.console
    return daemon.console.url


async def login_url(daemon: Daemon) -> str:
    async with client_for(daemon.paths.home) as client:
        data = await client.call("POST", "/v1/console/login-token")
    return str(data["url"])


async def signed_in(browser: Any, daemon: Daemon) -> Any:
    """A fresh browser context signed in to `daemon`'s console, at its Environment page."""
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    await page.goto(await login_url(daemon))
    await page.wait_for_url(console_url(daemon) + "/")
    return page


DOCS = REPO / "docs" / "user" / "console"
DOC_DESKTOP = {"width": 1024, "height": 720}
# The shots docs/user/console.md shows: written there (the visible part only, to stay small) when
# PEERD_CONSOLE_DOC_SHOTS=1; the tests compare nothing against them.
DOC_SHOTS = {
    "environment": ("desktop",),
    "connections": ("desktop", "phone"),
    "pair": ("desktop",),
    "threads-fleet": ("desktop",),
    "thread": ("desktop", "phone"),
    "thread-lineage": ("desktop",),
    "tasks": ("desktop", "phone"),
    "orchestration": ("desktop",),
    "login": ("desktop",),
    "board": ("desktop", "phone"),
    "thread-conversation": ("desktop",),
    "thread-diff": ("desktop",),
    "fleet": ("desktop",),
    "move": ("desktop",),
}


async def shot(page: Any, name: str) -> None:
    """`name` at desktop and phone width, under .cache/console-shots/."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        await page.set_viewport_size(size)
        await page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=True)
        if os.environ.get("PEERD_CONSOLE_DOC_SHOTS") == "1" and label in DOC_SHOTS.get(name, ()):
            DOCS.mkdir(parents=True, exist_ok=True)
            await page.set_viewport_size(DOC_DESKTOP if label == "desktop" else size)
            await page.screenshot(path=str(DOCS / f"{name}-{label}.png"))
    await page.set_viewport_size(DESKTOP)
