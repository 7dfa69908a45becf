"""The store's faults, typed and survivable; damaged or foreign stores refused at start; backup,
restore and the doctor's integrity check.

Real daemons on real SQLite files. A "full disk" is SQLite's own `PRAGMA max_page_count` set on
the daemon's writer connection (deterministic: the file may not grow by a page), a read-only store
is `PRAGMA query_only`, a locked one another connection holding the write lock past a short busy
timeout; each is then undone and the same daemon works again, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from peerd.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from peerd.daemon import Daemon, DaemonConfig
from peerd.doctor import run_checks
from peerd.doctor.gather import gather
from peerd.errors import PeerdError
from peerd.paths import Paths
from peerd.store import db as db_module
from peerd.store import health
from peerd.store.db import APPLICATION_ID, Database, storage_fault
from tests.faults.damage import DAMAGES, SAID, checkpointed
from tests.helpers import client_for, make_repo, running_daemon, script, wait_terminal

BIG_PROMPT = script({"reply": "big"}) + "\n" + "x" * 100_000  # ~25 overflow pages of 4 KiB


async def raw_call(daemon: Daemon, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """One request on the owner socket, answered with its HTTP status."""
    connector = aiohttp.UnixConnector(path=str(daemon.paths.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, f"http://peerd{path}", json=body) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[tuple[Daemon, dict[str, Any]]]:
    async with running_daemon(tmp_path / "home", listen=None) as daemon, client_for(daemon.paths.home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        yield daemon, project


async def writer_pragma(daemon: Daemon, sql: str) -> Any:
    assert daemon.db is not None
    async with daemon.db._w.execute(sql) as cur:
        row = await cur.fetchone()
    return None if row is None else row[0]


async def thread_count(daemon: Daemon) -> int:
    assert daemon.db is not None
    return int(await daemon.db.scalar("SELECT count(*) FROM threads"))


# --- 1. storage faults are typed, and the daemon works again once they are gone ------------------


async def test_a_full_store_answers_503_and_works_again_once_space_returns(
    live: tuple[Daemon, dict[str, Any]],
) -> None:
    daemon, project = live
    pages = await writer_pragma(daemon, "PRAGMA page_count")
    assert await writer_pragma(daemon, "PRAGMA freelist_count") < 20, "the big prompt must need new pages"
    await writer_pragma(daemon, f"PRAGMA max_page_count = {pages}")
    launch = {"projectId": project["id"], "prompt": BIG_PROMPT}

    status, body = await raw_call(daemon, "POST", "/v1/threads", launch)
    assert status == 503, body
    assert body["code"] == "storage_unavailable"
    assert "the disk is full. Free space on the filesystem mounted at" in body["message"]
    assert str(daemon.paths.db) in body["message"]
    assert await thread_count(daemon) == 0, "nothing was changed"
    status, _ = await raw_call(daemon, "GET", "/v1/status")
    assert status == 200, "reads still work"

    await writer_pragma(daemon, "PRAGMA max_page_count = 1073741823")  # space is back
    status, launched = await raw_call(daemon, "POST", "/v1/threads", launch)
    assert status == 201, launched
    async with client_for(daemon.paths.home) as c:
        assert (await wait_terminal(c, launched["threadId"], launched["runId"]))["status"] == "completed"


async def test_a_read_only_store_answers_storage_unavailable_then_works(
    live: tuple[Daemon, dict[str, Any]],
) -> None:
    daemon, project = live
    await writer_pragma(daemon, "PRAGMA query_only = ON")
    status, body = await raw_call(daemon, "POST", "/v1/threads", {"projectId": project["id"], "prompt": "hi"})
    assert (status, body["code"]) == (503, "storage_unavailable"), body
    assert "is read-only: make it and" in body["message"]
    await writer_pragma(daemon, "PRAGMA query_only = OFF")
    status, body = await raw_call(daemon, "POST", "/v1/threads", {"projectId": project["id"], "prompt": "hi"})
    assert status == 201, body


async def test_a_store_locked_past_the_busy_timeout_answers_storage_unavailable(
    live: tuple[Daemon, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, project = live
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_MS", 100)  # how long the writer retries its BEGIN
    other = sqlite3.connect(daemon.paths.db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write lock
        status, body = await raw_call(
            daemon, "POST", "/v1/threads", {"projectId": project["id"], "prompt": "hi"}
        )
        assert (status, body["code"]) == (503, "storage_unavailable"), body
        assert "stayed locked by another process" in body["message"]
        other.execute("ROLLBACK")
    finally:
        other.close()
    status, body = await raw_call(daemon, "POST", "/v1/threads", {"projectId": project["id"], "prompt": "hi"})
    assert status == 201, body


async def test_reads_are_typed_too(tmp_path: Path) -> None:
    """The fetch helpers map storage faults as `write()` does (here: a page damaged under it)."""
    path = tmp_path / "peerd.db"
    db = await Database.open(path)
    try:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'projects'").fetchone()[0]
        with path.open("r+b") as f:
            f.seek((root - 1) * page_size)
            f.write(b"\xff" * page_size)
        with pytest.raises(PeerdError) as caught:
            await db.fetchall("SELECT * FROM projects")
        assert caught.value.code == "storage_unavailable"
        assert f"peerd's store {path} is damaged" in caught.value.message
    finally:
        await db.close()


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (13, "the disk is full"),
        (8, "is read-only"),
        (5, "stayed locked"),
        (6, "stayed locked"),
        (10 | (3 << 8), "hit an I/O error"),  # SQLITE_IOERR_WRITE: an extended code
        (11, "is damaged"),
        (26, "is damaged"),
    ],
)
def test_storage_faults_are_told_by_sqlite_result_code(code: int, said: str) -> None:
    exc = sqlite3.OperationalError("whatever the message says")
    exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    fault = storage_fault(exc, Path("/data/peerd/peerd.db"))
    assert fault is not None and fault.code == "storage_unavailable"
    assert said in fault.message and "/data/peerd/peerd.db" in fault.message


def test_other_sqlite_errors_are_not_storage_faults() -> None:
    exc = sqlite3.IntegrityError("UNIQUE constraint failed: projects.path")
    exc.sqlite_errorcode = 2067  # type: ignore[attr-defined]  # SQLITE_CONSTRAINT_UNIQUE
    assert storage_fault(exc, Path("peerd.db")) is None
    assert storage_fault(RuntimeError("disk is full"), Path("peerd.db")) is None, "never by message text"


# --- 2. never start over a damaged or foreign store ---------------------------------------------


async def stopped_home(tmp_path: Path) -> Path:
    """A home a daemon ran in (a project and a thread recorded), now stopped."""
    home = tmp_path / "home"
    async with running_daemon(home, listen=None) as daemon, client_for(home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        launched = await c.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": "hi"})
        await wait_terminal(c, launched["threadId"], launched["runId"])
        assert daemon.db is not None
    checkpointed(home)
    return home


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
async def test_a_damaged_or_foreign_store_is_refused_at_start(tmp_path: Path, damage: str) -> None:
    home = await stopped_home(tmp_path)
    DAMAGES[damage](home)
    db = Paths(home).db
    before = db.read_bytes() if db.exists() else None
    with pytest.raises(health.StoreRefused) as caught:
        async with running_daemon(home, listen=None):
            pass
    message = caught.value.message
    assert message.startswith(f"{db} {SAID[damage]}"), message
    assert "peerd restore BACKUP" in message and "--new-store" in message
    assert message.count(". ") == 0 and message.endswith("."), "one sentence"
    assert (db.read_bytes() if db.exists() else None) == before, "the file is never replaced"


async def test_a_store_only_its_integrity_check_finds_wrong_is_damaged(tmp_path: Path) -> None:
    """A header that lies about the free list: every table reads, only `quick_check` sees it."""
    home = await stopped_home(tmp_path)
    db = Paths(home).db
    data = bytearray(db.read_bytes())
    data[36:40] = (7).to_bytes(4, "big")  # the free-list page count
    db.write_bytes(bytes(data))
    found = health.inspect(db)
    assert (found.state, found.detail) == (
        "damaged",
        "is damaged (its integrity check says: Main freelist: size is 0 but should be 7)",
    )


@pytest.mark.slow
async def test_a_refused_start_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    DAMAGES["garbled-middle-page"](home)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", "--home", str(home), "serve", "--no-listen", "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == EXIT_USAGE, done
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {Paths(home).db} is damaged (database disk image is malformed), so peerd will not start "
        f"over it: restore a backup with `peerd restore BACKUP`, or move it aside (`mv {Paths(home).db} "
        f"{Paths(home).db}.damaged`, with any peerd.db-wal and -shm files) and start with "
        "`peerd serve --new-store`."
    ]


@contextlib.asynccontextmanager
async def daemon_in(home: Path, *, new_store: bool = False) -> AsyncIterator[Daemon]:
    daemon = Daemon(DaemonConfig(home=home, label="test", listen=None, new_store=new_store))
    try:
        await daemon.start()
        yield daemon
    finally:
        await daemon.shutdown()


@pytest.mark.slow
async def test_new_store_gives_an_identity_a_new_store_but_never_replaces_a_file(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    env_id = (home / "identity" / "key.pem").read_bytes()
    DAMAGES["identity-without-db"](home)
    with pytest.raises(health.StoreRefused):
        async with daemon_in(home):
            pass
    async with daemon_in(home, new_store=True) as daemon:
        assert await thread_count(daemon) == 0, "a new, empty store"
    assert (home / "identity" / "key.pem").read_bytes() == env_id, "the same environment"
    async with daemon_in(home) as daemon:  # from now on it is this environment's store
        assert await thread_count(daemon) == 0
    DAMAGES["zero-length"](home)
    with pytest.raises(health.StoreRefused):
        async with daemon_in(home, new_store=True):
            pass
    assert Paths(home).db.read_bytes() == b""


async def test_a_first_start_makes_the_store_and_a_crash_while_making_it_leaves_no_empty_file(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "peerd.db.new").write_bytes(b"half made")  # a crash before the rename left this
    async with daemon_in(home) as daemon:
        assert await thread_count(daemon) == 0
    db = Paths(home).db
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert not (home / "peerd.db.new").exists()
    found = health.inspect(db)
    assert found.ok, found
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


@pytest.mark.slow
async def test_a_store_from_before_the_application_id_is_accepted_and_marked(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        conn.execute("PRAGMA application_id = 0")
    assert health.inspect(Paths(home).db).ok
    async with daemon_in(home) as daemon:
        assert await thread_count(daemon) == 1
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


@pytest.mark.slow
async def test_a_store_of_a_newer_peerd_is_refused_with_upgrade(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    with contextlib.closing(sqlite3.connect(Paths(home).db)) as conn:
        conn.execute("PRAGMA user_version = 999")
    with pytest.raises(health.StoreRefused) as caught:
        async with daemon_in(home):
            pass
    assert "was written by a newer peerd (schema version 999" in caught.value.message
    assert "upgrade peerd" in caught.value.message


# --- 3. backup, restore, doctor ------------------------------------------------------------------


async def peerd_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "peerd", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


async def launch_done(home: Path, project_id: str, prompt: str) -> str:
    async with client_for(home) as c:
        launched = await c.call("POST", "/v1/threads", body={"projectId": project_id, "prompt": prompt})
        await wait_terminal(c, launched["threadId"], launched["runId"])
    return str(launched["threadId"])


@pytest.mark.slow
async def test_backup_while_running_then_restore_once_stopped(tmp_path: Path) -> None:
    home, backup = tmp_path / "home", tmp_path / "backups" / "peerd-1.db"
    backup.parent.mkdir()
    async with daemon_in(home) as daemon, client_for(home) as c:
        project = await c.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        kept = await launch_done(home, project["id"], "before the backup")
        # A backup while the daemon writes: launches go on during it.
        writes = [launch_done(home, project["id"], f"during {i}") for i in range(3)]
        made, *_ = await asyncio.gather(peerd_cli(home, "backup", str(backup), "--json"), *writes)
        assert made.returncode == EXIT_OK, made
        assert json.loads(made.stdout)["file"] == str(backup)
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600
        assert health.inspect(backup).ok
        again = await peerd_cli(home, "backup", str(backup))
        assert again.returncode == EXIT_ERROR and "exists; choose a new file name" in again.stderr
        refused = await peerd_cli(home, "restore", str(backup))
        assert refused.returncode == EXIT_ERROR, refused
        assert "a peerd daemon is running" in refused.stderr
        await launch_done(home, project["id"], "after the backup")
        total = await thread_count(daemon)
    with contextlib.closing(sqlite3.connect(backup)) as conn:
        in_backup = {r[0] for r in conn.execute("SELECT id FROM threads")}
    assert kept in in_backup and 1 <= len(in_backup) < total

    restored = await peerd_cli(home, "restore", str(backup))
    assert restored.returncode == EXIT_OK, restored
    [aside] = sorted(home.glob("peerd.db.before-restore-*"))
    assert f"the previous store is kept as {aside}" in restored.stdout
    assert restored.stdout.rstrip().endswith(f"Start the daemon: peerd --home {home} serve"), restored.stdout
    assert health.inspect(aside).ok, "the replaced store is kept whole"
    async with daemon_in(home) as daemon:
        ids = {r[0] for r in await daemon.db.fetchall("SELECT id FROM threads")}  # type: ignore[union-attr]
    assert ids == in_backup


@pytest.mark.slow
async def test_restore_refuses_a_damaged_or_foreign_file_and_changes_nothing(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    before = Paths(home).db.read_bytes()
    for damage in ("garbled-middle-page", "foreign-sqlite", "zero-length"):
        other = tmp_path / damage
        await stopped_home(other)
        DAMAGES[damage](other / "home")
        done = await peerd_cli(home, "restore", str(Paths(other / "home").db))
        assert done.returncode == EXIT_ERROR, done
        assert "nothing was restored" in done.stderr, done.stderr
    assert Paths(home).db.read_bytes() == before
    assert not list(home.glob("peerd.db.before-restore-*"))


async def integrity(home: Path) -> dict[str, Any]:
    checks = {ch.name: ch for ch in run_checks(await gather(Paths(home)))}
    return checks["database-integrity"].wire()


@pytest.mark.slow
async def test_doctor_runs_the_integrity_check(tmp_path: Path) -> None:
    home = await stopped_home(tmp_path)
    good = await integrity(home)
    assert good["status"] == "ok" and "integrity check ok, schema version" in good["detail"]
    assert not Paths(home).db.with_name("peerd.db-wal").exists(), "looking left no files behind"
    DAMAGES["garbled-middle-page"](home)
    bad = await integrity(home)
    assert bad["status"] == "fail"
    assert bad["detail"].startswith(f"{Paths(home).db} is damaged")
    assert "peerd restore BACKUP" in bad["fix"] and "--new-store" in bad["fix"]


async def test_the_doctor_changes_no_file_mode_of_a_running_store(tmp_path: Path) -> None:
    """SQLite gives an empty -wal it opens the mode of the database: with a database of the wrong
    mode, the integrity check is not run, so the -wal keeps its own."""
    async with running_daemon(tmp_path / "home", listen=None) as daemon:
        wal = daemon.paths.db.with_name("peerd.db-wal")
        assert wal.stat().st_size == 0 and stat.S_IMODE(wal.stat().st_mode) == 0o600
        daemon.paths.db.chmod(0o644)
        checks = {ch.name: ch for ch in run_checks(await gather(daemon.paths))}
        assert "database-integrity" not in checks
        assert stat.S_IMODE(wal.stat().st_mode) == 0o600
