"""The real `peerd` command line, run as subprocesses against a real daemon.

The daemon runs in this test's event loop, so every CLI call goes through `asyncio.to_thread`: the
loop keeps serving the socket while the subprocess talks to it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from peerd.cli.common import (
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_RUN_STOPPED,
    EXIT_TIMED_OUT,
    EXIT_USAGE,
)
from peerd.cli.main import cli
from peerd.daemon import Daemon
from tests.helpers import script
from tests.support.cli import home_of, ok, peerd

LONG_REPLY = "abcde" * 9000  # 45,000 characters: more than two item pages


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group of the CLI, so a new command cannot miss its --help check."""
    found: list[tuple[str, ...]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += command_paths(command, (*prefix, name))
    return found


# --- without a daemon ------------------------------------------------------------------------------


async def test_commands_exit_3_with_a_hint_when_no_daemon_runs(tmp_path: Path) -> None:
    home = tmp_path / "idle-home"
    runs = await asyncio.gather(peerd(home, "status"), peerd(home, "thread", "show", "thr_x"))
    for done in runs:
        assert done.returncode == EXIT_NOT_RUNNING, done.stderr
        assert "not running" in done.stderr
        assert f"Start it with `peerd --home {home} serve`" in done.stderr  # the home as given
        assert done.stdout == ""


@pytest.mark.slow
async def test_usage_errors_exit_2(tmp_path: Path) -> None:
    home = tmp_path / "idle-home"
    unknown_option, no_project, no_prompt = await asyncio.gather(
        peerd(home, "status", "--bogus"),
        peerd(home, "thread", "launch", "--prompt", "hello"),
        peerd(home, "thread", "launch", "--project", "demo"),
    )
    for done in (unknown_option, no_project, no_prompt):
        assert done.returncode == EXIT_USAGE, done.stderr
        assert "Usage:" in done.stderr
        assert done.stdout == ""
    assert "--bogus" in unknown_option.stderr
    assert "--project" in no_project.stderr
    assert "--prompt" in no_prompt.stderr


@pytest.mark.slow
async def test_serve_refuses_plain_http_off_loopback(tmp_path: Path) -> None:
    home = tmp_path / "serve-home"
    everywhere = "0.0.0.0"  # noqa: S104  # the point: plain HTTP on all interfaces is refused
    # A regression would serve instead of exiting: the short timeout then fails the test.
    done = await peerd(home, "serve", "--no-tls", "--listen", f"{everywhere}:7999", timeout=20)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"Refusing to listen on {everywhere} without TLS" in done.stderr
    assert not (home / "peerd.sock").exists(), "nothing was served"


def test_every_command_has_help() -> None:
    """Every command's --help, through click itself: in-process, since an interpreter start per
    command costs seconds and proves nothing the entry-point check below does not."""
    paths = [(), *command_paths(cli)]
    assert ("thread", "launch") in paths and ("project", "add") in paths and ("serve",) in paths
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"], prog_name="peerd")
        assert result.exit_code == EXIT_OK, (path, result.output)
        first = result.output.splitlines()[0]
        assert first.startswith(" ".join(("Usage: peerd", *path))), (path, first)


async def test_help_through_the_real_entry_point(tmp_path: Path) -> None:
    runs = await asyncio.gather(
        peerd(tmp_path / "h", "--help"),
        peerd(tmp_path / "h", "thread", "--help"),
        peerd(tmp_path / "h", "thread", "launch", "--help"),
    )
    top, group, leaf = (ok(done) for done in runs)
    assert top.startswith("Usage: peerd [OPTIONS] COMMAND")
    assert all(name in top for name in ("serve", "status", "project", "thread"))
    assert group.startswith("Usage: peerd thread [OPTIONS] COMMAND")
    assert leaf.startswith("Usage: peerd thread launch [OPTIONS]")
    assert "--project" in leaf and "--wait" in leaf


# --- against a daemon ------------------------------------------------------------------------------


async def test_status_text_and_json(daemon: Daemon) -> None:
    text, as_json = await asyncio.gather(
        peerd(home_of(daemon), "status"), peerd(home_of(daemon), "status", "--json")
    )
    assert daemon.identity is not None
    env_id = daemon.identity.env_id
    lines = ok(text).splitlines()
    assert re.fullmatch(rf"environment\s+{re.escape(env_id)}", lines[0])
    assert any(re.fullmatch(r"projects\s+0", line) for line in lines)
    assert any(line.startswith("listener") and "peerd.sock (unix)" in line for line in lines)
    data = json.loads(ok(as_json))
    assert data["environmentId"] == env_id
    assert data["counts"] == {"projects": 0, "threads": 0, "liveRuns": 0}
    assert data["home"] == str(home_of(daemon))


async def test_an_unknown_thread_exits_1_with_the_error_code(daemon: Daemon) -> None:
    home = home_of(daemon)
    runs = await asyncio.gather(
        peerd(home, "thread", "show", "thr_nope"), peerd(home, "thread", "send", "thr_nope", "hello")
    )
    for done in runs:
        assert done.returncode == EXIT_ERROR, done.stderr
        assert done.stderr.startswith("error: thread_not_found:"), done.stderr
        assert "thr_nope" in done.stderr
        assert done.stdout == ""


@pytest.mark.slow
async def test_project_add_list_show_remove(daemon: Daemon, repo: Path) -> None:
    home = home_of(daemon)
    added = ok(await peerd(home, "project", "add", str(repo), "--name", "demo"))
    match = re.search(r"^id\s+(prj_\w+)$", added, re.MULTILINE)
    assert match, added
    project_id = match.group(1)
    assert re.search(r"^repository\s+github\.com/peerd/demo$", added, re.MULTILINE)

    listed, shown = await asyncio.gather(
        peerd(home, "project", "list"), peerd(home, "project", "show", "demo")
    )
    rows = ok(listed).splitlines()
    assert rows[0].split() == ["ID", "NAME", "REPOSITORY", "PATH"]
    assert rows[1].split() == [project_id, "demo", "github.com/peerd/demo", str(repo)]
    assert len(rows) == 2
    assert re.search(rf"^path\s+{re.escape(str(repo))}$", ok(shown), re.MULTILINE)

    again = await peerd(home, "project", "add", str(repo))
    assert again.returncode == EXIT_ERROR
    assert again.stderr.startswith("error: project_exists:"), again.stderr

    removed = ok(await peerd(home, "project", "remove", project_id))
    assert removed.strip() == f"removed project {project_id} (demo)"
    gone = await peerd(home, "project", "show", project_id)
    assert gone.returncode == EXIT_ERROR
    assert gone.stderr.startswith("error: project_not_found:"), gone.stderr


@pytest.mark.slow
async def test_thread_launch_show_send_wait_list_archive(daemon: Daemon, project: dict[str, Any]) -> None:
    home = home_of(daemon)
    prompt = script({"reply_repeat": {"text": "abcde", "times": 9000}})
    launched = ok(
        await peerd(home, "thread", "launch", "--project", "repo", "--prompt", prompt, "--wait", "30")
    )
    match = re.search(r"^thread (thr_\w+) run (run_\w+) \w+$", launched, re.MULTILINE)
    assert match, launched
    thread_id, run_id = match.groups()
    assert f"run {run_id} completed" in launched.splitlines()
    shown_worktree = re.search(r"^worktree (.+)$", launched, re.MULTILINE)
    assert shown_worktree, launched
    worktree = Path(shown_worktree.group(1))
    assert worktree.is_dir()

    shown = ok(await peerd(home, "thread", "show", thread_id))
    assert re.search(rf"^last run\s+{run_id} #1 completed$", shown, re.MULTILINE)
    assert f"assistant message: {LONG_REPLY}\n" in shown, "the 45,000-character reply is printed whole"

    sent = ok(await peerd(home, "thread", "send", thread_id, "a follow-up"))
    match = re.fullmatch(r"run (run_\w+) (queued|starting|running)\n", sent)
    assert match, sent
    second_run = match.group(1)
    waited = ok(await peerd(home, "thread", "wait", thread_id, "--timeout", "30"))
    assert waited == f"run {second_run} completed\n"

    listed = json.loads(ok(await peerd(home, "thread", "list", "--json")))
    assert [(t["id"], t["latestRun"]["id"], t["latestRun"]["status"]) for t in listed] == [
        (thread_id, second_run, "completed")
    ]

    archived = ok(await peerd(home, "thread", "archive", thread_id))
    assert archived.strip() == f"archived {thread_id}; worktree removed"
    assert not worktree.exists()
    with_archived = json.loads(ok(await peerd(home, "thread", "list", "--all", "--json")))
    assert [(t["id"], t["status"]) for t in with_archived] == [(thread_id, "archived")]


@pytest.mark.slow
async def test_wait_times_out_on_a_held_run_and_stop_holds_the_queue(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    home = home_of(daemon)
    never = tmp_path / "never-created"
    prompt = script({"wait_for_file": str(never)}, {"reply": "unreachable"})
    launched = ok(await peerd(home, "thread", "launch", "--project", str(project["id"]), "--prompt", prompt))
    match = re.search(r"^thread (thr_\w+) run (run_\w+)", launched, re.MULTILINE)
    assert match, launched
    thread_id, run_id = match.groups()

    timed_out = await peerd(home, "thread", "wait", thread_id, "--timeout", "0.2")
    assert timed_out.returncode == EXIT_TIMED_OUT, timed_out.stderr
    assert re.fullmatch(rf"run {run_id} (starting|running) \(still live: timed out\)\n", timed_out.stdout)

    stopped = ok(await peerd(home, "thread", "interrupt", thread_id, "--stop"))
    assert stopped.strip() == f"interrupt requested (run {run_id}), queue held"
    waited = await peerd(home, "thread", "wait", thread_id, "--timeout", "30")
    assert waited.returncode == EXIT_RUN_STOPPED  # 0 only for completed
    assert waited.stdout == f"run {run_id} interrupted: Stopped.\n"
    shown = ok(await peerd(home, "thread", "show", thread_id))
    assert re.search(r"^status\s+active, queue held$", shown, re.MULTILINE)
    assert "assistant message: unreachable" not in shown

    # A new message releases the held queue and runs.
    sent = ok(await peerd(home, "thread", "send", thread_id, "carry on"))
    second_run = sent.split()[1]
    waited = ok(await peerd(home, "thread", "wait", thread_id, "--run", second_run, "--timeout", "30"))
    assert waited == f"run {second_run} completed\n"
