"""`peerd approval ...` as real subprocesses against a real daemon, the scripted coder asking before
each `run` step at approval-required."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.cli.common import EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE
from tests.helpers import client_for, make_repo, running_daemon, script, two_daemons, wait_terminal
from tests.support.approvals import launch, launch_on_box, new_approval, pending_approvals, set_up
from tests.support.cli import ok, peerd
from tests.support.eventually import eventually
from tests.support.inflight import awaiting

Json = dict[str, Any]
LINE_TIMEOUT_S = 30.0


async def test_list_show_approve_and_deny_with_each_option(
    client: LocalClient, project: Json, repo: Path
) -> None:
    home = Path((await client.call("GET", "/v1/status"))["home"])
    launched = await launch(
        client,
        project,
        script(
            {"run": "echo a > a.txt"},
            {"run": "echo b > b.txt"},
            {"run": "echo c >> c.txt"},
            {"run": "echo c >> c.txt"},  # the same command again: approved by the standing grant
            {"run": "echo d > d.txt"},
            {"run": "echo e > e.txt"},  # the same run: approved by the run's standing grant
            {"reply": "done"},
        ),
    )
    known: set[str] = set()
    first = await new_approval(client, known)

    listed = ok(await peerd(home, "approval", "list"))
    header, row = listed.splitlines()[:2]
    assert header.split() == ["ID", "WHERE", "WHAT", "THREAD", "ASKED", "DEADLINE", "STATUS"]
    assert first["id"] in row and "here" in row and "run `echo a > a.txt`" in row
    assert launched["threadId"] in row and "in 29 min" in row and row.endswith("pending")
    as_json = json.loads(ok(await peerd(home, "approval", "list", "--json", "id,status")))
    assert as_json == [{"id": first["id"], "status": "pending"}]
    assert ok(await peerd(home, "approval", "list", "-q")).split() == [first["id"]]
    shown = ok(await peerd(home, "approval", "show", first["id"]))
    assert f"command  echo a > a.txt\ncwd      {repo}" in shown
    assert "status    pending" in shown and launched["runId"] in shown

    # Both standing grants at once: a usage error, and nothing was sent.
    both = await peerd(
        home, "approval", "approve", first["id"], "--always-for-this-run", "--always-for-this-command"
    )
    assert both.returncode == EXIT_USAGE and "not both" in both.stderr, both.stderr
    assert (await client.call("GET", f"/v1/approvals/{first['id']}"))["status"] == "pending"

    approved = ok(await peerd(home, "approval", "approve", first["id"]))
    assert approved.strip() == f"Approved: run `echo a > a.txt` in {repo} ({first['id']})"
    again = await peerd(home, "approval", "deny", first["id"])
    assert again.returncode == EXIT_ERROR and "approval_decided" in again.stderr, again.stderr

    second = await new_approval(client, known)
    denied = ok(await peerd(home, "approval", "deny", second["id"], "--reason", "not b"))
    assert denied.startswith("Denied: run `echo b > b.txt`")

    third = await new_approval(client, known)
    assert third["detail"]["command"] == "echo c >> c.txt"
    made = json.loads(
        ok(await peerd(home, "approval", "approve", third["id"], "--always-for-this-command", "--json"))
    )
    assert made["status"] == "approved" and made["scope"] == "command" and made["decidedBy"] == "owner"

    fourth = await new_approval(client, known)  # the second `echo c` was not asked about
    assert fourth["detail"]["command"] == "echo d > d.txt"
    done = ok(await peerd(home, "approval", "approve", fourth["id"], "--always-for-this-run"))
    assert done.startswith("Approved for the rest of its run: run `echo d > d.txt`")

    await wait_terminal(client, launched["threadId"], launched["runId"], total=30)
    assert (repo / "a.txt").exists() and not (repo / "b.txt").exists()
    assert (repo / "c.txt").read_text() == "c\nc\n" and (repo / "e.txt").exists()
    everything = ok(await peerd(home, "approval", "list", "--all"))
    assert len(everything.splitlines()) == 1 + 4  # the header and four decided ones
    assert not ok(await peerd(home, "approval", "list")).strip().count("\n")  # "(none)"
    shown = ok(await peerd(home, "approval", "show", second["id"]))
    assert "denied by owner: not b" in shown
    unknown = await peerd(home, "approval", "show", "ap_nope")
    assert unknown.returncode == EXIT_ERROR and "approval_not_found" in unknown.stderr


def watch(home: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), "approval", "watch"]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )


async def line_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), LINE_TIMEOUT_S)
    assert line, f"watch ended: exit {proc.poll()}"
    return line


async def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    code = await asyncio.wait_for(asyncio.to_thread(proc.wait), LINE_TIMEOUT_S)
    assert proc.stderr is not None and proc.stdout is not None
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    return code, err


async def test_watch_prints_a_new_one_and_its_decision_and_ends_on_ctrl_c(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home") as daemon, client_for(daemon.paths.home) as client:
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        proc = watch(daemon.paths.home)
        try:
            await eventually(
                lambda: awaiting("ApprovalDesk.listing", "ChangeFeed.wait_any"),
                what="the watch in its long-poll before the run asks",
            )
            launched = await launch(client, project, script({"run": "echo hi"}, {"reply": "done"}))
            asked = await line_of(proc)
            (pending,) = (await client.call("GET", "/v1/approvals"))["items"]
            assert "asked" in asked and pending["id"] in asked and "run `echo hi`" in asked
            assert "\a" not in asked  # a pipe, not a terminal: no bell
            await client.call("POST", f"/v1/approvals/{pending['id']}/decision", body={"decision": "approve"})
            left = await line_of(proc)
            assert "approved by owner" in left and pending["id"] in left
            await wait_terminal(client, launched["threadId"], launched["runId"], total=30)
            proc.send_signal(signal.SIGINT)
            code, err = await ended(proc)
            assert code == EXIT_OK and err == "", err
        finally:
            if proc.poll() is None:
                proc.kill()
        proc = watch(daemon.paths.home)
        await eventually(
            lambda: awaiting("ApprovalDesk.listing", "ChangeFeed.wait_any"),
            what="the watch in its long-poll when the daemon stops",
        )
    try:
        # The daemon stopped while the watch waited: it ends with the usual message.
        code, err = await ended(proc)
        assert code == EXIT_NOT_RUNNING and "peerd is not running" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_boxs_approval_is_listed_on_box_and_decided_from_the_laptop(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair)
        launched = await launch_on_box(pair, project, script({"run": "echo hi > there.txt"}, {"reply": "ok"}))
        (seen,) = await pending_approvals(pair.lc)
        home = pair.laptop.paths.home
        row = ok(await peerd(home, "approval", "list")).splitlines()[1]
        assert seen["id"] in row and "on box" in row and "run `echo hi > there.txt`" in row
        shown = ok(await peerd(home, "approval", "show", seen["id"]))
        assert "where     on box" in shown and "command  echo hi > there.txt" in shown
        denied = ok(await peerd(home, "approval", "deny", seen["id"], "--reason", "not there"))
        assert denied.strip().endswith(f"({seen['id']} on box)")
        await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
        record = await pair.bc.call("GET", f"/v1/approvals/{seen['id']}")
        assert record["status"] == "denied" and record["reason"] == "not there"
        assert record["decidedBy"].startswith("link:")
