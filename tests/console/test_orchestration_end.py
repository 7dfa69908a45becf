"""Issue 32: an orchestration that integrated nothing shows its own end state in the console, on
its page (with the words the report uses) and in the list (with its reason), never `completed`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.config import ConsoleConfig
from tests.helpers import client_for, running_daemon
from tests.support.console import console_url, signed_in
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    project_repo,
    settings,
    start,
    steps,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

REJECT = {"verdict": "reject", "summary": "No.", "evidence": [{"file": "calc.py", "reason": "wrong"}]}


async def test_an_orchestration_that_integrated_nothing_shows_not_integrated(
    browser: Any, tmp_path: Path
) -> None:
    repo = project_repo(tmp_path / "repo")
    config = settings(tmp_path, {"fix": [REJECT]}).model_copy(
        update={"console": ConsoleConfig(listen="127.0.0.1:0")}
    )
    async with (
        running_daemon(tmp_path / "home", label="laptop", settings=config) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = [packet("fix", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD)]
        done = await finished(client, (await start(client, project, plan=plan, coders=["script"]))["id"])
        assert done["status"] == "not_integrated"
        page = await signed_in(browser, daemon)
        base = console_url(daemon)
        await page.goto(f"{base}/orchestrations/{done['id']}")
        header = await page.inner_text("#orc > p")
        assert "not_integrated (nothing was integrated)" in header and "completed" not in header, header
        assert await page.locator("#orc > p .badge.not_integrated").count() == 1
        await page.goto(f"{base}/orchestrations")
        row = await page.inner_text("table.cards tbody tr")
        assert "not_integrated" in row and "0 packet(s) integrated" in row and "parked: fix" in row, row
