"""`peerd serve` whose store lies on a small filesystem of its own, to fill up for real.

The daemon runs in a mount namespace of its own (`unshare -rm`: a user namespace mapping this
user to root in it, so no privilege is needed where unprivileged user namespaces work, as bwrap
needs anyway), with a tmpfs of a few MiB at `<home>/fs` and `<home>/peerd.db` a symlink to the
store on it (SQLite keeps its -wal and -shm beside the file the link names). The test reaches that
filesystem through `/proc/<pid>/root`, fills it with a file until ENOSPC, and deletes the file to
give the space back. The tmpfs lives as long as the daemon: these daemons are not restarted.
SQLite cannot open the store through `/proc/<pid>/root` (it resolves that link to "/"), so a test
reads such a daemon's state through its API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from peerd.paths import Paths
from tests.faults.harness import Serve

FS_SIZE = 4 * 1024 * 1024


def available() -> str | None:
    """None when `unshare -rm` with a tmpfs works here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return None if probe.returncode == 0 else f"no private mount namespaces here: {probe.stderr.strip()}"


class SmallDisk(Serve):
    """A stopped `Serve`'s home, started again with its store on a small filesystem."""

    def __init__(self, base: Serve, *, size: int = FS_SIZE) -> None:
        super().__init__(base.home, label=base.label, listen=base.listen, extra=base.extra)
        self.size = size

    def start(self) -> None:
        fs, db = self.home / "fs", Paths(self.home).db
        fs.mkdir(exist_ok=True)
        seed = self.home / "peerd.db.seed"
        if not db.is_symlink():
            db.rename(seed)
            db.symlink_to(fs / "peerd.db")
        script = (
            'mount -t tmpfs -o size="$1" tmpfs "$2/fs" && cp -p "$2/peerd.db.seed" "$2/fs/peerd.db" '
            '&& shift 2 && exec "$@"'
        )
        argv = ["unshare", "-rm", "sh", "-c", script, "sh", str(self.size), str(self.home), *self.argv()]
        with open(self.home / "daemon.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    @property
    def fs(self) -> Path:
        """The small filesystem, as this process reaches it (through the daemon's mount namespace)."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root") / str(self.home / "fs").lstrip("/")

    def fill(self) -> int:
        """Write a file until the filesystem is full (to the last byte); the bytes it took."""
        written = 0
        fd = os.open(self.fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (65536, 4096, 512, 1):
                block = b"\0" * size
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError:
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        (self.fs / "filler").unlink()
