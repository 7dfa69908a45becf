"""The sd_notify client: reading the environment, the datagrams it sends, and never failing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from peerd.sdnotify import Notifier, NotifySettings, parse_env, serving_status
from tests.helpers import notify_socket

PID = 4242
RECV_TIMEOUT_S = 10.0


# --- parse_env ---------------------------------------------------------------------------------


def test_no_notify_socket_means_nothing_to_do() -> None:
    assert parse_env({}, PID) == NotifySettings()
    assert parse_env({"NOTIFY_SOCKET": ""}, PID) == NotifySettings()


def test_a_path_is_used_as_it_is() -> None:
    settings = parse_env({"NOTIFY_SOCKET": "/run/user/1000/systemd/notify"}, PID)
    assert settings.address == "/run/user/1000/systemd/notify"
    assert settings.watchdog_interval_s is None and settings.problems == ()


def test_an_abstract_name_gets_its_leading_nul() -> None:
    assert parse_env({"NOTIFY_SOCKET": "@/org/freedesktop/systemd1/notify"}, PID).address == (
        "\0/org/freedesktop/systemd1/notify"
    )


@pytest.mark.parametrize("value", ["@", "relative/notify", "vsock:2:1234"])
def test_an_unusable_socket_is_reported_and_ignored(value: str) -> None:
    settings = parse_env({"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "30000000"}, PID)
    assert settings.address is None and settings.watchdog_interval_s is None
    assert any(value in problem for problem in settings.problems)


def test_the_watchdog_is_pinged_every_half_of_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": "30000000"}
    assert parse_env(env, PID).watchdog_interval_s == 15.0
    assert parse_env({**env, "WATCHDOG_USEC": "200000"}, PID).watchdog_interval_s == pytest.approx(0.1)


def test_the_watchdog_is_ours_only_when_watchdog_pid_is_unset_or_our_pid() -> None:
    env = {"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": "30000000"}
    assert parse_env({**env, "WATCHDOG_PID": str(PID)}, PID).watchdog_interval_s == 15.0
    for other in (str(PID + 1), "1", "not-a-pid"):
        settings = parse_env({**env, "WATCHDOG_PID": other}, PID)
        assert settings.watchdog_interval_s is None
        assert settings.address == "/n" and settings.problems == ()  # READY=1 etc. still go out


@pytest.mark.parametrize("usec", ["0", "-5", "soon", "1.5"])
def test_a_bad_watchdog_usec_is_reported_and_ignored(usec: str) -> None:
    settings = parse_env({"NOTIFY_SOCKET": "/n", "WATCHDOG_USEC": usec}, PID)
    assert settings.address == "/n" and settings.watchdog_interval_s is None
    assert any("WATCHDOG_USEC" in problem for problem in settings.problems)


def test_a_watchdog_without_a_socket_is_reported() -> None:
    settings = parse_env({"WATCHDOG_USEC": "30000000"}, PID)
    assert settings == NotifySettings(problems=settings.problems)
    assert settings.problems and "NOTIFY_SOCKET" in settings.problems[0]


def test_from_env_reads_the_mapping_it_is_given() -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "4000000"}, pid=PID)
    assert notifier.enabled
    assert notifier.settings == NotifySettings(address="\0x", watchdog_interval_s=2.0)


def test_serving_status_names_the_label_and_every_listener() -> None:
    listeners = ["/h/peerd.sock", "https://127.0.0.1:7433"]
    assert serving_status("box", listeners) == "Serving box on /h/peerd.sock, https://127.0.0.1:7433"
    assert serving_status("box", []) == "Serving box"


# --- sending -----------------------------------------------------------------------------------


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket standing in for systemd, and the NOTIFY_SOCKET value naming it."""
    sock, value = notify_socket(request.param, tmp_path)
    sock.settimeout(RECV_TIMEOUT_S)
    with sock:
        yield value, sock


def notifier_for(value: str, **extra: str) -> Notifier:
    return Notifier.from_env({"NOTIFY_SOCKET": value, **extra}, pid=PID)


def test_each_message_is_one_datagram_of_lines(receiver: tuple[str, socket.socket]) -> None:
    value, sock = receiver
    notifier = notifier_for(value)
    assert notifier.ready("Serving box on /h/peerd.sock")
    assert sock.recv(4096) == b"READY=1\nSTATUS=Serving box on /h/peerd.sock"
    assert notifier.status("two\nlines")
    assert sock.recv(4096) == b"STATUS=two lines"  # a newline would start a new assignment
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(4096).split(b"\n")[0] == b"STOPPING=1"
    assert notifier.ready()
    assert sock.recv(4096) == b"READY=1"


async def test_the_watchdog_pings_until_cancelled(receiver: tuple[str, socket.socket]) -> None:
    value, sock = receiver
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    notifier = notifier_for(value, WATCHDOG_USEC="20000")  # a ping every 10 ms
    task = asyncio.create_task(notifier.run_watchdog())
    try:
        for _ in range(3):
            assert await asyncio.wait_for(loop.sock_recv(sock, 4096), RECV_TIMEOUT_S) == b"WATCHDOG=1"
    finally:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_systemd_every_call_is_a_quiet_no_op() -> None:
    notifier = Notifier.from_env({}, pid=PID)
    with capture_logs() as logs:
        assert not notifier.enabled
        assert not notifier.ready("x")
        assert not notifier.status("x")
        assert not notifier.watchdog()
        assert not notifier.stopping()
        await asyncio.wait_for(notifier.run_watchdog(), RECV_TIMEOUT_S)  # returns at once
    assert logs == []


class CountingNotifier(Notifier):
    """Counts watchdog pings, sent or not, so a test can wait for the third one."""

    def __init__(self, settings: NotifySettings) -> None:
        super().__init__(settings)
        self.pings: list[bool] = []
        self.third_ping = asyncio.Event()

    def watchdog(self) -> bool:
        sent = super().watchdog()
        self.pings.append(sent)
        if len(self.pings) == 3:
            self.third_ping.set()
        return sent


async def test_a_failed_send_is_logged_and_never_raises(tmp_path: Path) -> None:
    missing = tmp_path / "nobody-listens"
    with capture_logs() as logs:
        notifier = CountingNotifier(parse_env({"NOTIFY_SOCKET": str(missing), "WATCHDOG_USEC": "2000"}, PID))
        assert not notifier.ready("Serving box")
        assert not notifier.stopping()
        task = asyncio.create_task(notifier.run_watchdog())
        await asyncio.wait_for(notifier.third_ping.wait(), RECV_TIMEOUT_S)  # it kept pinging
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert notifier.pings[:3] == [False, False, False]
    failures = [entry for entry in logs if entry["event"] == "sdnotify.send_failed"]
    assert failures[0]["message"] == "READY=1" and failures[0]["socket"] == str(missing)
    assert failures[1]["message"] == "STOPPING=1"
    assert any(entry["message"] == "WATCHDOG=1" for entry in failures[2:])


def test_unusable_settings_are_logged_once_at_start() -> None:
    with capture_logs() as logs:
        Notifier.from_env({"NOTIFY_SOCKET": "relative", "WATCHDOG_USEC": "x"}, pid=PID)
    assert [entry["event"] for entry in logs] == ["sdnotify.ignored_setting"] * 2
