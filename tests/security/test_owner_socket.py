"""The owner socket refuses the processes of runs, even of runs that are not confined.

The second wall behind confinement (peerd/api/peercred.py): an owner's full-access run is not
sandboxed, yet a command it runs that opens the owner socket (directly, or after setsid()) is
refused; the CLI and the owner's own processes are not.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from peerd.api import peercred
from peerd.api.localclient import LocalClient
from peerd.daemon import Daemon
from tests.helpers import script, wait_terminal

ATTACK = """
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])
c = C("peerd")
c.request("POST", "/v1/pair", body=json.dumps({"access": "full-access"}),
          headers={"Content-Type": "application/json"})
r = c.getresponse()
print(r.status, json.loads(r.read())["code"] if r.status != 201 else "MINTED")
"""


def attack_step(tmp_path: Path, socket_path: Path, *, setsid: bool) -> dict[str, Any]:
    attack = tmp_path / "attack.py"
    attack.write_text(ATTACK)
    prefix = "setsid -w " if setsid else ""
    return {"run": f"{prefix}{sys.executable} {attack} {socket_path}"}


@pytest.mark.slow
async def test_a_full_access_owner_runs_command_cannot_use_the_owner_socket(
    daemon: Daemon, client: LocalClient, project: dict[str, Any], tmp_path: Path
) -> None:
    steps = [
        attack_step(tmp_path, daemon.paths.socket, setsid=False),
        attack_step(tmp_path, daemon.paths.socket, setsid=True),
    ]
    launched = await client.call(
        "POST",
        "/v1/threads",
        body={"projectId": project["id"], "prompt": script(*steps), "runtimeMode": "full-access"},
    )
    await wait_terminal(client, launched["threadId"], launched["runId"])
    data = await client.call("GET", f"/v1/threads/{launched['threadId']}/items")
    outputs = [i["data"]["output"].strip() for i in data["items"] if i["kind"] == "command"]
    assert outputs == ["403 capability_denied", "403 capability_denied"], outputs
    assert (await client.call("GET", "/v1/pair"))["items"] == [], "no code was minted"


def test_the_run_rules_from_proc(tmp_path: Path) -> None:
    """A fake /proc: the chain leader(100) -> child(101) -> grandchild(102, own session 102)."""

    def proc(pid: int, ppid: int, pgrp: int, session: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a b) c) S {ppid} {pgrp} {session} 0 0\n")

    proc(100, 50, 100, 100)  # a run's leader, child of the daemon (50)
    proc(101, 100, 100, 100)
    proc(102, 101, 102, 102)  # setsid() escaped the group and session, not the ancestry
    proc(103, 50, 103, 103)  # re-parented to the daemon after a double fork
    proc(200, 1, 200, 200)  # the owner's shell

    def run_process(pid: int, *, any_descendant: bool) -> bool:
        return peercred.started_by_peerd(
            pid, daemon_pid=50, run_groups=frozenset({100}), any_descendant=any_descendant, proc=tmp_path
        )

    assert run_process(101, any_descendant=False)
    assert run_process(102, any_descendant=False)
    assert not run_process(103, any_descendant=False)
    assert run_process(103, any_descendant=True)
    assert not run_process(200, any_descendant=True)


async def test_both_sockets_and_the_store_are_this_users_only(daemon: Daemon) -> None:
    for path in (daemon.paths.socket, daemon.paths.agent_socket, daemon.paths.db):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert path.stat().st_uid == os.getuid()
    assert stat.S_IMODE((daemon.paths.home / "identity").stat().st_mode) == 0o700
