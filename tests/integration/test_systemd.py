"""systemd integration: a real `peerd serve` speaking sd_notify to a socket standing in for
systemd, and `systemd-analyze verify` of the shipped units (skipped only where it is not installed).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, client_for, notify_socket

UNITS = Path(__file__).resolve().parents[2] / "systemd"
RECV_TIMEOUT_S = 30.0
WATCHDOG_USEC = 200_000  # a ping every 0.1 s


class FakeSystemd:
    """The receiving end of NOTIFY_SOCKET: a bound Unix datagram socket, read with timeouts."""

    def __init__(self, sock: socket.socket, value: str) -> None:
        self.sock = sock
        self.value = value  # what NOTIFY_SOCKET says
        self.received: list[dict[str, str]] = []

    async def next(self) -> dict[str, str]:
        loop = asyncio.get_running_loop()
        data = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), RECV_TIMEOUT_S)
        message = dict(line.split("=", 1) for line in data.decode().split("\n"))
        self.received.append(message)
        return message

    async def until(self, key: str) -> dict[str, str]:
        while True:
            message = await self.next()
            if key in message:
                return message

    def drain(self) -> list[dict[str, str]]:
        """Whatever is still queued, without waiting (the sender has exited)."""
        rest: list[dict[str, str]] = []
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return rest
            rest.append(dict(line.split("=", 1) for line in data.decode().split("\n")))


@pytest.fixture(params=["path", "abstract"])
def fake_systemd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeSystemd]:
    sock, value = notify_socket(request.param, tmp_path)
    sock.setblocking(False)
    with sock:
        yield FakeSystemd(sock, value)


@pytest.mark.slow
async def test_ready_once_serving_then_watchdog_pings_then_stopping_on_sigterm(
    tmp_path: Path, fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", fake_systemd.value)  # the subprocess inherits them
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    home = tmp_path / "home"
    daemon = DaemonProcess(home, label="sdbox")
    try:
        daemon.start()
        ready = await fake_systemd.next()
        assert ready.get("READY") == "1", f"the first message must be READY=1, got {ready}"
        # READY=1 means serving: the very first request is answered, with no retry.
        async with client_for(home) as client:
            status = await client.call("GET", "/v1/status")
        addresses = [listener["address"] for listener in status["listeners"]]
        assert any(address.startswith("https://127.0.0.1:") for address in addresses)
        assert ready["STATUS"] == f"Serving sdbox on {', '.join(addresses)}"

        for _ in range(3):  # the pings keep coming while it runs
            assert await fake_systemd.next() == {"WATCHDOG": "1"}

        daemon.signal(signal.SIGTERM)
        stopping = await fake_systemd.until("STOPPING")
        assert stopping["STOPPING"] == "1" and stopping["STATUS"].startswith("Stopping")
        assert await daemon.exited(30) == 0
        assert fake_systemd.drain() == []  # no ping after STOPPING=1
        assert all(set(m) == {"WATCHDOG"} for m in fake_systemd.received[1:-1])
    finally:
        daemon.kill()


@pytest.mark.slow
async def test_a_watchdog_meant_for_another_process_is_not_pinged(
    tmp_path: Path, fake_systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", fake_systemd.value)
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))  # this test's pid, not the daemon's
    daemon = DaemonProcess(tmp_path / "home", label="sdbox")
    try:
        daemon.start()
        assert (await fake_systemd.next())["READY"] == "1"
        async with client_for(daemon.home) as client:  # a round trip: the loop has turned since
            await client.call("GET", "/v1/status")
        daemon.signal(signal.SIGTERM)
        # Had it pinged (at once, then every 0.1 s), a WATCHDOG=1 would come before STOPPING=1.
        assert (await fake_systemd.next())["STOPPING"] == "1"
        assert await daemon.exited(30) == 0
    finally:
        daemon.kill()


# --- systemd-analyze verify -----------------------------------------------------------------------

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def installed_peerd() -> Path:
    """The `peerd` of the environment running the tests, which the units' ExecStart is pointed at
    (verify checks that the binary exists and is executable)."""
    peerd = Path(sys.executable).parent / "peerd"
    assert peerd.is_file() and os.access(peerd, os.X_OK), f"{peerd} is not installed (make venv)"
    return peerd


def with_exec_start(unit: Path, target: Path, binary: Path) -> Path:
    text, count = re.subn(r"^ExecStart=\S+", f"ExecStart={binary}", unit.read_text(), flags=re.MULTILINE)
    assert count == 1, f"{unit.name} must have exactly one ExecStart= line"
    target.write_text(text)
    return target


@pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (it ships with systemd)"
)
@pytest.mark.parametrize(("name", "user"), [("peerd.service", True), ("peerd@.service", False)])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, name: str, user: bool) -> None:
    assert SYSTEMD_ANALYZE is not None
    units = tmp_path / "units"
    units.mkdir()
    unit = with_exec_start(UNITS / name, units / name, installed_peerd())
    env = dict(os.environ)
    argv = [SYSTEMD_ANALYZE]
    if user:
        argv.append("--user")
        if not env.get("XDG_RUNTIME_DIR"):  # a user manager needs one, even only to verify
            runtime = tmp_path / "runtime"
            runtime.mkdir(mode=0o700)
            env["XDG_RUNTIME_DIR"] = str(runtime)
    argv += ["verify", str(unit)]
    done = subprocess.run(argv, cwd=units, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # verify exits 0 on an unknown key or an unparsable value ("..., ignoring"): those count too.
    unit_stem = name.removesuffix(".service")
    complaints = [line for line in output.splitlines() if unit_stem in line or "ignoring" in line]
    assert complaints == [], output
