"""Habits people bring from gh, docker and tailscale (issue 13), with the real `peerd` command line
against a real daemon: `--json FIELDS` and `-q` on lists, ISO 8601 times in JSON, rows a title's
line break cannot split, `thread wait --follow` / `thread events --follow` streaming lines as
things happen (exit 0 when the run ends, 130 on Ctrl-C), and `task list` without a thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from peerd.cli.common import EXIT_USAGE
from peerd.daemon import Daemon
from tests.helpers import script
from tests.support.cli import home_of, ok, peerd
from tests.support.tasks import GONE, seed

pytestmark = pytest.mark.slow  # each test takes over half a second (on 2 cores)

ISO_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LINE_TIMEOUT_S = 60.0


class Stream:
    """A `peerd` process whose stdout is read line by line while it runs."""

    def __init__(self, home: Path, *args: str) -> None:
        self.proc = subprocess.Popen(  # our own CLI, fixed arguments
            [sys.executable, "-m", "peerd", "--home", str(home), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []

    async def line(self) -> str:
        assert self.proc.stdout is not None
        text = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), LINE_TIMEOUT_S)
        if text:
            self.lines.append(text.rstrip("\n"))
        return text.rstrip("\n") if text else ""

    async def until(self, pattern: str) -> str:
        while True:
            text = await self.line()
            assert text or self.proc.poll() is None, f"ended before {pattern!r}: {self.lines}"
            if re.search(pattern, text):
                return text

    async def finish(self) -> tuple[int, str]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        while await self.line():
            pass
        code = await asyncio.to_thread(self.proc.wait, LINE_TIMEOUT_S)
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        """End it if it still runs, and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


async def launch(home: Path, project: dict[str, Any], prompt: str, *extra: str) -> tuple[str, str]:
    data = json.loads(
        ok(
            await peerd(
                home,
                "thread",
                "launch",
                "--project",
                str(project["id"]),
                "--prompt",
                prompt,
                *extra,
                "--json",
            )
        )
    )
    return str(data["threadId"]), str(data["runId"])


async def test_lists_take_json_fields_and_q_and_a_title_keeps_to_its_row(
    daemon: Daemon, project: dict[str, Any]
) -> None:
    home = home_of(daemon)
    first, _ = await launch(
        home, project, script({"reply": "a"}), "--title", "two\nlines\x1b[2J here", "--wait", "30"
    )
    second, _ = await launch(home, project, script({"reply": "b"}), "--wait", "30")

    table = ok(await peerd(home, "thread", "list")).splitlines()
    assert len(table) == 3, table  # the header and one row per thread
    assert re.match(rf"{first}\s+two lines here\s", table[2]), table  # newest first

    quiet, fields, shown, unknown = await asyncio.gather(
        peerd(home, "thread", "list", "-q"),
        peerd(home, "thread", "list", "--json", "id,status"),
        peerd(home, "thread", "show", "--json", first),
        peerd(home, "thread", "list", "--json", "id,state"),
    )
    assert ok(quiet).splitlines() == [second, first]  # `thread list -q | head -1`: the latest
    assert json.loads(ok(fields)) == [{"id": second, "status": "active"}, {"id": first, "status": "active"}]
    limited = ok(await peerd(home, "thread", "list", "-q", "--limit", "1"))
    assert limited.splitlines() == [second]
    record = json.loads(ok(shown))
    assert record["thread"]["id"] == first  # `--json THREAD_ID`: the id, not a field list
    assert ISO_Z.fullmatch(record["thread"]["createdAt"]) and ISO_Z.fullmatch(record["items"][0]["createdAt"])
    assert ISO_Z.fullmatch(record["thread"]["latestRun"]["endedAt"])
    assert unknown.returncode == EXIT_USAGE and unknown.stdout == ""
    assert "No field 'state' here; the fields are: id, " in unknown.stderr

    human = ok(await peerd(home, "thread", "show", first))
    assert re.search(r"^updated\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+, (just now|\d+ s ago)$", human, re.M), (
        human
    )


async def test_wait_follow_prints_items_as_the_run_makes_them(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    home = home_of(daemon)
    gate = tmp_path / "gate"
    prompt = script({"reply": "first part"}, {"wait_for_file": str(gate)}, {"reply": "second\npart"})
    thread_id, run_id = await launch(home, project, prompt)
    text = Stream(home, "thread", "wait", thread_id, "--follow", "--timeout", "60")
    as_json = Stream(home, "thread", "wait", "--follow", thread_id, "--json", "--timeout", "60")
    try:
        # Both see the first reply while the run still waits for the gate.
        assert (await text.until("assistant message")) == "[1] assistant message: first part"
        first = json.loads(await as_json.until("assistant_message"))
        assert (
            first["text"] == "first part" and first["runId"] == run_id and ISO_Z.fullmatch(first["createdAt"])
        )
        gate.write_text("go")
        code, err = await text.finish()
        assert code == 0, err
        assert text.lines[0] == f"[0] user message: {prompt.splitlines()[0]}"
        assert text.lines[-3:] == ["[2] assistant message: second", "part", f"run {run_id} completed"]
        code, err = await as_json.finish()
        assert code == 0, err
        records = [json.loads(line) for line in as_json.lines]
        assert [r["kind"] for r in records[:-1]] == ["user_message", "assistant_message", "assistant_message"]
        assert (
            records[-1]["runId"] == run_id
            and records[-1]["status"] == "completed"
            and records[-1]["terminal"]
        )
    finally:
        text.kill()
        as_json.kill()


async def test_wait_follow_stops_at_its_timeout_with_exit_4(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    home = home_of(daemon)
    thread_id, run_id = await launch(
        home, project, script({"reply": "hello"}, {"wait_for_file": str(tmp_path / "no")})
    )
    done = await peerd(home, "thread", "wait", thread_id, "--follow", "--timeout", "1")
    assert done.returncode == 4, done.stderr
    assert done.stdout.splitlines()[-2:] == [
        "[1] assistant message: hello",
        f"run {run_id} running (still live: timed out)",
    ]
    await peerd(home, "thread", "interrupt", thread_id, "--stop")


async def test_events_follow_streams_readable_lines_until_ctrl_c(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    home = home_of(daemon)
    gate = tmp_path / "gate"
    thread_id, run_id = await launch(home, project, script({"wait_for_file": str(gate)}, {"reply": "done"}))
    text = Stream(home, "thread", "events", thread_id, "--follow")
    as_json = Stream(home, "thread", "events", "--follow", "--json", "seq,type,data", thread_id)
    try:
        assert re.fullmatch(
            rf"1  \S+ \S+ \S+  thread\.created  thread {thread_id} created",
            await text.until("thread.created"),
        )
        gate.write_text("go")
        ended = await text.until(f"run {run_id} completed")
        assert re.fullmatch(rf"\d+  \S+ \S+ \S+  run\.updated  run {run_id} completed", ended)
        assert any(re.search(r"item\.added  assistant_message item #1 in run ", line) for line in text.lines)
        assert not any("{" in line for line in text.lines), text.lines  # never a dict repr
        record = json.loads(await as_json.until('"status":"completed"'))
        assert set(record) == {"seq", "type", "data"} and record["type"] == "run.updated"
        for stream in (text, as_json):
            stream.proc.send_signal(signal.SIGINT)
            code, _ = await stream.finish()
            assert code == 130
    finally:
        text.kill()
        as_json.kill()

    table = ok(await peerd(home, "thread", "events", thread_id))
    assert "{" not in table and re.search(rf"run\.updated\s+run {run_id} completed", table), table


async def test_a_closed_pipe_ends_a_follow_quietly(daemon: Daemon, project: dict[str, Any]) -> None:
    """`| head -n 1`: the next line the stream writes finds the pipe closed; it ends with 0, no
    traceback (a stream that has nothing more to write waits, as `tail -f | head` does)."""
    home = home_of(daemon)
    steps = [{"reply": "a"}, {"wait": 1}, {"reply": "b"}, {"wait": 1}, {"reply": "c"}]
    thread_id, _ = await launch(home, project, script(*steps))
    line = f"{sys.executable} -m peerd --home {home} thread events {thread_id} --follow | head -n 1"
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


async def test_task_list_without_a_thread_newest_first_with_filters(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    home = home_of(daemon)
    assert daemon.db is not None
    parents = [await launch(home, project, script({"reply": "p"}), "--wait", "30") for _ in range(2)]
    made = await seed(daemon.db, parents, 9)
    newest = [t["taskId"] for t in reversed(made)]

    everything, quiet, running, of_parent, as_arg, there, limited, picked = await asyncio.gather(
        peerd(home, "task", "list"),
        peerd(home, "task", "list", "-q"),
        peerd(home, "task", "list", "-q", "--status", "running", "--status", "pending"),
        peerd(home, "task", "list", "-q", "--thread", parents[1][0]),
        peerd(home, "task", "list", "-q", parents[1][0], "--status", "completed,failed"),
        peerd(home, "task", "list", "-q", "--env", GONE),
        peerd(home, "task", "list", "-q", "--limit", "2"),
        peerd(home, "task", "list", "--json", "taskId,status,createdAt", "--limit", "1"),
    )
    rows = ok(everything).splitlines()
    assert rows[0].split()[:4] == ["ID", "STATUS", "TITLE", "PARENT"] and len(rows) == 10
    assert [row.split()[0] for row in rows[1:]] == newest
    assert ok(quiet).splitlines() == newest
    assert ok(running).splitlines() == [
        t["taskId"] for t in reversed(made) if t["status"] in ("running", "pending")
    ]
    assert ok(of_parent).splitlines() == [t["taskId"] for t in reversed(made) if t["parent"] == parents[1][0]]
    assert ok(as_arg).splitlines() == [
        t["taskId"]
        for t in reversed(made)
        if t["parent"] == parents[1][0] and t["status"] in ("completed", "failed")
    ]
    assert ok(there).splitlines() == [t["taskId"] for t in reversed(made) if t["target"] == GONE]
    assert ok(limited).splitlines() == newest[:2]
    assert "the newest 2 shown; --limit 0 lists them all" in limited.stderr
    [record] = json.loads(ok(picked))
    assert list(record) == ["taskId", "status", "createdAt"] and ISO_Z.fullmatch(record["createdAt"])

    # A wrong status is refused before anything is sent: no daemon is needed to say so.
    refused = await peerd(tmp_path / "no-daemon", "task", "list", "--status", "runing")
    assert refused.returncode == EXIT_USAGE
    assert "'runing' is not a task status; use pending, running, completed" in refused.stderr


def run_peerd(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # our own CLI
        [sys.executable, "-m", "peerd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )


async def test_each_named_home_reads_its_own_config_file(tmp_path: Path) -> None:
    """Two environments side by side, each with `<home>/config.toml`; the XDG file (the default
    home's) is not read by either; `--config` still wins; `config show` names the file."""
    xdg = tmp_path / "xdg"
    (xdg / "peerd").mkdir(parents=True)
    (xdg / "peerd" / "config.toml").write_text('label = "from-xdg"\nlisten = "127.0.0.1:1"\n')
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    for home, label in ((alpha, "alpha"), (beta, "beta")):
        home.mkdir()
        (home / "config.toml").write_text(f'label = "{label}"\nlisten = false\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PEERD_HOME", "PEERD_CONFIG")}
    env["XDG_CONFIG_HOME"] = str(xdg)
    daemons = [
        subprocess.Popen(
            [sys.executable, "-m", "peerd", "--home", str(alpha), "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "peerd", "serve"],
            env={**env, "PEERD_HOME": str(beta)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        a, b = await asyncio.gather(
            asyncio.to_thread(
                run_peerd, env, "--home", str(alpha), "status", "--wait", "30", "--json", "label"
            ),
            asyncio.to_thread(
                run_peerd, {**env, "PEERD_HOME": str(beta)}, "status", "--wait", "30", "--json"
            ),
        )
        assert json.loads(ok(a)) == {"label": "alpha"}
        assert json.loads(ok(b))["label"] == "beta" and json.loads(b.stdout)["listeners"][0]["kind"] == "unix"
        shown = ok(await asyncio.to_thread(run_peerd, env, "config", "show", "--home", str(alpha)))
        assert re.search(rf"^file\s+{re.escape(str(alpha / 'config.toml'))}$", shown, re.M), shown
        assert re.search(r"^label\s+alpha$", shown, re.M) and re.search(r"^listen\s+false$", shown, re.M)
    finally:
        for proc in daemons:
            proc.send_signal(signal.SIGTERM)
        for proc in daemons:
            proc.wait(30)

    # No daemon: the file is read as the daemon would; a missing one is named; --config wins.
    gamma = tmp_path / "gamma"
    missing = ok(await asyncio.to_thread(run_peerd, env, "--home", str(gamma), "config", "show"))
    assert re.search(
        rf"^file\s+none \(no {re.escape(str(gamma / 'config.toml'))}: the defaults\)$", missing, re.M
    )
    named = json.loads(
        ok(
            await asyncio.to_thread(
                run_peerd,
                env,
                "--home",
                str(alpha),
                "config",
                "show",
                "--config",
                str(beta / "config.toml"),
                "--json",
            )
        )
    )
    assert named["label"] == "beta" and named["source"] == str(beta / "config.toml")
    default = json.loads(
        ok(await asyncio.to_thread(run_peerd, env, "config", "show", "--json", "label,source"))
    )
    assert default == {"label": "from-xdg", "source": str(xdg / "peerd" / "config.toml")}


async def test_every_list_has_q_and_every_record_json_fields(daemon: Daemon, project: dict[str, Any]) -> None:
    home = home_of(daemon)
    code = json.loads(ok(await peerd(home, "pair", "--json", "info", "--label-hint", "tablet")))
    assert set(code) == {"info"} and ISO_Z.fullmatch(code["info"]["expiresAt"])
    projects, providers, pairs, clients, environments, shown, status = await asyncio.gather(
        peerd(home, "project", "list", "-q"),
        peerd(home, "provider", "list", "-q"),
        peerd(home, "pair", "list", "-q"),
        peerd(home, "client", "list", "-q"),
        peerd(home, "environment", "list", "-q", "--offline"),
        peerd(home, "project", "show", "--json", "name,createdAt", str(project["id"])),
        peerd(home, "status", "--json", "label,counts"),
    )
    assert ok(projects).splitlines() == [project["id"]]
    assert "script" in ok(providers).splitlines()
    assert ok(pairs).splitlines() == [code["info"]["id"]]
    assert ok(clients) == "" and ok(environments) == ""
    record = json.loads(ok(shown))
    assert record["name"] == project["name"] and ISO_Z.fullmatch(record["createdAt"])
    assert json.loads(ok(status)) == {"label": "test", "counts": {"projects": 1, "threads": 0, "liveRuns": 0}}
    human = ok(await peerd(home, "pair", "list"))
    assert re.search(r"\bin (\d+ min|\d+ s)\b", human), human  # expires: how long from now


BASH_TAB = """
set -e
eval "$(peerd completion bash)"
tab() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _peerd_completion peerd; echo "${COMPREPLY[*]}"; }
tab peerd th
tab peerd thread l
tab peerd task list --st
"""


def test_bash_completes_peerd_th_to_thread(tmp_path: Path) -> None:
    """The script `peerd completion bash` prints, sourced in a real bash, completing as <TAB> would
    (click's env-var protocol: `_PEERD_COMPLETE=bash_complete` with COMP_WORDS/COMP_CWORD)."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PEERD_HOME": str(tmp_path),
    }
    done = subprocess.run(
        ["bash", "-c", BASH_TAB], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["thread", "launch list", "--status"]
    for shell in ("zsh", "fish"):
        script = run_peerd(env, "completion", shell)
        assert "_PEERD_COMPLETE" in ok(script) and f"{shell}_complete" in script.stdout
    assert run_peerd(env, "completion", "tcsh").returncode == EXIT_USAGE


BASH_IDS = """
set -e
eval "$(peerd completion bash)"
tab() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _peerd_completion peerd; echo "${COMPREPLY[*]}"; }
tab peerd thread show thr_
tab peerd thread wait "$1"
tab peerd --home /nonexistent thread show thr_
"""


async def test_bash_completes_thread_ids_from_the_daemon_and_nothing_without_one(
    daemon: Daemon, project: dict[str, Any]
) -> None:
    """A <TAB> after `thread show` offers this machine's thread ids, newest first; with no daemon
    behind the home it offers nothing and prints no error."""
    home = daemon.paths.home
    first, _ = await launch(home, project, "one")
    second, _ = await launch(home, project, "two")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PEERD_HOME": str(home),
    }
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", BASH_IDS, "bash", second[:7]],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    offered, narrowed, none = done.stdout.splitlines()
    assert offered.split() == [second, first]
    assert narrowed.split() == [second] or second[:7] == first[:7]
    assert none == "" and done.stderr == ""
