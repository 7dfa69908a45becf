"""`peerd serve` on a person's terminal (a pty) logs readable lines and prints one ready line with
the listeners and the console; into a pipe (a service manager, a file) it logs JSON lines and
prints no such line (issue 30). Real `peerd serve` subprocesses."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two daemon start-ups

START_S = 30.0


def serve_argv(home: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "peerd",
        "--home",
        str(home),
        "serve",
        "--no-tls",
        "--listen",
        "127.0.0.1:0",
    ]


def env_without_color() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NO_COLOR")}
    return env | {"NO_COLOR": "1"}  # plain text to match; colour is the renderer's own business


def read_until(fd: int, marker: bytes, seconds: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty closed: the process is gone
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_on_a_terminal_serve_logs_readable_lines_and_says_it_is_ready(tmp_path: Path) -> None:
    main, tty = pty.openpty()
    proc = subprocess.Popen(
        serve_argv(tmp_path / "home"),
        stdin=tty,
        stdout=tty,
        stderr=tty,
        env=env_without_color(),
        close_fds=True,
    )
    os.close(tty)
    try:
        seen = read_until(main, b"is ready:", START_S).decode(errors="replace")
        seen += read_until(main, b"\n", 2.0).decode(errors="replace")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=START_S)
        os.close(main)
    lines = [line for line in seen.replace("\r", "").splitlines() if line.strip()]
    assert lines, seen
    assert not [line for line in lines if line.lstrip().startswith("{")], f"JSON on a terminal:\n{seen}"
    [ready] = [line for line in lines if "is ready:" in line]
    assert ready.startswith("peerd ") and str(tmp_path / "home" / "peerd.sock") in ready, ready
    assert "http://127.0.0.1:" in ready and "; console http://127.0.0.1:" in ready, ready
    assert any("daemon.ready" in line for line in lines), seen  # the log line itself, readable


def test_into_a_pipe_serve_logs_json_lines_and_no_ready_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        serve_argv(tmp_path / "home"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_without_color(),
    )
    assert proc.stderr is not None
    seen = read_until(proc.stderr.fileno(), b'"daemon.ready"', START_S)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=START_S)
    logged = (seen + err).decode(errors="replace").splitlines()
    assert logged and all(json.loads(line) for line in logged if line.strip()), logged
    assert any(json.loads(line)["event"] == "daemon.ready" for line in logged if line.strip())
    assert b"is ready" not in out
