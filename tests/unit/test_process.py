"""ProviderProcess against real subprocesses: lines, stderr, stdin, crashes, group interrupts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from peerd.errors import ProviderError
from peerd.runtime.process import STDERR_HEAD_BYTES, STDERR_TAIL_BYTES, ProviderProcess
from tests.support.eventually import eventually


async def spawn(
    script: str, tmp_path: Path, *, stdin: bytes | None = None, straggler_grace: float = 2.0
) -> ProviderProcess:
    return await ProviderProcess.spawn(
        ["sh", "-c", script],
        cwd=tmp_path,
        env=dict(os.environ),
        stdin_data=stdin,
        straggler_grace=straggler_grace,
    )


async def collect(proc: ProviderProcess) -> list[dict[str, object] | str]:
    async with asyncio.timeout(20):
        return [line async for line in proc.lines()]


def live_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (this sandbox's init may never reap orphans)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def is_dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def all_dead(pgid: int, *pids: int) -> bool:
    """Whether the group and `pids` are all dead, allowing a SIGKILL sent a moment ago to land."""
    await eventually(
        lambda: not live_members(pgid) and all(is_dead(pid) for pid in pids),
        what=f"group {pgid} and {pids} dead",
        within=5,
        every=0.01,
    )
    return True


async def test_lines_parse_json_objects_and_keep_other_lines_raw(tmp_path: Path) -> None:
    script = """
echo '{"type": "a", "n": 1}'
echo 'not json'
echo ''
echo '[1, 2]'
echo '42'
echo '{"type": "b"}'
echo 'log noise' >&2
"""
    proc = await spawn(script, tmp_path)
    assert await collect(proc) == [{"type": "a", "n": 1}, "not json", "[1, 2]", "42", {"type": "b"}]
    assert await proc.wait() == 0
    assert "log noise" in proc.stderr_tail()
    assert proc.pgid == proc.pid


async def test_very_long_line_is_one_event(tmp_path: Path) -> None:
    code = "import json; print(json.dumps({'text': 'x' * 3_000_000}))"
    proc = await ProviderProcess.spawn(
        [sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), stdin_data=None
    )
    lines = await collect(proc)
    assert await proc.wait() == 0
    assert len(lines) == 1
    first = lines[0]
    assert isinstance(first, dict)
    assert first["text"] == "x" * 3_000_000


async def test_stdin_data_is_written_then_closed(tmp_path: Path) -> None:
    proc = await spawn("cat", tmp_path, stdin=b'{"prompt": "hello"}\n')
    assert await collect(proc) == [{"prompt": "hello"}]
    assert await proc.wait() == 0


async def test_no_stdin_data_means_dev_null(tmp_path: Path) -> None:
    proc = await spawn("cat; echo done", tmp_path)
    assert await collect(proc) == ["done"]
    assert await proc.wait() == 0


async def test_stderr_is_drained_and_bounded(tmp_path: Path) -> None:
    # 1 MiB of stderr before any stdout: an undrained pipe (64 KiB) would block the child.
    code = (
        "import sys; sys.stderr.write('FIRST: bad flag\\n'); sys.stderr.write('e' * (1 << 20)); "
        "sys.stderr.write('THE END'); sys.stderr.flush(); print('{\"ok\": true}')"
    )
    proc = await ProviderProcess.spawn(
        [sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), stdin_data=None
    )
    assert await collect(proc) == [{"ok": True}]
    assert await proc.wait() == 0
    kept = proc.stderr_tail()
    assert len(kept) <= STDERR_TAIL_BYTES + STDERR_HEAD_BYTES + 5
    assert kept.endswith("THE END"), "the end, where a fatal message is"
    assert kept.startswith("FIRST: bad flag\n"), "and the start, where a usage error is"


async def test_crash_reports_exit_code_and_stderr(tmp_path: Path) -> None:
    proc = await spawn("echo oops >&2; exit 3", tmp_path)
    assert await collect(proc) == []
    assert await proc.wait() == 3
    assert proc.stderr_tail().strip() == "oops"


async def test_spawn_failure_is_a_provider_error(tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match="cannot start /nonexistent/coder"):
        await ProviderProcess.spawn(["/nonexistent/coder"], cwd=tmp_path, env={}, stdin_data=None)


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    """This process ignoring SIGINT and SIGQUIT, as a daemon started by `nohup` or `cmd &` from a
    script does (and the test suite run in the background)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGQUIT)}
    for sig in before:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def ignored_mask(status: str) -> int:
    return int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)


async def test_a_daemon_that_ignores_sigint_starts_its_runs_with_it_restored(
    tmp_path: Path, sigint_ignored: None
) -> None:
    """An ignored disposition survives exec: without the shim the run could not be interrupted
    with SIGINT, and would wait for the SIGTERM fallback."""
    proc = await spawn("cat /proc/self/status", tmp_path)
    mask = ignored_mask("\n".join(str(line) for line in await collect(proc)))
    assert not mask & (1 << (signal.SIGINT - 1)) and not mask & (1 << (signal.SIGQUIT - 1)), hex(mask)
    proc = await spawn("echo started; exec sleep 30", tmp_path)
    lines = proc.lines()
    assert await anext(lines) == "started"
    await proc.interrupt()
    assert await proc.wait() == -signal.SIGINT  # SIGINT itself ended it, not the TERM fallback
    refused = await ProviderProcess.spawn(["/nonexistent/coder"], cwd=tmp_path, env={}, stdin_data=None)
    assert await refused.wait() == 127 and "cannot start /nonexistent/coder" in refused.stderr_tail()


async def test_interrupt_sigint_stops_a_cooperative_leader(tmp_path: Path) -> None:
    proc = await spawn("echo started; exec sleep 30", tmp_path)
    lines = proc.lines()
    assert await anext(lines) == "started"
    started = time.monotonic()
    await proc.interrupt(grace_int=5, grace_term=5)
    assert time.monotonic() - started < 4
    assert await proc.wait() == -2
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pgid, 0)
    assert [line async for line in lines] == []


async def test_ignored_int_and_term_escalate_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    # Leader and child both ignore INT and TERM (signal dispositions survive fork and exec).
    proc = await spawn('trap "" INT TERM; sleep 30 & echo $!; wait', tmp_path)
    lines = proc.lines()
    child = int(str(await anext(lines)))
    assert live_members(proc.pgid) != []
    started = time.monotonic()
    await proc.interrupt(grace_int=0.2, grace_term=0.2)
    assert 0.35 < time.monotonic() - started < 5
    assert await proc.wait() == -9
    assert await all_dead(proc.pgid, child)


async def test_sigkill_escalation_reaches_a_foreground_child(tmp_path: Path) -> None:
    proc = await spawn('trap "" INT TERM; sleep 30', tmp_path)
    await eventually(
        lambda: len(live_members(proc.pgid)) >= 2, what="the shell and its sleep", within=10, every=0.01
    )
    (child,) = set(live_members(proc.pgid)) - {proc.pid}
    await proc.interrupt(grace_int=0.1, grace_term=0.1)
    assert await proc.wait() == -9
    assert await all_dead(proc.pgid, child)


async def test_stragglers_are_killed_when_the_leader_exits_on_sigint(tmp_path: Path) -> None:
    # The leader dies on SIGINT at once; its child ignores INT and TERM and would outlive it.
    proc = await spawn('(trap "" INT TERM; exec sleep 30) & echo $!; wait', tmp_path)
    lines = proc.lines()
    child = int(str(await anext(lines)))
    started = time.monotonic()
    await proc.interrupt(grace_int=10, grace_term=10)
    assert time.monotonic() - started < 5
    assert await proc.wait() == -2
    assert await all_dead(proc.pgid, child)


async def test_interrupt_is_idempotent_and_safe_concurrently(tmp_path: Path) -> None:
    proc = await spawn("echo started; exec sleep 30", tmp_path)
    lines = proc.lines()
    assert await anext(lines) == "started"
    async with asyncio.timeout(10):
        await asyncio.gather(proc.interrupt(), proc.interrupt(), proc.kill_group())
        await proc.interrupt()
        await proc.kill_group()
    assert proc.returncode is not None
    assert [line async for line in lines] == []


async def test_interrupt_after_exit_is_a_no_op(tmp_path: Path) -> None:
    proc = await spawn("echo bye", tmp_path)
    assert await collect(proc) == ["bye"]
    assert await proc.wait() == 0
    async with asyncio.timeout(2):
        await proc.interrupt()
        await proc.kill_group()
    assert proc.returncode == 0


async def test_kill_group_kills_at_once(tmp_path: Path) -> None:
    proc = await spawn('trap "" INT TERM; sleep 30 & echo $!; wait', tmp_path)
    lines = proc.lines()
    child = int(str(await anext(lines)))
    async with asyncio.timeout(5):
        await proc.kill_group()
    assert await proc.wait() == -9
    assert await all_dead(proc.pgid, child)


async def test_background_child_holding_stdout_is_reaped_after_the_leader_exits(tmp_path: Path) -> None:
    # The leader exits, a forgotten background process keeps stdout open: reading must still end.
    proc = await spawn("sleep 30 & echo $!", tmp_path, straggler_grace=0.2)
    async with asyncio.timeout(5):
        lines = await collect(proc)
        assert await proc.wait() == 0
    assert len(lines) == 1
    assert await all_dead(proc.pgid, int(str(lines[0])))


async def test_spawning_happens_off_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule: fork/exec of a provider never runs on the loop thread (it blocks every request)."""
    import subprocess  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from peerd.runtime import process as process_module  # noqa: PLC0415

    threads: list[str] = []
    real = subprocess.Popen

    def popen(*args: object, **kw: object) -> object:
        threads.append(threading.current_thread().name)
        return real(*args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(process_module.subprocess, "Popen", popen)
    proc = await spawn("echo '{\"a\": 1}'; echo done >&2", tmp_path, stdin=b"ignored")
    assert await collect(proc) == [{"a": 1}]
    assert await proc.wait() == 0
    assert "done" in proc.stderr_tail()
    assert threads and threads[0] != threading.current_thread().name


@pytest.mark.slow
async def test_a_spawn_cancelled_midway_leaves_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    task = asyncio.ensure_future(spawn(f"touch {marker}; exec sleep 30", tmp_path))
    await asyncio.sleep(0)  # the spawn is in its worker thread now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with contextlib.suppress(AssertionError):  # a spawn cancelled before its exec touches nothing
        await eventually(marker.exists, what="the marker", within=5, every=0.01)
    sleepers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == "sleep\x0030\x00"]
    await asyncio.sleep(0.2)  # the kill of a cancelled spawn lands a moment later
    assert all(is_dead(int(p.name)) for p in sleepers if _cwd(p) == str(tmp_path))


def _cmdline(entry: Path) -> str:
    try:
        return (entry / "cmdline").read_text()
    except OSError:
        return ""


def _cwd(entry: Path) -> str:
    try:
        return str((entry / "cwd").readlink())
    except OSError:
        return ""
