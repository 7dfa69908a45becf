"""Provider processes a crashed daemon left behind, found and stopped at the next start-up.

A process group id can be reused after the daemon died (or after a reboot), so a group is killed
only when one of its members still carries that run's `PEERD_RUN_ID` in its environment: the
mark peerd gave the provider when it started it. Linux only (`/proc`); elsewhere this finds none.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

PROC = Path("/proc")


def _members(pgid: int) -> list[int]:
    pids = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            pids.append(int(entry.name))
    return pids


def _carries_mark(pid: int, run_id: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"PEERD_RUN_ID={run_id}".encode() in environ.split(b"\0")


def kill_orphaned_group(pgid: int, run_id: str) -> bool:
    """SIGKILL the run's process group if it still exists and is still that run's. True if killed."""
    if pgid <= 1 or pgid == os.getpgrp():
        return False
    if not any(_carries_mark(pid, run_id) for pid in _members(pgid)):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
        return True
    return False
