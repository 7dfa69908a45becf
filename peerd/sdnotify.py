"""The sd_notify protocol, for running under systemd with `Type=notify` and a watchdog.

When systemd starts a `Type=notify` service it sets `NOTIFY_SOCKET` to a Unix datagram socket: a
path, or an abstract name written with a leading `@`. The service sends newline-separated
`KEY=VALUE` lines there: `READY=1` once it serves, `STATUS=...` for `systemctl status`,
`STOPPING=1` when it begins to shut down and, when `WatchdogSec=` is set (systemd then sets
`WATCHDOG_USEC`, and `WATCHDOG_PID` naming the process meant), `WATCHDOG=1` at least every
`WATCHDOG_USEC`; we ping every half of it, as sd_watchdog_enabled(3) advises.

Without `NOTIFY_SOCKET` every call is a no-op. A failed send is logged and otherwise ignored: the
daemon must never stop because systemd could not be told something. The environment is left as it
is (no variable is unset); children inherit `NOTIFY_SOCKET`, which is harmless with
`NotifyAccess=main`, where systemd ignores every sender but the main process.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

__all__ = ["Notifier", "NotifySettings", "parse_env", "serving_status"]

SEND_TIMEOUT_S = 1.0  # a datagram blocks only while systemd's queue is full; never wait long for it


@dataclass(frozen=True)
class NotifySettings:
    """What the environment asks for. `address` is ready for `socket.sendto` (an abstract name
    starts with a NUL byte); `watchdog_interval_s` is how often to ping, or None for no pings."""

    address: str | None = None
    watchdog_interval_s: float | None = None
    problems: tuple[str, ...] = ()  # settings that were present but unusable, for the log


def parse_env(env: Mapping[str, str], pid: int) -> NotifySettings:
    """Read `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as sd_notify(3) and
    sd_watchdog_enabled(3) define them. Pure: `pid` is the process the pings would come from."""
    problems: list[str] = []
    address: str | None = None
    raw_socket = env.get("NOTIFY_SOCKET", "")
    if raw_socket.startswith("/"):
        address = raw_socket
    elif raw_socket.startswith("@") and len(raw_socket) > 1:
        address = "\0" + raw_socket[1:]
    elif raw_socket:
        problems.append(f"NOTIFY_SOCKET={raw_socket!r} is neither a path nor an @abstract name")

    interval: float | None = None
    raw_usec = env.get("WATCHDOG_USEC", "")
    raw_pid = env.get("WATCHDOG_PID", "")
    if raw_usec:
        usec = int(raw_usec) if raw_usec.isdigit() else 0
        if usec <= 0:
            problems.append(f"WATCHDOG_USEC={raw_usec!r} is not a positive number of microseconds")
        elif raw_pid and (not raw_pid.isdigit() or int(raw_pid) != pid):
            pass  # the watchdog is meant for another process (e.g. our parent): not ours to ping
        elif address is None:
            problems.append("WATCHDOG_USEC is set but NOTIFY_SOCKET is not")
        else:
            interval = usec / 2 / 1_000_000
    return NotifySettings(address=address, watchdog_interval_s=interval, problems=tuple(problems))


def serving_status(label: str, listeners: Iterable[str]) -> str:
    """The STATUS= line once the daemon serves, e.g. `Serving box on /h/peerd.sock, https://...`."""
    where = ", ".join(listeners)
    return f"Serving {label} on {where}" if where else f"Serving {label}"


class Notifier:
    """Sends sd_notify messages; every method is safe to call with no systemd around."""

    def __init__(self, settings: NotifySettings) -> None:
        self.settings = settings
        for problem in settings.problems:
            log.warning("sdnotify.ignored_setting", problem=problem)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, pid: int | None = None) -> Notifier:
        return cls(parse_env(os.environ if env is None else env, os.getpid() if pid is None else pid))

    @property
    def enabled(self) -> bool:
        return self.settings.address is not None

    def send(self, *lines: str) -> bool:
        """Send one datagram of `KEY=VALUE` lines. True when it was sent; False (logged) when there
        is no socket or sending failed."""
        address = self.settings.address
        if address is None:
            return False
        payload = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)
                sock.sendto(payload, address)
        except OSError as exc:
            log.warning(
                "sdnotify.send_failed",
                message=lines[0] if lines else "",
                socket=address.replace("\0", "@", 1),
                error=str(exc),
            )
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self, status: str = "Stopping: interrupting live runs") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    async def run_watchdog(self) -> None:
        """Ping the watchdog every WATCHDOG_USEC/2 until cancelled. The pings come from the event
        loop itself, so a loop that stops turning stops them and systemd restarts the daemon.
        Returns at once when no watchdog is asked for."""
        interval = self.settings.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)
