"""Rules of the early start (peerd/boot.py): `status` is answered before the daemon is built, with
the same identity the daemon then loads; every other request is held and answered by the built
daemon on the same connection, never refused for "starting"; a failed start answers held requests
`unavailable`; the socket is 0600 from birth."""

from __future__ import annotations

import asyncio
import json
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from peerd import boot
from peerd.cli.client import LocalClient
from peerd.clientwire import DaemonConnectionError
from peerd.contracts import PROTOCOL_VERSION
from peerd.errors import DaemonNotRunning
from peerd.paths import Paths
from peerd.peer.identity import env_id_from_public_key, load_or_create_identity
from tests.helpers import make_repo
from tests.support.eventually import eventually


def test_the_light_identity_is_the_one_the_daemon_loads(tmp_path: Path) -> None:
    assert boot.light_identity(tmp_path) is None  # nothing yet: the full start makes it
    identity = load_or_create_identity(tmp_path)
    assert boot.light_identity(tmp_path) == (identity.env_id, identity.fingerprint_text)
    assert boot.env_id_from_public_key is env_id_from_public_key  # one function (peerd.core.envid)
    assert boot.PROTOCOL_VERSION == PROTOCOL_VERSION
    # A certificate made for another key is not trusted early (the full start rebuilds it).
    other = load_or_create_identity(tmp_path / "other")
    (tmp_path / "identity" / "cert.pem").write_bytes(
        (tmp_path / "other" / "identity" / "cert.pem").read_bytes()
    )
    assert other.env_id != identity.env_id
    assert boot.light_identity(tmp_path) is None


async def raw_call(path: Path, request: bytes) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def holding(early: boot.EarlyStart) -> bool:
    """Whether a connection the early server holds has sent its whole request head."""
    return any(b"\r\n\r\n" in h._buffer for h in early.held)


async def test_status_is_answered_early_and_other_requests_wait_for_the_daemon(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    early = boot.EarlyStart(boot.DaemonConfig(home=tmp_path, label="early", listen=None))
    await early.open()
    try:
        sock = Paths(tmp_path).socket
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        code, status = await raw_call(
            sock, b"GET /v1/status HTTP/1.1\r\nHost: peerd\r\nConnection: close\r\n\r\n"
        )
        assert code == 200 and status["state"] == "starting" and status["label"] == "early"
        assert status["counts"] == {"projects": 0, "threads": 0, "liveRuns": 0}

        held = asyncio.ensure_future(
            raw_call(sock, b"GET /v1/projects HTTP/1.1\r\nHost: peerd\r\nConnection: close\r\n\r\n")
        )
        await eventually(lambda: holding(early), what="the request held by the early server")
        await asyncio.sleep(0.3)  # a window for a wrong answer to come: an absence has no event
        assert not held.done() and holding(early)  # neither refused nor answered while not built

        app = web.Application()
        app.router.add_get("/v1/projects", _projects)
        runner = web.AppRunner(app)
        await runner.setup()
        assert runner.server is not None
        early.handoff(runner.server)  # type: ignore[arg-type]
        assert await held == (200, {"items": [], "servedBy": "daemon"})
        # New connections go to the daemon's app too.
        assert (
            await raw_call(sock, b"GET /v1/projects HTTP/1.1\r\nHost: peerd\r\nConnection: close\r\n\r\n")
        )[0] == 200
        await early.close()
        await runner.cleanup()
    finally:
        await early.close()
        if early.lock is not None:
            early.lock.close()


async def test_a_failed_start_answers_held_requests_unavailable(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    early = boot.EarlyStart(boot.DaemonConfig(home=tmp_path, listen=None))
    await early.open()
    try:
        held = asyncio.ensure_future(
            raw_call(
                Paths(tmp_path).socket,
                b"POST /v1/projects HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
            )
        )
        await eventually(lambda: holding(early), what="the request held by the early server")
        early.refuse_held("The daemon could not start: test.")
        code, body = await held
        assert code == 503 and body["code"] == "unavailable"
    finally:
        await early.close()
        if early.lock is not None:
            early.lock.close()


async def first_answer(client: LocalClient, proc: subprocess.Popen[Any]) -> dict[str, Any]:
    """The first status a just-started `peerd serve` gives (polled every 5 ms: its socket appears
    with no event to wait on), while the process lives."""

    def status() -> dict[str, Any]:
        assert proc.poll() is None, "peerd serve exited"
        answer: dict[str, Any] = client.call("GET", "/v1/status")
        return answer

    return await eventually(
        status,
        what="a status answer",
        within=60,
        every=0.005,
        ignoring=(DaemonNotRunning, DaemonConnectionError),
    )


async def _projects(_request: web.Request) -> web.Response:
    return web.json_response({"items": [], "servedBy": "daemon"})


@pytest.mark.slow
async def test_peerd_serve_answers_status_early_and_serves_what_was_asked_meanwhile(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = make_repo(tmp_path / "repo")
    load_or_create_identity(home)
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen", "--new-store"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = LocalClient(Paths(home).socket)
    try:
        status = await first_answer(client, proc)
        # The first answer is usually the early one; whichever it is, the next call is served
        # by the whole daemon (held until it is built, never refused as "starting").
        assert status["environmentId"] and status["fingerprint"].startswith("sha256:")
        added = client.call("POST", "/v1/projects", body={"path": str(repo)})
        assert added["name"] == "repo"
        ready = client.call("GET", "/v1/status")
        assert "state" not in ready and ready["environmentId"] == status["environmentId"]
        assert ready["fingerprint"] == status["fingerprint"] and ready["counts"]["projects"] == 1
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
async def test_a_sigterm_while_the_daemon_loads_ends_the_start_cleanly(tmp_path: Path) -> None:
    """The signal's default action would kill the process (exit -15) mid-start; peerd handles
    SIGTERM from its first step, so a start that is stopped still exits 0 and answers what it held."""
    home = tmp_path / "home"
    load_or_create_identity(home)
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen", "--new-store"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client = LocalClient(Paths(home).socket)
    status = await first_answer(client, proc)  # the early server's: the daemon is (most likely) loading
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, (status, stderr)
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_status_wait_waits_for_the_whole_daemon_not_its_early_answer(tmp_path: Path) -> None:
    """`peerd serve & peerd status --wait 30`: the answer is the started daemon's (its network
    listener up), not the early one that says "starting"."""
    home = tmp_path / "home"
    load_or_create_identity(home)
    argv = [sys.executable, "-m", "peerd", "--home", str(home)]
    proc = subprocess.Popen(
        [*argv, "serve", "--listen", "127.0.0.1:0", "--new-store"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = subprocess.run(
            [*argv, "status", "--wait", "60", "--json"],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert "state" not in status, status
        assert any(x["kind"] == "tcp" for x in status["listeners"]), status
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_reaches_the_early_status_with_the_standard_library_only() -> None:
    """What `peerd serve` imports before its owner socket answers `status`: the CLI (click) and
    peerd's light modules; pydantic (the config file), structlog and rich (logging), cryptography
    (the identity) and aiosqlite come after, in the thread that imports the daemon."""
    code = (
        "import sys, asyncio, socket, peerd.cli.main, peerd.boot\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    outside = set(done.stdout.split()) - {"click", "peerd", "__main__", "_distutils_hack"}
    assert {m for m in outside if not m.startswith("__editable__")} == set(), done.stdout


@pytest.mark.slow
def test_a_bad_config_file_found_after_the_early_start_exits_2_and_leaves_no_socket(tmp_path: Path) -> None:
    home = tmp_path / "home"
    load_or_create_identity(home)  # an identity: the early socket is bound before the file is read
    (home / "config.toml").write_text('label = "early"\n[runs]\nstart_slots = 0\n')
    assert boot.light_label(None, home=home) == "early"  # read with tomllib for the early answer
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen", "--new-store"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "config_invalid" in done.stderr and "runs.start_slots" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not Paths(home).socket.exists()
