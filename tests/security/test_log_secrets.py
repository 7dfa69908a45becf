"""Nothing secret in any log, at any level, nor in clear in the box's database.

Two real `peerd serve` processes at `--log-level debug` ("box" logging JSON, "laptop" the console
format), each writing its log to a file. The test drives what handles secrets: a pairing code, the
link (the first token pair), a forced refresh (a rotation: the second pair), a thread launched on
the box through the link whose scripted agent calls an agent tool and waits while the test reads its
run token, and a forwarded read. The secrets are collected from the box's answers, the laptop's
database and the live run's environment; then every log file and every database file is searched
for each in clear: the box's for all of them (it keeps only hashes), the laptop's for the pairing
secret (it holds its own tokens by design). The token also never appears in any process's argv.

An unhandled exception while serving a request, with a secret in a local variable, is logged
without it (tracebacks carry no locals).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from peerd.api.app import base_app
from peerd.api.localclient import LocalClient
from peerd.core import pairing_code
from peerd.logs import OWN_LOGGER, THIRD_PARTY_LOGGERS, configure_logging
from tests.helpers import DaemonProcess, client_for, make_repo, script
from tests.support.eventually import eventually

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


class DebugDaemon(DaemonProcess):
    """`peerd serve` at --log-level debug, its stderr (the log) in `<home>/daemon.log`."""

    def __init__(self, home: Path, *, label: str, log_format: str) -> None:
        super().__init__(home, label=label)
        self.log_format = log_format

    @property
    def log(self) -> Path:
        return self.home / "daemon.log"

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "peerd", "--home", str(self.home), "serve"),
                    *("--listen", "127.0.0.1:0", "--label", self.label),
                    *("--log-level", "debug", "--log-format", self.log_format),
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )


@contextlib.asynccontextmanager
async def debug_daemon(home: Path, label: str, log_format: str) -> AsyncIterator[DebugDaemon]:
    daemon = DebugDaemon(home, label=label, log_format=log_format)
    daemon.start()
    try:
        await daemon.ready()
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.terminate()
            try:
                await daemon.exited(timeout=20)
            except TimeoutError:
                daemon.kill()


def laptop_tokens(db: Path) -> tuple[str, str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        refresh, access = con.execute("SELECT refresh_token, access_token FROM links").fetchone()
    return str(refresh), str(access)


def expire_access_token(db: Path) -> None:
    """The laptop refreshes on its next call to the box: the refresh path, for real."""
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as con:
        con.execute("UPDATE links SET access_expires_at = 0")
        con.commit()


def processes_running(module: str, marker: str) -> Iterator[int]:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(module.encode() in a for a in argv) and any(marker.encode() in a for a in argv):
            yield int(proc.name)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


async def run_token_while_it_runs(box_home: Path, timeout: float = 30.0) -> str:
    """PEERD_RUN_TOKEN from the live scripted agent's environment (the box's, for this run)."""

    def token() -> str | None:
        for pid in processes_running("peerd.providers.script_agent", str(box_home)):
            with contextlib.suppress(OSError):
                found = environ_of(pid).get("PEERD_RUN_TOKEN")
                if found:
                    return found
        return None

    # A process we do not control: nothing to wait on but time.
    return await eventually(token, what="the scripted agent running with a run token", within=timeout)


def every_argv() -> list[bytes]:
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit():
                found.append((proc / "cmdline").read_bytes())
    return found


def files_holding(paths: list[Path], secret: str) -> list[str]:
    needle = secret.encode()
    return [str(p) for p in paths if p.exists() and needle in p.read_bytes()]


def db_files(home: Path) -> list[Path]:
    return sorted(home.glob("peerd.db*"))


async def wait_for(client: LocalClient, thread_id: str, kind: str, timeout: float = 30.0) -> None:
    await eventually(
        lambda: client.call("GET", f"/v1/threads/{thread_id}/items"),
        what=f"a {kind} item on {thread_id}",
        until=lambda page: any(i["kind"] == kind for i in page["items"]),
        within=timeout,
    )


@pytest.mark.slow
async def test_pairing_linking_refresh_and_a_run_log_no_secret(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "box-repo")
    async with (
        debug_daemon(tmp_path / "box", "box", "json") as box,
        debug_daemon(tmp_path / "laptop", "laptop", "console") as laptop,
        client_for(box.home) as bc,
        client_for(laptop.home) as lc,
    ):
        secrets: dict[str, str] = {}
        project = await bc.call("POST", "/v1/projects", body={"path": str(repo)})
        code = (await bc.call("POST", "/v1/pair", body={"access": "auto"}))["code"]
        secrets["pairing code"] = code
        secrets["pairing secret"] = pairing_code.decode(code).secret

        linked = await lc.call("POST", "/v1/links", body={"code": code, "access": "auto"})
        box_id = linked["environmentId"]
        secrets["refresh token 1"], secrets["access token 1"] = laptop_tokens(laptop.home / "peerd.db")

        expire_access_token(laptop.home / "peerd.db")
        await lc.call("GET", "/v1/projects", params={"environmentId": box_id})  # refreshes first
        secrets["refresh token 2"], secrets["access token 2"] = laptop_tokens(laptop.home / "peerd.db")
        assert secrets["refresh token 2"] != secrets["refresh token 1"], "the refresh rotated the pair"

        steps = script(
            {"tool": {"name": "project_list", "arguments": {}}},
            {"wait_for_file": "release-me"},
            {"reply": "done"},
        )
        launched = await lc.call(
            "POST",
            "/v1/threads",
            body={"environmentId": box_id, "projectId": project["id"], "prompt": steps},
        )
        thread = await bc.call("GET", f"/v1/threads/{launched['threadId']}")
        await wait_for(bc, thread["id"], "tool_call")
        secrets["run token"] = await run_token_while_it_runs(box.home)
        leaked_argv = [a for a in every_argv() if secrets["run token"].encode() in a]
        Path(thread["worktreePath"], "release-me").write_text("go\n")
        done = await lc.call(
            "GET",
            f"/v1/threads/{thread['id']}/wait",
            params={"environmentId": box_id, "run": launched["runId"], "timeout": 30},
        )
        assert done["status"] == "completed", done
        await lc.call("GET", f"/v1/threads/{thread['id']}/items", params={"environmentId": box_id})
        tool_calls = [
            i
            for i in (await bc.call("GET", f"/v1/threads/{thread['id']}/items"))["items"]
            if i["kind"] == "tool_call"
        ]
        assert tool_calls and not tool_calls[0]["data"].get("error"), tool_calls

    assert leaked_argv == [], "the run token was in a process's argv"
    logs = [box.log, laptop.log]
    assert all(len(s) >= 16 for s in secrets.values()), "the secrets searched for are real ones"
    leaks = {name: files_holding(logs + db_files(box.home), secret) for name, secret in secrets.items()}
    leaks["pairing secret (laptop db)"] = files_holding(db_files(laptop.home), secrets["pairing secret"])
    leaks["pairing code (laptop db)"] = files_holding(db_files(laptop.home), secrets["pairing code"])
    assert {name: where for name, where in leaks.items() if where} == {}
    assert '"level": "debug"' in box.log.read_text(), "peerd's own loggers do follow --log-level"
    for log in logs:
        text = log.read_text()
        assert '"logger": "aiosqlite"' not in text and "[aiosqlite]" not in text, f"{log}: third-party DEBUG"


# --- an unhandled exception -------------------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Leave the root logger, the loggers configure_logging() sets and structlog as they were."""
    root = logging.getLogger()
    names = (OWN_LOGGER, *THIRD_PARTY_LOGGERS)
    saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in names}
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)
    structlog.reset_defaults()


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "console"])
async def test_an_unhandled_exception_is_logged_without_its_locals(
    restore_logging: None, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    configure_logging(json=as_json, level=logging.DEBUG)
    pairing_secret = "Sx9-secret-held-only-in-a-local-variable"

    async def broken(request: web.Request) -> web.Response:
        code_secret = pairing_secret  # a handler's local, as in the redemption path
        raise KeyError(len(code_secret))

    app = base_app()
    app.router.add_post("/v1/pair", broken)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/pair", json={})
        body: dict[str, Any] = await resp.json()
    assert (resp.status, body["code"]) == (500, "internal_error")
    logged = capsys.readouterr().err
    assert "api.unhandled" in logged and "KeyError" in logged, logged
    assert "broken" in logged, "the frames are still there"
    assert pairing_secret not in logged  # (the source line naming the variable may be shown)
