"""A home that cannot be used is one sentence with its code, never a traceback (`peerd serve`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def serve(home: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("case", "why"),
    [("a file in the way", "Not a directory"), ("a parent that cannot hold it", "No such file or directory")],
)
def test_a_home_that_cannot_be_made_is_a_typed_error(tmp_path: Path, case: str, why: str) -> None:
    if case == "a file in the way":
        (tmp_path / "file").write_text("not a directory\n")
        home = tmp_path / "file" / "home"
    else:
        home = Path("/proc/peerd-test-home")  # procfs refuses new directories, even to root
    done = serve(home)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr + done.stdout
    line = next(x for x in done.stderr.splitlines() if x.startswith("error:"))
    assert line.startswith(f"error: home_unusable: peerd cannot use {home} as its home: {why}."), line
