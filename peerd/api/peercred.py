"""Who is on the other end of the owner socket: `SO_PEERCRED`, and whether peerd started it.

The owner socket is the owner's: the CLI, and agents the owner started by hand. Runs get the agent
socket instead and, confined (`peerd.runtime.sandbox`), cannot see the owner socket at all. As a
second wall for runs that are not confined (the owner's own full-access runs, or a box whose owner
allowed unconfined link runs), the owner socket refuses the processes of runs: members of a live
run's process group or session and anything below a run's leader; and under `peerd serve`, which
makes the daemon a child subreaper (`become_subreaper`), anything below the daemon at all, so a
process that double-forks and calls setsid() to lose its run is re-parented to the daemon and
still refused. (An in-process daemon, as in the tests, is not a subreaper and keeps only the run
rules: the test process that hosts it also starts CLI subprocesses.) Linux only: elsewhere (no
`SO_PEERCRED`, no /proc) the check finds nothing and the socket's 0600 mode is the only wall.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
_MAX_DEPTH = 256  # a parent chain longer than this is not a real one; stop walking


def peer_pid(sock: socket.socket | None) -> int | None:
    """The pid of the process that connected to a Unix socket, when the platform tells."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, _uid, _gid = struct.unpack("3i", raw)
    return pid if pid > 0 else None


def _stat(pid: int, proc: Path) -> tuple[int, int, int] | None:
    """(parent pid, process group, session) of `pid` from /proc/<pid>/stat, or None."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(fields[1]), int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def started_by_peerd(
    pid: int, *, daemon_pid: int, run_groups: frozenset[int], any_descendant: bool, proc: Path = Path("/proc")
) -> bool:
    """Whether `pid` is a process peerd started for a run: in a run's process group or session, or
    below a run's leader; with `any_descendant`, also anything below the daemon (the daemon itself
    is not its own descendant)."""
    current = pid
    for depth in range(_MAX_DEPTH):
        if current <= 1:
            return False
        if current in run_groups:
            return True
        stat = _stat(current, proc)
        if stat is None:
            return False
        parent, group, session = stat
        if depth == 0 and (group in run_groups or session in run_groups):
            return True
        if any_descendant and parent == daemon_pid:
            return True
        current = parent
    return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux `PR_SET_CHILD_SUBREAPER`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def from_a_run(sock: socket.socket | None, *, run_groups: frozenset[int], any_descendant: bool) -> bool:
    pid = peer_pid(sock)
    if pid is None or pid == os.getpid():
        return False
    return started_by_peerd(pid, daemon_pid=os.getpid(), run_groups=run_groups, any_descendant=any_descendant)
