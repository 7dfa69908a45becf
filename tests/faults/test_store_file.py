"""The store file is the store (issue 26 case 5), under a real `peerd serve`: `peerd.db` replaced by
a backup (renamed over it), removed, or truncated while the daemon runs. Each time: writes answered
before it are kept (in the copy the daemon saves), the next write is refused `storage_unavailable`
with a sentence naming the file, no write is answered OK after it, `status` and `peerd doctor` say
so, and the advice doctor prints works as written (stop, `peerd restore <the copy>`, `peerd serve`).
`make faults` adds the daemon killed -9 after it noticed (no frame of the old store is replayed
into the file put back) and the truncated file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from peerd.errors import PeerdError
from tests.faults.harness import FULL, REPORT, Outcome, Row, Serve, rows, table
from tests.helpers import make_repo, script

pytestmark = pytest.mark.slow  # two daemons

HOW = ("replaced", "removed", "replaced, then kill -9", "truncated") if FULL else ("replaced", "removed")


def peerd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peerd", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


async def launch(serve: Serve, project: str, n: int) -> str:
    """A thread launched (the answer is the write's acknowledgement): its id."""
    from peerd.api.localclient import LocalClient  # noqa: PLC0415
    from peerd.paths import Paths  # noqa: PLC0415

    async with LocalClient(Paths(serve.home).socket) as c:
        body = {"projectId": project, "prompt": script({"reply": f"n{n}"}), "clientRequestId": f"k{n}"}
        return str((await c.call("POST", "/v1/threads", body=body))["threadId"])


async def call(serve: Serve, method: str, path: str, **kw: Any) -> Any:
    from peerd.api.localclient import LocalClient  # noqa: PLC0415
    from peerd.paths import Paths  # noqa: PLC0415

    async with LocalClient(Paths(serve.home).socket) as c:
        return await c.call(method, path, **kw)


def doctor(home: Path) -> dict[str, dict[str, Any]]:
    done = peerd(home, "doctor", "--json")
    return {ch["name"]: ch for ch in json.loads(done.stdout)["checks"]}


def threads_in(db: Path) -> set[str]:
    return {r["id"] for r in rows(db, "SELECT id FROM threads")}


async def one(tmp: Path, how: str) -> Outcome:
    out = Outcome(settled=True)
    home = tmp / "home"
    serve = Serve(home, label="box")
    serve.start()
    try:
        await serve.ready()
        project = (await call(serve, "POST", "/v1/projects", body={"path": str(make_repo(tmp / "repo"))}))[
            "id"
        ]
        first = await launch(serve, project, 0)
        acknowledged = {first}
        backup = tmp / "backup.db"
        made = peerd(home, "backup", str(backup))
        assert made.returncode == 0, made.stderr
        acknowledged.add(await launch(serve, project, 1))  # answered after the backup: only the daemon has it
        acknowledged.add(await launch(serve, project, 2))
        db = serve.db
        if how.startswith("replaced"):
            backup.rename(db)
        elif how == "removed":
            db.unlink()
        else:
            os.truncate(db, 4096)
        after = db.read_bytes() if db.exists() else None

        # The next write is refused, and so is every one after it: none is answered OK.
        refused = []
        for n in range(3, 6):
            try:
                answered = await launch(serve, project, n)
            except PeerdError as exc:
                refused.append(exc)
            else:
                out.lost_results += 1
                out.notes.append(f"{how}: a launch was answered OK after the store was {how}: {answered}")
        assert refused and all(e.code == "storage_unavailable" for e in refused), refused
        message = refused[0].message
        assert f"peerd's store {db} was " in message, message
        saved = (
            Path(m.group(1))
            if (m := re.search(r"saved as (\S+peerd\.db\.displaced-[\d-]+)", message))
            else None
        )
        assert saved is not None and saved.exists(), message
        assert (db.read_bytes() if db.exists() else None) == after, (
            "the daemon wrote into the file at the path"
        )

        # status and doctor say so; doctor's fix is the daemon's sentence.
        status = await call(serve, "GET", "/v1/status")
        assert (
            status["store"]["state"] == how.split(",", maxsplit=1)[0]
            and status["store"]["message"] == message
        )
        checks = doctor(home)
        assert checks["database-file"]["status"] == "fail", checks
        assert checks["database-file"]["fix"] == message, checks["database-file"]
        if how == "removed":
            assert checks["database"]["status"] == "fail" and checks["database"]["fix"] == message

        # The advice, as written: stop the daemon, `peerd restore <copy>`, start it again.
        if how.endswith("kill -9"):
            serve.kill9()
            # Started over the file put back: it is whole (no frame of the old store replayed into it).
            serve.start()
            await serve.ready()
            kept = {t["id"] for t in (await call(serve, "GET", "/v1/threads"))["items"]}
            assert kept == {first}, kept  # the backup's, whole
            assert doctor(home)["database-integrity"]["status"] == "ok"
            serve.term()
            await serve.exited()
            out.notes.append(f"{how}: restarted over the file put back: whole, the backup's 1 thread")
        else:
            serve.term()
            code = await serve.exited()
            assert code == 0, serve.log_tail()
        if how == "removed":
            plain = peerd(home, "serve", "--no-listen")
            assert plain.returncode == 2 and "peerd restore BACKUP" in plain.stderr, plain.stderr
        restored = peerd(home, "restore", str(saved))
        if how == "truncated":
            # The copy of a truncated store may be damaged itself; restore checks it first and says so.
            out.notes.append(f"truncated: restore of the saved copy: exit {restored.returncode}")
            if restored.returncode != 0:
                return out
        assert restored.returncode == 0, restored.stderr
        serve.start()
        await serve.ready()
        got = {t["id"] for t in (await call(serve, "GET", "/v1/threads"))["items"]}
        lost = acknowledged - got
        if lost:
            out.lost_results += len(lost)
            out.notes.append(
                f"{how}: acknowledged launches gone after the advice was followed: {sorted(lost)}"
            )
        if got - acknowledged:
            out.duplicates += len(got - acknowledged)
        assert doctor(home)["database-file"]["status"] == "ok"
        out.notes.append(
            f"{how}: next write refused, doctor's advice followed, {len(acknowledged)} of 3 kept"
        )
    finally:
        if serve.alive:
            serve.term()
            await serve.exited()
    return out


async def test_a_store_file_replaced_removed_or_truncated_under_the_daemon(tmp_path: Path) -> None:
    row = Row(f"store file {' / '.join(HOW)}")
    REPORT.append(row)
    for n, how in enumerate(HOW):
        row.add(await one(tmp_path / str(n), how))
    assert row.clean, "\n".join(table(REPORT))
    await asyncio.sleep(0)
