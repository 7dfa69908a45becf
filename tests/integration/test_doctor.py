"""`peerd doctor` as a real subprocess against real daemons in this test's loop: a healthy one, one
with a database others can read, none at all, and a laptop whose linked box stopped."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.common import EXIT_ERROR, EXIT_OK
from peerd.config import Config, ConsoleConfig
from tests.helpers import free_port, running_daemon, two_daemons

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)

CLI_TIMEOUT_S = 60.0


async def doctor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", "--home", str(home), "doctor", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def report(done: subprocess.CompletedProcess[str], code: int) -> dict[str, dict[str, Any]]:
    """The checks by name, after checking the exit code and the `ok` flag agree with it."""
    assert done.returncode == code, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    data = json.loads(done.stdout)
    assert data["ok"] is (code == EXIT_OK)
    checks = {ch["name"]: ch for ch in data["checks"]}
    assert len(checks) == len(data["checks"]), "check names are unique"
    for ch in data["checks"]:
        assert ch["status"] in ("ok", "warn", "fail", "skip")
        assert (ch["fix"] is not None) == (ch["status"] in ("warn", "fail")), ch
    return checks


async def test_a_healthy_daemon_passes(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home") as daemon:
        checks = report(await doctor(daemon.paths.home, "--json"), EXIT_OK)
        assert daemon.identity is not None
        fingerprint = daemon.identity.fingerprint_text
    for name in ("daemon", "home", "socket", "database", "identity-dir", "identity-key", "listeners", "git"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "running: test" in checks["daemon"]["detail"]
    assert checks["certificate"]["status"] == "ok"
    assert checks["certificate"]["detail"].startswith(fingerprint)
    assert "matches the running daemon" in checks["certificate"]["detail"]
    assert "loopback only" in checks["listeners"]["detail"]
    assert checks["links"] == {
        "name": "links",
        "status": "ok",
        "detail": "no linked environments",
        "fix": None,
    }
    assert checks["provider:script"]["status"] == "ok"
    for kind in ("codex", "claude", "gemini"):  # found or not on this machine: never a failure
        assert checks[f"provider:{kind}"]["status"] in ("ok", "warn")


async def test_a_database_others_can_read_fails_with_the_chmod_fix(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home") as daemon:
        db = daemon.paths.db
        db.chmod(0o644)
        as_json, as_text = await asyncio.gather(
            doctor(daemon.paths.home, "--json"), doctor(daemon.paths.home)
        )
    checks = report(as_json, EXIT_ERROR)
    assert checks["database"]["status"] == "fail"
    assert "mode 0644, expected 0600: group and others can read it" in checks["database"]["detail"]
    assert checks["database"]["fix"] == f"Run `chmod 600 {db}`."
    assert as_text.returncode == EXIT_ERROR
    lines = as_text.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  database"))
    assert lines[at + 1] == f"      fix: Run `chmod 600 {db}`."
    assert lines[-1].endswith("1 failed, 0 skipped")


async def test_without_a_daemon_the_files_are_checked_and_the_rest_skipped(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home") as daemon:
        home = daemon.paths.home
    checks = report(await doctor(home, "--json"), EXIT_ERROR)
    assert checks["daemon"]["status"] == "fail"
    assert "no daemon answers at" in checks["daemon"]["detail"]
    assert f"peerd --home {home} serve" in checks["daemon"]["fix"]
    for name in ("home", "database", "identity-dir", "identity-key", "git"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "not compared: the daemon is not running" in checks["certificate"]["detail"]
    for name in ("socket", "listeners", "links", "providers"):
        assert checks[name]["status"] == "skip", checks[name]
    assert not any(name.startswith(("link:", "provider:")) for name in checks)


async def test_a_linked_box_that_stopped_is_a_warning(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        await pair.link()
        home = pair.laptop.paths.home
        linked = report(await doctor(home, "--json"), EXIT_OK)["link:box"]
        assert linked["status"] == "ok", linked
        assert f"reachable at {pair.box_url}" in linked["detail"]

        await pair.box.shutdown()
        checks = report(await doctor(home, "--json"), EXIT_OK)  # a warning does not fail
    stopped = checks["link:box"]
    assert stopped["status"] == "warn"
    assert stopped["detail"].startswith("box does not answer: ")
    assert pair.box_url in stopped["detail"]
    assert "its token expires on" in stopped["detail"]
    assert "`peerd environment show box`" in stopped["fix"]


async def test_two_daemons_on_one_machine_each_get_a_console_and_say_where(tmp_path: Path) -> None:
    """linking.md's "try it on one machine": the second daemon's console port is taken, so it
    listens on a free one; `peerd status` prints each console's URL and `peerd doctor` warns."""
    port = free_port()
    settings = Config(console=ConsoleConfig(listen=f"127.0.0.1:{port}"))
    async with (
        running_daemon(tmp_path / "laptop", settings=settings) as first,
        running_daemon(tmp_path / "box", settings=settings) as second,
    ):
        checks = [report(await doctor(d.paths.home, "--json"), EXIT_OK)["console"] for d in (first, second)]
        statuses = [await status(d.paths.home) for d in (first, second)]
    assert checks[0] == {"name": "console", "status": "ok", "detail": f"http://127.0.0.1:{port}", "fix": None}
    assert checks[1]["status"] == "warn" and "port was taken" in checks[1]["detail"]
    moved = checks[1]["detail"].split(":")[:3]
    assert moved[:2] == ["http", "//127.0.0.1"] and moved[2] != str(port)
    assert re.search(rf"^console +{re.escape(checks[0]['detail'])}$", statuses[0], re.MULTILINE), statuses[0]
    assert re.search(rf"^console +{re.escape(':'.join(moved))}$", statuses[1], re.MULTILINE), statuses[1]
    assert re.search(r"^console note +console\.listen .* was taken", statuses[1], re.MULTILINE)


async def status(home: Path) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", "--home", str(home), "status"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=True,
    )
    return done.stdout
