"""The CLI protects work: archiving refuses to delete uncommitted files unless forced, and a
destructive command asks first on a terminal (`--yes` does not ask)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from peerd.api.localclient import LocalClient
from peerd.cli import common
from peerd.cli.common import EXIT_ERROR
from peerd.cli.main import cli
from peerd.daemon import Daemon
from tests.helpers import script, wait_terminal
from tests.support.cli import home_of, ok, peerd


async def finished_thread(
    client: LocalClient, project: dict[str, Any], *steps: dict[str, Any]
) -> dict[str, Any]:
    body = {"projectId": project["id"], "prompt": script(*steps)}
    launched: dict[str, Any] = await client.call("POST", "/v1/threads", body=body)
    await wait_terminal(client, launched["threadId"], launched["runId"])
    return launched


async def test_archive_refuses_a_worktree_with_uncommitted_work_unless_forced(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    launched = await finished_thread(client, project, {"write": {"path": "notes.txt", "content": "mine\n"}})
    worktree = Path(launched["worktreePath"])
    (worktree / "README.md").write_text("edited\n")
    refused = await peerd(home_of(daemon), "thread", "archive", launched["threadId"])
    assert refused.returncode == EXIT_ERROR, refused.stderr
    assert refused.stderr.startswith("error: worktree_dirty:")
    assert "notes.txt" in refused.stderr and "README.md" in refused.stderr and "--force" in refused.stderr
    assert (worktree / "notes.txt").read_text() == "mine\n", "nothing was deleted"
    thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
    assert thread["status"] != "archived"

    forced = ok(await peerd(home_of(daemon), "thread", "archive", launched["threadId"], "--force"))
    assert "discarded 2" in forced
    assert not worktree.exists()


async def test_archive_of_a_clean_worktree_needs_no_force(
    daemon: Daemon, client: LocalClient, project: dict[str, Any]
) -> None:
    launched = await finished_thread(client, project, {"reply": "nothing to keep"})
    out = ok(await peerd(home_of(daemon), "thread", "archive", launched["threadId"]))
    assert "worktree removed" in out and "discarded" not in out


async def test_archive_keeps_the_branch_unless_asked_and_deletes_it_also_later(
    daemon: Daemon, client: LocalClient, project: dict[str, Any], repo: Path
) -> None:
    def branches() -> set[str]:
        out = subprocess.run(
            ["git", "-C", str(repo), "for-each-ref", "--format=%(refname:short)", "refs/heads/"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return set(out.split())

    kept = await finished_thread(client, project, {"reply": "keep my branch"})
    gone = await finished_thread(client, project, {"reply": "delete my branch"})
    branch_of = {
        t["threadId"]: (await client.call("GET", f"/v1/threads/{t['threadId']}"))["branch"]
        for t in (kept, gone)
    }
    assert "branch deleted" not in ok(await peerd(home_of(daemon), "thread", "archive", kept["threadId"]))
    assert branch_of[kept["threadId"]] in branches()
    out = ok(await peerd(home_of(daemon), "thread", "archive", gone["threadId"], "--delete-branch"))
    assert "worktree removed; branch deleted" in out
    assert branch_of[gone["threadId"]] not in branches()
    # An archived thread's branch can still be deleted (a clean-up retried).
    later = await client.call("POST", f"/v1/threads/{kept['threadId']}/archive", body={"deleteBranch": True})
    assert later["branchDeleted"] is True and later["worktreeRemoved"] is False
    assert branch_of[kept["threadId"]] not in branches()


@pytest.mark.parametrize("answer", ["n\n", "\n"])
async def test_a_destructive_command_on_a_terminal_asks_first(
    daemon: Daemon, client: LocalClient, project: dict[str, Any], monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    monkeypatch.setattr(common, "on_terminal", lambda: True)
    runner = CliRunner()
    result = await asyncio_run(
        runner, ["--home", str(home_of(daemon)), "project", "remove", project["id"]], answer
    )
    assert result.exit_code == EXIT_ERROR and "cancelled; nothing was changed" in result.output
    assert (await client.call("GET", f"/v1/projects/{project['id']}"))["id"] == project["id"]


async def asyncio_run(runner: CliRunner, args: list[str], answer: str) -> Any:
    import asyncio  # noqa: PLC0415  # the CLI runs its own event loop: keep it off this one

    return await asyncio.to_thread(runner.invoke, cli, args, input=answer)


async def test_yes_does_not_ask(
    daemon: Daemon, client: LocalClient, project: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "on_terminal", lambda: True)
    args = ["--home", str(home_of(daemon)), "project", "remove", project["id"], "--yes"]
    result = await asyncio_run(CliRunner(), args, "")
    assert result.exit_code == 0, result.output
    assert "removed project" in result.output
