"""The previous release (tests/compat/PREVIOUS_RELEASE), built from this repository's own git
history into its own virtual environment, and run as real daemons beside this release's.

The build is cheap: `git archive <commit>` into a temporary directory, `python -m venv
--without-pip`, and a `.pth` file that puts the old source first and this environment's
site-packages after it (the two releases have the same dependencies; pyproject.toml only added
some this release needs). Nothing is installed. When the repository has no such commit (a
shallow clone, an exported tree), the tests are skipped and say why.
"""

from __future__ import annotations

import io
import os
import signal
import site
import subprocess
import sys
import tarfile
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import wait_started

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def previous_commit() -> str:
    for line in (HERE / "PREVIOUS_RELEASE").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip()
    raise AssertionError("tests/compat/PREVIOUS_RELEASE names no commit")


@dataclass(frozen=True)
class Release:
    """An installed older release: its interpreter (which imports its peerd) and source tree."""

    commit: str
    python: Path
    source: Path

    def env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    def command(self, *args: str) -> list[str]:
        return [str(self.python), "-P", "-m", "peerd", *args]  # -P: not this checkout from the cwd


def build(dest: Path) -> Release:
    commit = previous_commit()
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False
    )
    if found.returncode != 0:
        pytest.skip(
            f"this checkout has no commit {commit[:10]} (a shallow clone?): no previous release to test against"
        )
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "peerd"], capture_output=True, check=True
    )
    source = dest / "src"
    source.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    env_dir = dest / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "peerd_previous_release.pth").write_text("\n".join([str(source), *ours]) + "\n")
    release = Release(commit, python, source)
    where = subprocess.run(
        [*release.command()[:2], "-c", "import peerd; print(peerd.__file__)"],
        capture_output=True,
        text=True,
        env=release.env(),
        cwd=dest,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(source)), f"the previous release imports {where}, not its own source"
    return release


class OldDaemon:
    """`peerd serve` of the previous release, as a subprocess on a home (and a fixed address)."""

    def __init__(self, release: Release, home: Path, *, label: str, listen: str) -> None:
        self.release, self.home, self.label, self.listen = release, home, label, listen
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "daemon.log", "ab") as log:
            self.proc = subprocess.Popen(
                self.release.command(
                    "--home", str(self.home), "serve", "--listen", self.listen, "--label", self.label
                ),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.release.env(),
                cwd=self.home,
            )
        await wait_started(self.home, self.proc, timeout=30, label=f"the previous release's {self.label}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def new_peerd(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """This release's CLI (the interpreter running the tests), for what must exit on its own."""
    return subprocess.run(
        [sys.executable, "-m", "peerd", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
