"""Deny by default, as root and as an ordinary user: the same run profile, a real bwrap, a probe.

peerd as root gives the run an unprivileged uid of its own (`runtime/runas.py`); peerd as an ordinary
user runs bwrap as that user (a user namespace). Either way the probe, in the run's worktree, finds
every path of the table that is not the run's own absent or unreadable, and still builds its work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from peerd.runtime import sandbox, sandbox_profile

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not sandbox.available(), reason="needs root (to act as both) and bubblewrap"
)

NOBODY = 65534

PROBE = r"""
import json, os, subprocess, sys

paths = json.loads(sys.argv[1])
found = {"uid": os.getuid(), "ids": [*os.getresuid(), *os.getresgid()]}
found["capabilities"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapPrm", "CapEff"))]
for path in paths:
    try:
        if os.path.isdir(path):
            found[path] = ["listed", sorted(os.listdir(path))]
        else:
            with open(path, "rb") as handle:
                found[path] = ["read", len(handle.read())]
    except OSError as exc:
        found[path] = ["refused", type(exc).__name__]
with open("hello.c", "w") as handle:
    handle.write("int main(void) { return 0; }\n")
for name, argv in {
    "python": ["python3", "-c", "import ssl, sqlite3"],
    "node": ["node", "-e", "1"],
    "git": ["git", "status", "--short"],
    "cc": ["sh", "-c", "cc hello.c -o hello && ./hello"],
    "write": ["sh", "-c", "echo mine > mine.txt && echo x > /tmp/t && echo y > $HOME/h"],
}.items():
    done = subprocess.run(argv, capture_output=True, text=True)
    found[name] = [done.returncode, done.stderr[-300:]]
print(json.dumps(found))
"""


@pytest.fixture
def machine() -> Iterator[Path]:
    """A box in miniature below a directory others may enter (the ordinary user must reach it)."""
    base = Path(tempfile.mkdtemp(dir="/var/tmp"))  # its ancestors let others in
    base.chmod(0o755)
    try:
        for sub in ("home/identity", "user/.ssh", "repo", "other-src"):
            (base / sub).mkdir(parents=True)
        (base / "home" / "identity" / "key.pem").write_text("KEY")
        (base / "user" / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
        (base / "other-src" / "README.md").write_text("someone else's code")
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q", str(base / "repo")], check=True)
        (base / "repo" / "README.md").write_text("hi\n")
        subprocess.run([*git, "-C", str(base / "repo"), "add", "."], check=True)
        subprocess.run([*git, "-C", str(base / "repo"), "commit", "-qm", "x"], check=True)
        root_only = base / "repo" / ".git" / "root-only"
        root_only.write_text("only its owner's")
        root_only.chmod(0o600)
        worktree = base / "home" / "worktrees" / "thr_1"
        subprocess.run([*git, "-C", str(base / "repo"), "worktree", "add", "-q", str(worktree)], check=True)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_probe(machine: Path, *, as_user: bool) -> dict[str, object]:
    worktree = machine / "home" / "worktrees" / "thr_1"
    conf = sandbox_profile.profile(
        home=machine / "home",
        owner_socket=machine / "home" / "peerd.sock",
        agent_socket=None,
        checkouts=[machine / "repo"],
        checkout=machine / "repo",
        worktree=worktree,
        scratch=machine / "home" / "providers" / "script" / "runs" / "r1",
        by_link=True,
        runtime_mode="auto",
        interaction_mode="default",
        user_home=machine / "user",
    )
    python = sys.executable
    if as_user:  # peerd itself runs as the ordinary user: no uid of the run's own, its own Python
        unreachable = [p for p in sandbox_profile.python_dirs() if p.is_relative_to("/root")]
        # (and no trust config: the user's run owns its worktree)
        binds = tuple(b for b in conf.binds if b.path not in unreachable and b.source is None)
        conf = dataclasses.replace(conf, run_as=None, binds=binds)
        python = "/usr/bin/python3"
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(worktree)], check=True)
    else:
        assert conf.run_as is not None and conf.run_as.uid == NOBODY
    (worktree / "probe.py").write_text(PROBE)
    targets = [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/ssl/private",
        str(machine / "user" / ".ssh" / "id_ed25519"),
        str(machine / "other-src"),
        str(machine / "home" / "identity" / "key.pem"),
        str(machine / "repo" / "README.md"),
        str(machine / "repo" / ".git" / "root-only"),
        "/home",
        "/root",
        "/srv",
        "/opt",
        "/var/lib",
        "/var/log",
        "/mnt",
    ]
    bwrap = shutil.which("bwrap") or "bwrap"
    argv = sandbox.command(conf, [python, "probe.py", json.dumps(targets)], bwrap=bwrap, python=python)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(machine / "user"), "LANG": "C.UTF-8"}
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if as_user else []
    done = subprocess.run(
        [*drop, *argv], cwd=worktree, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("as_user", [False, True], ids=["peerd-as-root", "peerd-as-an-ordinary-user"])
def test_a_links_run_finds_nothing_of_the_box_but_its_own_work(machine: Path, as_user: bool) -> None:
    found = run_probe(machine, as_user=as_user)
    assert found["uid"] == NOBODY, "never root"
    assert found["ids"] == [NOBODY] * 6, "nor a saved uid or gid to go back to root with"
    assert found["capabilities"] == ["0000000000000000"] * 2, "and no capability left"
    # Only the names on the way to what is bound are there: e.g. a Python installed in /root/.pyenv
    on_the_way = {
        (Path(*p.parts[:2]), p.parts[2])
        for p in sandbox_profile.python_dirs()
        if len(p.parts) > 2 and not as_user
    }
    for path, seen in found.items():
        if path.startswith("/") and seen[0] == "listed":  # type: ignore[index]
            assert {(Path(path), name) for name in seen[1]} <= on_the_way, (path, seen)  # type: ignore[index]
        elif path.startswith("/") and path != str(machine / "repo" / ".git" / "root-only"):
            assert seen in (["refused", "FileNotFoundError"], ["refused", "PermissionError"]), (path, seen)
    # mapped (the project's git dir is read-only visible), and still not readable: not root
    assert found[str(machine / "repo" / ".git" / "root-only")] == ["refused", "PermissionError"]
    for tool in ("python", "node", "git", "cc", "write"):
        assert found[tool] == [0, ""] or found[tool][0] == 0, (tool, found[tool])  # type: ignore[index]
    assert (machine / "home" / "worktrees" / "thr_1" / "mine.txt").read_text() == "mine\n"
    assert not (machine / "user" / "h").exists(), "the run's home is its own"
    if sys.platform.startswith("linux") and not as_user:
        # what the run wrote is its uid's; the owner's bits of the worktree are as they were
        assert (machine / "home" / "worktrees" / "thr_1" / "mine.txt").stat().st_uid == NOBODY
