"""What an idle daemon does not import, and what its first use loads (issue 33: idle RSS). Each
probe is a fresh Python process (this one has imported everything already): orchestration's engine
and service (`orchestrate/lazy.py`), the providers' drivers (`providers/registry.py:LazyProvider`),
the console's pages (`console/server.py`), `cryptography` (the identity read lightly without a
network listener: `peer/identity.py`), and the network app's OAuth and token libraries. A restart
with orchestration work owed loads the engine at start and resumes the work without a request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peerd.config import Config, ConsoleConfig
from peerd.orchestrate import store as ostore
from tests.helpers import client_for, git, make_repo, running_daemon

pytestmark = pytest.mark.slow

# Loaded on first need; none of them by an idle daemon without a network listener.
LAZY = (
    "peerd.orchestrate.engine",
    "peerd.orchestrate.service",
    "peerd.providers.script",
    "peerd.providers.coders",
    "peerd.providers.command",
    "peerd.console.app",
    "jinja2",
    "cryptography",
    "authlib",
    "joserfc",
    "mcp",
    "a2a",
)

PROBE = """
import asyncio, json, sys, urllib.request
from pathlib import Path
from peerd.config import Config, ConsoleConfig
from peerd.daemon import Daemon, DaemonConfig
from peerd.api.localclient import LocalClient

LAZY = {lazy!r}
HOME, REPO = Path({home!r}), {repo!r}

def loaded():
    return sorted(m for m in LAZY if m in sys.modules)

async def main():
    settings = Config(console=ConsoleConfig(listen="127.0.0.1:0"))
    daemon = Daemon(DaemonConfig(home=HOME, listen=None, settings=settings))
    await daemon.start()
    out = {{}}
    try:
        await asyncio.sleep(1.0)  # idle
        out["idle"] = loaded()
        async with LocalClient(daemon.paths.socket) as client:
            status = await client.call("GET", "/v1/status")
            out["console_url"] = status["console"]["url"]
            listed = await client.call("GET", "/v1/providers")
            out["providers"] = sorted(p["name"] for p in listed["items"])
            out["after_provider_list"] = loaded()
            out["orchestrations"] = (await client.call("GET", "/v1/orchestrations"))["items"]
            out["after_orchestrations"] = loaded()
            # the console: its first connection loads the pages, which answer it
            def fetch():
                try:
                    return urllib.request.urlopen(daemon.console.url + "/login", timeout=30).status
                except urllib.error.HTTPError as exc:
                    return exc.code
            out["console_status"] = await asyncio.to_thread(fetch)
            out["console_loaded"] = daemon.console.loaded
            out["after_console"] = loaded()
            if REPO is not None:  # a script run: the script driver loads, not the CLIs'
                project = await client.call("POST", "/v1/projects", body={{"path": REPO}})
                launched = await client.call("POST", "/v1/threads", body={{
                    "projectId": project["id"], "provider": "script",
                    "prompt": '```peerd-script\\n{{"steps": [{{"reply": "done"}}]}}\\n```'}})
                done = await client.call("GET", f"/v1/threads/{{launched['threadId']}}/wait",
                                         params={{"run": launched["runId"], "timeout": 30}})
                out["run"] = done["status"]
                out["after_run"] = loaded()
    finally:
        await daemon.shutdown()
    print(json.dumps(out))

asyncio.run(main())
"""


def probe(home: Path, repo: Path | None) -> dict[str, object]:
    code = PROBE.format(lazy=LAZY, home=str(home), repo=None if repo is None else str(repo))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip(), (done.stdout[-2000:], done.stderr[-3000:])
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def test_an_idle_daemon_loads_none_of_the_lazy_parts_and_each_loads_on_first_use(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    async with running_daemon(home, listen=None, settings=Config(console=ConsoleConfig(enabled=False))):
        pass  # the identity and the store, made by a first start: the probe's start reads them
    out = probe(home, make_repo(tmp_path / "repo"))
    assert out["idle"] == [], out
    assert out["console_url"], out  # bound at start: `peerd status` says where
    # `peerd provider list` answers from the config, without a driver
    assert {"script", "codex", "claude", "gemini"} <= set(out["providers"]), out  # type: ignore[arg-type]
    assert out["after_provider_list"] == [], out
    # the first orchestration request loads the engine, and is answered
    assert out["orchestrations"] == [], out
    assert out["after_orchestrations"] == ["peerd.orchestrate.engine", "peerd.orchestrate.service"], out
    # (the console's pages bring `cryptography`, through the health page's `peerd doctor` checks)
    # the console's first connection loads its pages, which answer it (the login page, no token)
    assert out["console_loaded"] is True and out["console_status"] in (200, 400, 401, 403), out
    assert {"peerd.console.app", "jinja2"} <= set(out["after_console"]), out  # type: ignore[arg-type]
    # a script run loads the script driver only, and completes
    assert out["run"] == "completed", out
    new = set(out["after_run"]) - set(out["after_console"])  # type: ignore[arg-type]
    assert "peerd.providers.script" in new and "peerd.providers.coders" not in new, out
    # (the run's start loads the MCP SDK for its tools, in a thread: it brings `cryptography`)


RESTART = """
import asyncio, json, sys
from pathlib import Path
from peerd.daemon import Daemon, DaemonConfig
from peerd.api.localclient import LocalClient

async def main():
    daemon = Daemon(DaemonConfig(home=Path({home!r}), listen=None))
    await daemon.start()
    out = {{"at_start": "peerd.orchestrate.engine" in sys.modules, "loaded": daemon.orchestrations.loaded}}
    try:
        db = daemon.db
        for _ in range(300):  # the cancel the last daemon left half done ends, with no request
            row = await db.fetchone("SELECT status FROM orchestrations WHERE id = ?", ({run_id!r},))
            if row["status"] != "cancelling":
                break
            await asyncio.sleep(0.1)
        out["status"] = row["status"]
    finally:
        await daemon.shutdown()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_a_restart_that_owes_orchestration_work_loads_the_engine_at_start_and_resumes_it(
    tmp_path: Path,
) -> None:
    home, repo = tmp_path / "home", make_repo(tmp_path / "repo")
    async with running_daemon(
        home, listen=None, settings=Config(console=ConsoleConfig(enabled=False))
    ) as daemon:
        assert daemon.db is not None
        async with client_for(home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        head = git(repo, "rev-parse", "HEAD").strip()
        run = await ostore.create(
            daemon.db,
            project_id=project["id"],
            task="t",
            request={"coders": [{"spec": "script", "backend": "script", "reason": "t"}]},
            base_commit=head,
            now=1.0,
        )
        # the daemon stops in the middle of a cancel: recorded, not finished
        await ostore.set_status(daemon.db, run.id, "cancelling", now=2.0, reason="stopped by the test")
    code = RESTART.format(home=str(home), run_id=run.id)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip(), (done.stdout[-2000:], done.stderr[-3000:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"at_start": True, "loaded": True, "status": "cancelled"}, (out, done.stderr[-3000:])
