"""Values are checked before anything is sent: a usage error (exit 2) in one sentence, nothing
launched or made; a finished wait says why a run did not complete."""

from __future__ import annotations

from typing import Any

from peerd.api.localclient import LocalClient
from peerd.cli.common import EXIT_USAGE
from peerd.daemon import Daemon
from tests.helpers import script
from tests.support.cli import home_of, peerd


async def test_bad_values_are_usage_errors_and_change_nothing(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    home = home_of(daemon)
    cases = [
        ["thread", "launch", "--project", project["id"], "--prompt", "x", "--wait", "-5"],
        ["thread", "wait", "thr_x", "--timeout", "-1"],
        ["pair", "--ttl", "0"],
        ["pair", "--ttl", "0s"],
        ["link", "-"],  # empty stdin
    ]
    for args in cases:
        done = await peerd(home, *args)
        assert done.returncode == EXIT_USAGE, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "Input should be" not in done.stderr, done.stderr
    assert (await client.call("GET", "/v1/threads"))["items"] == []
    assert (await client.call("GET", "/v1/pair"))["items"] == []


async def test_a_wait_says_why_the_run_failed(daemon: Daemon, project: dict[str, Any]) -> None:
    prompt = script({"fail": "the tests are red (3 failing)"})
    args = ["thread", "launch", "--project", project["id"], "--prompt", prompt, "--wait", "30"]
    done = await peerd(home_of(daemon), *args)
    assert "failed: the tests are red (3 failing)" in done.stdout, done.stdout
