"""The command line starts at once: what it imports, lazily loaded commands, `--home` after the
subcommand, the not-running hint, and `peerd status --wait`.

Time is measured by bench/cli_start.py (ratios against `python -c ''`), never here: these tests
check the causes instead. Each command runs as a real process (`python -m peerd`) through a
wrapper that writes the modules it imported at exit, against a real daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from peerd.cli.common import EXIT_NOT_RUNNING, EXIT_OK
from peerd.cli.main import COMMANDS, cli
from peerd.daemon import Daemon
from tests.helpers import DaemonProcess

# Each costs 0.1 to 1.2 s to import; none is needed to print help or call the daemon.
HEAVY = ("aiohttp", "yarl", "aiosqlite", "cryptography", "mcp", "pydantic", "asyncio", "structlog")
COMMAND_MODULES = sorted({lazy.target.partition(":")[0] for lazy in COMMANDS.values()})

# Runs `peerd ARGS...` in this interpreter and writes sorted(sys.modules) to OUT when it exits
# (click ends every command with sys.exit, so atexit is the one place that sees them all).
WRAPPER = """
import atexit, json, runpy, sys
out, *args = sys.argv[1:]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["peerd", *args]
runpy.run_module("peerd", run_name="__main__", alter_sys=True)
"""


def heavy_in(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PEERD_HOME", "PEERD_CONFIG")}
    return {**env, "COLUMNS": "80", **extra}


def imported_by(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """(modules a `peerd ARGS` process had imported when it exited, its stdout)."""
    out = tmp_path / "modules.json"
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env or clean_env(),
        check=False,
    )
    assert done.returncode == EXIT_OK, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    modules: list[str] = json.loads(out.read_text())
    return modules, done.stdout


async def peerd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env or clean_env(),
        check=False,
    )


# --- what the CLI imports ----------------------------------------------------------------------


def test_no_cli_module_imports_anything_heavy_at_load() -> None:
    """Every peerd.cli module, the command modules included: `peerd <cmd>` loads one of them."""
    code = (
        "import importlib, json, sys\n"
        f"for name in ['peerd.cli.main', *{COMMAND_MODULES!r}]:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env(), check=True
    )
    modules = json.loads(done.stdout)
    assert set(COMMAND_MODULES) <= set(modules)
    assert heavy_in(modules) == [], "a peerd.cli module imports these at load; import them where used"


@pytest.mark.slow
async def test_the_quick_commands_import_nothing_heavy(daemon: Daemon, tmp_path: Path) -> None:
    home = str(daemon.paths.home)
    for args in (
        ("--help",),
        ("--version",),
        ("--home", home, "status"),
        ("--home", home, "thread", "list"),
        ("--home", home, "environment", "list"),
    ):
        modules, _ = await asyncio.to_thread(imported_by, tmp_path, *args)
        assert heavy_in(modules) == [], args
        if args[0] in ("--help", "--version"):
            assert not set(COMMAND_MODULES) & set(modules), f"{args} loaded a command module"
        # what only `thread show` / `task show` print (four frozen dataclasses: 4-9 ms)
        assert "peerd.core.usage" not in modules, args


def test_a_command_help_loads_only_that_command(tmp_path: Path) -> None:
    modules, out = imported_by(tmp_path, "thread", "list", "--help")
    assert out.startswith("Usage: peerd thread list [OPTIONS]")
    assert [m for m in COMMAND_MODULES if m in modules] == ["peerd.cli.threads"]
    assert heavy_in(modules) == []


def test_top_help_is_what_click_prints_with_every_command_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summaries in COMMANDS are each command's own short help: `peerd --help` printed from
    them (nothing loaded, a fresh process) equals click's own listing of the loaded commands."""
    _, lazy_help = imported_by(tmp_path, "--help")
    monkeypatch.setenv("COLUMNS", "80")
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        assert COMMANDS[name].summary == command.get_short_help_str(limit=1000), name
    # The terminal's width (COLUMNS), as in the process; CliRunner would force its own.
    with click.Context(cli, info_name="peerd", **cli.context_settings) as ctx:
        loaded_help = cli.get_help(ctx)
    assert lazy_help.rstrip("\n") == loaded_help


# --- --home after the subcommand ----------------------------------------------------------------


@pytest.mark.slow
async def test_home_after_the_subcommand(daemon: Daemon, tmp_path: Path) -> None:
    home = str(daemon.paths.home)
    elsewhere = str(tmp_path / "no-daemon-here")
    before = await peerd("--home", home, "thread", "list", "--json")
    assert before.returncode == EXIT_OK, before.stderr
    runs = await asyncio.gather(
        peerd("thread", "list", "--json", "--home", home),
        peerd("status", "--home", home, "--json"),
        peerd("thread", "--home", home, "list", "--json"),
        # given twice, the one after the subcommand wins, over --home and over PEERD_HOME
        peerd("--home", elsewhere, "status", "--home", home, "--json"),
        peerd("status", "--home", home, "--json", env=clean_env(PEERD_HOME=elsewhere)),
        peerd("status", "--json", env=clean_env(PEERD_HOME=home)),
    )
    for done in runs:
        assert done.returncode == EXIT_OK, (done.args, done.stderr)
    assert runs[0].stdout == before.stdout
    statuses: list[dict[str, Any]] = [json.loads(done.stdout) for done in runs[1:2] + runs[3:]]
    assert daemon.identity is not None
    assert {s["environmentId"] for s in statuses} == {daemon.identity.env_id}


@pytest.mark.slow
async def test_not_running_hint_names_the_home_as_it_was_given(tmp_path: Path) -> None:
    home = tmp_path / "idle"
    by_flag, after_subcommand, by_env, by_default = await asyncio.gather(
        peerd("--home", str(home), "status"),
        peerd("thread", "list", "--home", str(home)),
        peerd("status", env=clean_env(PEERD_HOME=str(home))),
        peerd("status", env=clean_env(XDG_DATA_HOME=str(tmp_path / "xdg"))),
    )
    for done in (by_flag, after_subcommand, by_env, by_default):
        assert done.returncode == EXIT_NOT_RUNNING, done.stderr
        assert done.stderr.startswith("error: peerd is not running (no daemon answers at "), done.stderr
        assert "Traceback" not in done.stderr
    assert f"Start it with `peerd --home {home} serve`." in by_flag.stderr
    assert f"Start it with `peerd --home {home} serve`." in after_subcommand.stderr
    assert f"Start it with `PEERD_HOME={home} peerd serve`." in by_env.stderr
    assert "Start it with `peerd serve`." in by_default.stderr


# --- peerd status --wait -------------------------------------------------------------------------


@pytest.mark.slow
async def test_status_wait_answers_once_a_just_started_daemon_does(tmp_path: Path) -> None:
    """The README's `peerd serve &` then `peerd status --wait 10`: no failure while it starts."""
    proc = DaemonProcess(tmp_path / "home")
    proc.start()
    try:
        done = await peerd("--home", str(proc.home), "status", "--wait", "10", "--json")
        assert done.returncode == EXIT_OK, done.stderr + (proc.home / "daemon.log").read_text()
        assert json.loads(done.stdout)["label"] == "proc"
    finally:
        proc.kill()


@pytest.mark.slow
async def test_status_wait_exits_3_when_no_daemon_answers(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    done = await peerd("--home", str(tmp_path / "idle"), "status", "--wait", "0.3")
    assert done.returncode == EXIT_NOT_RUNNING, done.stderr
    assert "peerd is not running" in done.stderr
    assert loop.time() - started >= 0.3, "it gave up before the time it was given"
