"""`--json FIELDS` on a command that changes something is checked before anything is sent."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.cli.answer_fields import ANSWER_FIELDS
from peerd.cli.common import EXIT_USAGE
from peerd.daemon import Daemon
from tests.helpers import script
from tests.support.cli import ok, peerd

ROOT = Path(__file__).resolve().parents[2]


def refused(done: subprocess.CompletedProcess[str], field: str) -> None:
    assert done.returncode == EXIT_USAGE, done
    assert f"No field '{field}' in the answer" in done.stderr, done.stderr
    assert "Nothing was sent." in done.stderr


async def test_an_unknown_field_changes_nothing(
    daemon: Daemon, client: LocalClient, project: dict[str, Any], tmp_path: Path
) -> None:
    home = daemon.paths.home
    launch = ["thread", "launch", "--project", str(project["id"]), "--prompt", script({"reply": "hi"})]
    refused(await peerd(home, *launch, "--json", "threadId,bogus"), "bogus")
    refused(await peerd(home, "pair", "--json", "nope"), "nope")
    refused(await peerd(home, "project", "add", str(tmp_path), "--json", "ghost"), "ghost")
    assert (await client.call("GET", "/v1/threads"))["items"] == []
    assert (await client.call("GET", "/v1/pair"))["items"] == []
    assert len((await client.call("GET", "/v1/projects"))["items"]) == 1

    # Known fields still work, the launch's `wait` included.
    out = ok(await peerd(home, *launch, "--wait", "30", "--json", "threadId,wait"))
    assert '"threadId"' in out and '"wait"' in out


def test_the_generated_answer_fields_are_current() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "tools" / "gen_answer_fields.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["links", "projects", "providers", "tasks", "threads"])
def test_every_route_named_has_answer_fields(module: str) -> None:
    text = (ROOT / "peerd" / "cli" / f"{module}.py").read_text()
    for route in re.findall(r'json_option_for\("([^"]+)"', text):
        assert route in ANSWER_FIELDS, route
