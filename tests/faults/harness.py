"""The fault suite's machinery: `peerd serve` subprocesses that can be killed with -9, a laptop and
a box linked over TLS on loopback, what each store holds (read from its file, also while its
daemon is dead), and the tally every case reports into the printed table.

A delegation here: the laptop's parent run 1 delegates a child to the box and ends; the child
runs (a `wait`, then its reply); the box's run ends, the laptop's follower ends the task, and the
parent is woken with run 2 (a `wait`, then it reads the task and replies "PARENT GOT ..."). Each
script has one more entry for a run that continues a cut one, so a continued run does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.paths import Paths
from tests.faults.invariant import backwards_runs, violations
from tests.helpers import free_port, git, make_repo, wait_started
from tests.support.eventually import eventually

FULL = os.environ.get("PEERD_FAULTS", "") == "full"  # `make faults`: the whole matrix
SEED = int(os.environ.get("PEERD_FAULT_SEED", "12"))
TRIALS = int(os.environ.get("PEERD_FAULT_TRIALS", "20" if FULL else "0"))  # random kill moments
SETTLE_S = 60.0  # a trial not settled by then counts as stuck
WAKE_GRACE_S = 8.0  # once everything is terminal, how long an owed wake may take to show up
TERMINAL_RUN = {"completed", "failed", "cancelled", "interrupted"}
TERMINAL_TASK = {"completed", "failed", "cancelled", "interrupted"}


def runs_script(*runs: list[dict[str, Any]]) -> str:
    """A prompt whose script gives each run of the session its own steps (run 2 = the wake)."""
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": steps} for steps in runs]}) + "\n```"


def delegate(**arguments: Any) -> dict[str, Any]:
    return {"tool": {"name": "delegate_task", "arguments": arguments, "check": True}}


READ_AND_REPORT = [
    {"tool": {"name": "task_status", "arguments": {"taskId": "${taskId}"}, "check": True}},
    {"reply": "PARENT GOT ${result}"},
]


def child_script(n: int, wait_s: float = 0.0, *, hold: Path | None = None) -> str:
    """A child that waits `wait_s` (or until the file `hold` exists), then replies "CHILD <n>"."""
    first = {"wait": wait_s} if hold is None else {"wait_for_file": str(hold)}
    return runs_script([first, {"reply": f"CHILD {n}"}], [{"reply": f"CHILD {n} (continued)"}])


def parent_script(child: str, box_id: str, key: str, wake_wait_s: float = 1.0) -> str:
    wake = [{"wait": wake_wait_s}, *READ_AND_REPORT]
    return runs_script(
        [delegate(task=child, target={"environmentId": box_id}, clientRequestId=key)], wake, READ_AND_REPORT
    )


# --- a daemon as a subprocess --------------------------------------------------------------------


class Serve:
    """`peerd serve` as a subprocess (its log in <home>/daemon.log), restartable on the same home."""

    def __init__(self, home: Path, *, label: str, listen: str = "127.0.0.1:0", extra: tuple[str, ...] = ()):
        self.home = home
        self.label = label
        self.listen = listen
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "peerd",
            "--home",
            str(self.home),
            "serve",
            "--listen",
            self.listen,
            "--label",
            self.label,
            *self.extra,
        ]

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "daemon.log", "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    async def ready(self, timeout: float = 30.0) -> None:
        await wait_started(self.home, self.proc, timeout=timeout, label=self.label)

    async def restart(self) -> None:
        self.start()
        await self.ready()

    def log_tail(self, lines: int = 20) -> str:
        path = self.home / "daemon.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    @property
    def db(self) -> Path:
        """The store file, as this process reaches it."""
        return Paths(self.home).db

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def term(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def exited(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)


# --- what a store holds ----------------------------------------------------------------------------


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    """Read a daemon's store from its file (read-only; its daemon may be running or dead)."""
    uri = f"{db.absolute().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, params).fetchall())


def runs_of(home: Path, thread_id: str) -> list[sqlite3.Row]:
    return rows(
        home, "SELECT id, number, status, origin FROM runs WHERE thread_id = ? ORDER BY number", (thread_id,)
    )


def tasks_of_parent(db: Path, parent: str) -> list[sqlite3.Row]:
    return rows(
        db,
        "SELECT id, status, result, child_thread_id, child_run_id FROM tasks WHERE parent_thread_id = ?",
        (parent,),
    )


def live_processes_under(directory: Path) -> list[int]:
    """Processes working in `directory` or below (a run's CLI and helpers run in its worktree)."""
    found = []
    prefix = str(directory)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = str((entry / "cwd").readlink())
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cwd.startswith(prefix) and state != "Z":
            found.append(int(entry.name))
    return found


# --- two linked daemons ----------------------------------------------------------------------------


@dataclass
class World:
    """A laptop and a box as `peerd serve` subprocesses, linked (auto), each with a clone of one origin."""

    tmp: Path
    laptop: Serve
    box: Serve
    box_id: str = ""
    here: str = ""  # the laptop's project id
    there: str = ""  # the box's project id

    def side(self, name: str) -> Serve:
        return self.laptop if name == "laptop" else self.box

    @contextlib.asynccontextmanager
    async def client(self, side: str, environment_id: str | None = None) -> AsyncIterator[LocalClient]:
        async with LocalClient(Paths(self.side(side).home).socket, environment_id=environment_id) as c:
            yield c

    async def call(self, side: str, method: str, path: str, **kw: Any) -> Any:
        async with self.client(side) as c:
            return await c.call(method, path, **kw)

    def stop(self) -> None:
        for proc in (self.laptop, self.box):
            if proc.alive:
                proc.term()
        for proc in (self.laptop, self.box):
            if proc.proc is not None:
                try:
                    proc.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill9()


def clones(tmp: Path) -> tuple[Path, Path]:
    make_repo(tmp / "seed", origin=None)
    origin = tmp / "origin.git"
    git(tmp, "clone", "-q", "--bare", str(tmp / "seed"), str(origin))
    for side in ("laptop", "box"):
        git(tmp, "clone", "-q", str(origin), str(tmp / f"{side}-repo"))
    return tmp / "laptop-repo", tmp / "box-repo"


@contextlib.asynccontextmanager
async def linked_world(
    tmp: Path, *, box_extra: tuple[str, ...] = (), laptop_extra: tuple[str, ...] = ()
) -> AsyncIterator[World]:
    laptop_repo, box_repo = clones(tmp)
    w = World(
        tmp,
        laptop=Serve(tmp / "laptop", label="laptop", extra=laptop_extra),
        box=Serve(tmp / "box", label="box", listen=f"127.0.0.1:{free_port()}", extra=box_extra),
    )
    try:
        w.laptop.start()
        w.box.start()
        await asyncio.gather(w.laptop.ready(), w.box.ready())
        w.here = (await w.call("laptop", "POST", "/v1/projects", body={"path": str(laptop_repo)}))["id"]
        w.there = (await w.call("box", "POST", "/v1/projects", body={"path": str(box_repo)}))["id"]
        code = (await w.call("box", "POST", "/v1/pair", body={"access": "auto"}))["code"]
        linked = await w.call("laptop", "POST", "/v1/links", body={"code": code, "access": "auto"})
        w.box_id = linked["environmentId"]
        yield w
    finally:
        await asyncio.to_thread(w.stop)


# --- what a delegation came to -----------------------------------------------------------------------


@dataclass
class Outcome:
    settled: bool = False
    settle_s: float | None = None  # from the restart (or the fault's end) until all settled
    orphans: int = 0  # box children of no task, processes left in worktrees after all ended
    duplicates: int = 0  # a second child launched for one task, a second wake run for one task
    lost_results: int = 0  # the task did not end completed with its child's reply
    lost_wakes: int = 0  # a task ended and its parent never finished a wake run
    stuck: int = 0  # a task or run not terminal when the trial gave up
    notes: list[str] = field(default_factory=list)
    phase: str = ""  # where the delegation was when the fault hit


def phase_of(w: World, parent: str, box_before: set[str]) -> str:
    """Where a delegation is, read from both stores (either daemon may be dead)."""
    tasks = tasks_of_parent(w.laptop.db, parent)
    if not tasks:
        return "before the task"
    task = tasks[0]
    wakes = [r for r in runs_of(w.laptop.db, parent) if r["origin"] in ("wake", "continue")]
    if task["status"] == "pending":
        return "launch in flight"
    if task["status"] == "running":
        threads = {r["id"] for r in rows(w.box.db, "SELECT id FROM threads")} - box_before
        runs = [r for thread in threads for r in runs_of(w.box.db, thread)]
        if not runs:
            return "launch in flight"
        return "child running" if any(r["status"] not in TERMINAL_RUN for r in runs) else "result owed"
    if not wakes:
        return "wake owed"
    if any(r["status"] not in TERMINAL_RUN for r in wakes):
        return "wake run live"
    return "after the wake" if any(r["status"] == "completed" for r in wakes) else "wake run cut"


async def observe(w: World, parent: str, child_n: int, box_before: set[str]) -> tuple[bool, Outcome]:
    """(everything terminal?, what is wrong so far) for one delegation of `parent`."""
    out = Outcome()
    tasks = tasks_of_parent(w.laptop.db, parent)
    parent_runs = runs_of(w.laptop.db, parent)
    box_threads = {r["id"] for r in rows(w.box.db, "SELECT id FROM threads")} - box_before
    named = {t["child_thread_id"] for t in tasks if t["child_thread_id"]}
    box_runs = [r for thread in box_threads for r in runs_of(w.box.db, thread)]
    terminal = (
        all(t["status"] in TERMINAL_TASK for t in tasks)
        and all(r["status"] in TERMINAL_RUN for r in parent_runs)
        and all(r["status"] in TERMINAL_RUN for r in box_runs)
    )
    unnamed = len(box_threads - named)  # with a task: a second launch of it; without: nobody's child
    out.orphans = 0 if tasks else unnamed
    out.duplicates = (unnamed if tasks else 0) + max(
        0, sum(1 for r in parent_runs if r["origin"] == "wake") - len(tasks)
    )
    for task in tasks:
        if task["status"] in TERMINAL_TASK and not str(task["result"] or "").startswith(f"CHILD {child_n}"):
            out.lost_results += 1
            out.notes.append(f"task {task['status']}: {str(task['result'])[:80]!r}")
        woke = any(r["origin"] in ("wake", "continue") and r["status"] == "completed" for r in parent_runs)
        if task["status"] in TERMINAL_TASK and not woke:
            out.lost_wakes += 1
    if not terminal:
        out.stuck = 1
    return terminal, out


async def settle(
    w: World, parent: str, child_n: int, box_before: set[str], *, since: float, timeout: float = SETTLE_S
) -> Outcome:
    """Poll both stores until the delegation settled (or `timeout`): nothing live, any owed wake done."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    terminal_at: float | None = None
    while True:
        terminal, out = await observe(w, parent, child_n, box_before)
        now = loop.time()
        if terminal and terminal_at is None:
            terminal_at = now
        if terminal and out.lost_wakes == 0:
            out.settled, out.settle_s = True, now - since
            break
        if now > deadline or (terminal_at is not None and now - terminal_at > WAKE_GRACE_S):
            break
        await asyncio.sleep(0.1)  # two stores, several tables: no one event says "settled"
    if out.settled:
        await asyncio.sleep(0.2)  # a run's processes end a moment after its status says so
        for side in ("laptop", "box"):
            left = live_processes_under(w.side(side).home / "worktrees")
            if left:
                out.orphans += len(left)
                out.notes.append(f"{side}: {len(left)} processes left in worktrees")
            # Owned, owed or ending (tests/faults/invariant.py): a settled store holds no open
            # record nothing owns; each one found counts as stuck.
            broken = violations(w.side(side).db) + [
                f"{r} ended before it was made" for r in backwards_runs(w.side(side).db)
            ]
            if broken:
                out.stuck += len(broken)
                out.notes.append(f"{side}: invariant broken: {broken}")
    return out


# --- the table -----------------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    trials: int = 0
    orphans: int = 0
    duplicates: int = 0
    lost_results: int = 0
    lost_wakes: int = 0
    stuck: int = 0
    settle: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)

    def add(self, out: Outcome) -> None:
        self.trials += 1
        if out.phase:
            self.phases.append(out.phase)
        self.orphans += out.orphans
        self.duplicates += out.duplicates
        self.lost_results += out.lost_results
        self.lost_wakes += out.lost_wakes
        self.stuck += out.stuck
        if out.settle_s is not None:
            self.settle.append(out.settle_s)
        self.notes += out.notes

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.duplicates or self.lost_results or self.lost_wakes or self.stuck)

    def settle_text(self) -> str:
        if not self.settle:
            return "-"
        if len(self.settle) == 1:
            return f"{self.settle[0]:.1f} s"
        return f"{statistics.median(self.settle):.1f} s median, {max(self.settle):.1f} s max"


REPORT: list[Row] = []  # every case's row, printed by conftest.py at the end of the session


def table(report: list[Row]) -> list[str]:
    head = ("case", "trials", "orphans", "duplicates", "lost results", "lost wakes", "stuck", "settle")
    body = [
        (
            r.case,
            str(r.trials),
            str(r.orphans),
            str(r.duplicates),
            str(r.lost_results),
            str(r.lost_wakes),
            str(r.stuck),
            r.settle_text(),
        )
        for r in report
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (head, *body)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in report:
        if r.phases:
            hit = ", ".join(f"{phase} x{r.phases.count(phase)}" for phase in dict.fromkeys(r.phases))
            lines.append(f"  {r.case}: phases hit: {hit}")
        lines += [f"  {r.case}: {note}" for note in dict.fromkeys(r.notes)]
    return lines


async def until(check: Callable[[], Awaitable[bool]], *, timeout: float, step: float = 0.05) -> bool:
    """Whether a state no event reports (a run's status in another process's store) comes within
    `timeout`: what a trial measures (a test that requires it uses `eventually` itself)."""
    try:
        await eventually(check, what="the state a trial measures", within=timeout, every=step)
    except AssertionError:
        return False
    return True
