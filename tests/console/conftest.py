"""The console's browser tests: Debian's chromium driven by Playwright (no browser download), on
real daemons whose consoles listen on port 0.

Screenshots of each page at desktop and phone width go to `.cache/console-shots/` (git-ignored)
for a person to look at; `docs/user/console/` holds the few the user guide shows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import async_playwright

INSTALL = "apt-get install -y chromium  (or: make test, which installs it when it can)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives a real Chromium (make test runs these)")


def chromium_path() -> str:
    found = os.environ.get("PEERD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(f"The console's browser tests need Chromium; install it: {INSTALL}", pytrace=False)
    return found


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    path = chromium_path()
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=path)
        try:
            yield launched
        finally:
            await launched.close()
