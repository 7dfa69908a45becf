"""Orchestrations survive a daemon restart, reach linked boxes, and never skip a receipt."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.errors import PeerdError, ReceiptMissing
from peerd.orchestrate import store as ostore
from peerd.orchestrate.implement import start_packet
from peerd.orchestrate.integrate import integrate
from peerd.orchestrate.states import TERMINAL_RUN
from tests.helpers import DaemonProcess, client_for, git, running_daemon, two_daemons
from tests.support.eventually import eventually
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    GH_STUB,
    finished,
    gh_calls,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
)


def config_file(tmp_path: Path) -> Path:
    """The test settings as a config file, for a daemon run as a subprocess."""
    config = settings(tmp_path)
    path = tmp_path / "config.toml"
    command = config.providers["reviewer"].command
    home = config.providers["reviewer"].env["HOME"]
    path.write_text(
        f'approved_commands = ["reviewer"]\n\n[providers.reviewer]\ncommand = {command!r}\n'
        f"env = {{ HOME = {home!r} }}\n".replace("'", '"')
    )
    return path


async def wait_for(client: LocalClient, run_id: str, check: Any) -> dict[str, Any]:
    info: dict[str, Any] = await client.call("GET", f"/v1/orchestrations/{run_id}")
    while not check(info):
        assert info["status"] not in TERMINAL_RUN, info
        info = await client.call(
            "GET", f"/v1/orchestrations/{run_id}", params={"after": info["updatedAt"], "timeout": 10}
        )
    return info


@pytest.mark.slow
async def test_a_restart_mid_run_resumes_where_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PEERD_CONFIG", str(config_file(tmp_path)))
    repo = project_repo(tmp_path / "repo")
    daemon = DaemonProcess(tmp_path / "home", label="laptop")
    daemon.start()
    try:
        await daemon.ready()
        async with client_for(daemon.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            # run 1 waits and is cut off by the restart; the resumed run is given the task again. The
            # file it waits for is in its worktree: a confined run sees only that of this machine's /tmp.
            script = steps({"wait_for_file": "release"}, FIX_ADD)
            # (`release` is in the packet's files: it is committed with the coder's work)
            plan = [packet("fix-add", "Fix.\n\n" + script, ["calc.py", "release"], CHECK_ADD)]
            info = await start(client, project, plan=plan, coders=["script"])
            info = await wait_for(client, info["id"], lambda i: packets_of(i)["fix-add"]["threadId"])
            thread = await client.call("GET", f"/v1/threads/{packets_of(info)['fix-add']['threadId']}")
            release = Path(thread["worktreePath"]) / "release"
        daemon.signal(signal.SIGTERM)
        assert await daemon.exited() == 0
        daemon.start()
        await daemon.ready()
        release.write_text("go")
        async with client_for(daemon.home) as client:
            done = await finished(client, info["id"])
    finally:
        daemon.kill()
    fix = packets_of(done)["fix-add"]
    assert done["status"] == "completed", done
    assert fix["state"] == "integrated", fix["failure"]
    assert fix["retries"].get("resumes") == 1 and not fix["retries"].get("redispatch")
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")


@pytest.mark.slow
async def test_a_packet_runs_on_a_linked_box_and_comes_back_as_commits(tmp_path: Path) -> None:
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    async with two_daemons(tmp_path, settings=settings(tmp_path)) as pair:
        repos = {}
        for side, client in (("laptop", pair.lc), ("box", pair.bc)):
            repos[side] = tmp_path / f"{side}-repo"
            git(tmp_path, "clone", "-q", str(origin), str(repos[side]))
            await client.call("POST", "/v1/projects", body={"path": str(repos[side])})
        # An unpushed commit on the laptop: the box must be sent the base first.
        (repos["laptop"] / "NOTE.md").write_text("local only\n")
        git(repos["laptop"], "add", "NOTE.md")
        git(repos["laptop"], "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "local")
        await pair.link("auto")
        project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
        plan = [
            packet("on-box", "Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD),
            packet(
                "here",
                "Docs.\n\n" + steps({"write": {"path": "docs/x.md", "content": "x\n"}}),
                ["docs"],
                "true",
            ),
        ]
        info = await start(
            pair.lc,
            project,
            plan=plan,
            coders=["box/script", "script"],
            concurrency=2,
            reviewer="box/reviewer",
        )
        done = await finished(pair.lc, info["id"])
        box_threads = (await pair.bc.call("GET", "/v1/threads", params={"includeArchived": True}))["items"]
    packets = packets_of(done)
    assert done["status"] == "completed", done
    assert packets["on-box"]["environment"] == "box"
    assert packets["on-box"]["state"] == "integrated", packets["on-box"]["failure"]
    assert packets["here"]["environment"] is None and packets["here"]["state"] == "integrated"
    impl = receipts_of(done, "implementation", "on-box")[-1]
    assert impl["environment"] == "box" and impl["filesChanged"] == ["calc.py"]
    # the box's work came back as a commit in the laptop's repository, on top of the unpushed base
    laptop = repos["laptop"]
    assert git(laptop, "show", f"{packets['on-box']['branch']}:NOTE.md") == "local only\n"
    assert "return a + b" in git(laptop, "show", f"{done['branch']}:calc.py")
    # the box ran the packet and both reviews (each review on a checkout of the packet's commit) ...
    impl_threads = [t for t in box_threads if t["branch"] == packets["on-box"]["branch"]]
    assert len(impl_threads) == 1 and len(box_threads) == 3
    assert {r["reviewer"]["environment"] for pid in packets for r in receipts_of(done, "review", pid)} == {
        "box"
    }
    # ... and its worktrees and the threads' branches were removed at the end (the work came back)
    assert all(t["status"] == "archived" and not Path(t["worktreePath"]).exists() for t in box_threads)
    left = git(repos["box"], "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()
    assert not {t["branch"] for t in box_threads} & set(left), left
    assert git(repos["box"], "status", "--porcelain") == ""  # the box's own checkout untouched


async def test_integration_needs_an_approving_review_receipt(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    async with running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon:
        assert daemon.db is not None and daemon.orchestrations is not None
        engine = (await daemon.orchestrations.service()).engine
        async with client_for(daemon.paths.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        head = git(repo, "rev-parse", "HEAD").strip()
        coders = [{"spec": "script", "backend": "script", "reason": "t"}]
        run = await ostore.create(
            daemon.db,
            project_id=project["id"],
            task="t",
            request={"coders": coders},
            base_commit=head,
            now=1.0,
        )
        spec = packet("p", "goal", ["calc.py"], "true")
        await ostore.add_packets(daemon.db, run.id, [spec], now=1.0)
        git(repo, "branch", f"orchestrate/{run.id}/p", head)
        # approved on paper (written past the store's state machine), but no review receipt: the
        # integration hop must refuse it
        async with daemon.db.write() as tx:
            await tx.execute(
                "UPDATE orchestration_packets SET state = 'approved', branch = ? WHERE packet_id = 'p'",
                (f"orchestrate/{run.id}/p",),
            )
        with pytest.raises(ReceiptMissing):
            await integrate(engine.ctx, run.id)
        # no hop is skipped: a queued packet cannot jump to approved
        async with daemon.db.write() as tx:
            await tx.execute("UPDATE orchestration_packets SET state = 'queued' WHERE packet_id = 'p'")
        with pytest.raises(PeerdError, match="cannot go from queued to approved"):
            await engine.ctx.set(run.id, "p", state="approved")
        # and the implementation hop cannot start without the plan's receipt
        await ostore.update_packet(daemon.db, run.id, "p", now=3.0, state="queued")
        with pytest.raises(ReceiptMissing):
            await start_packet(
                engine.ctx,
                await ostore.get(daemon.db, run.id),
                (await ostore.get(daemon.db, run.id)).packets[0],
            )


async def test_reading_an_unknown_orchestration_is_a_typed_error(tmp_path: Path) -> None:
    async with running_daemon(tmp_path / "home") as daemon, client_for(daemon.paths.home) as client:
        with pytest.raises(PeerdError) as info:
            await client.call("GET", "/v1/orchestrations/orc_nope")
    assert info.value.code == "orchestration_not_found"


class Proxy:
    """A TCP pass-through in front of the box (TLS goes through untouched): stopping it is a network
    partition between laptop and box while both daemons keep running."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except (OSError, asyncio.CancelledError):
            writer.close()  # a partition began while this connection was being made: close it
            raise

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
                with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                    await dst.wait_closed()

        tasks = {asyncio.create_task(pump(reader, up_writer)), asyncio.create_task(pump(up_reader, writer))}
        self._pipes |= tasks
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._pipes -= tasks
            for end in (writer, up_writer):  # closed even when the handler itself is cancelled
                end.close()


@pytest.mark.slow
async def test_a_cancel_the_box_cannot_hear_is_owed_until_it_lands(tmp_path: Path) -> None:
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    async with two_daemons(tmp_path, settings=settings(tmp_path)) as pair:
        for side, client in (("laptop", pair.lc), ("box", pair.bc)):
            git(tmp_path, "clone", "-q", str(origin), str(tmp_path / f"{side}-repo"))
            await client.call("POST", "/v1/projects", body={"path": str(tmp_path / f"{side}-repo")})
        proxy = Proxy(int(pair.box_url.rsplit(":", 1)[1]))
        await proxy.start()
        await pair.link("auto", code=await pair.code("auto", urls=[f"https://127.0.0.1:{proxy.port}"]))
        project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
        hold = tmp_path / "never"
        plan = [packet("slow", "Wait.\n\n" + steps({"wait_for_file": str(hold)}), ["calc.py"], CHECK_ADD)]
        info = await start(pair.lc, project, plan=plan, coders=["box/script"])
        info = await wait_for(pair.lc, info["id"], lambda i: packets_of(i)["slow"]["threadId"])
        box_thread = packets_of(info)["slow"]["threadId"]
        await proxy.stop()  # the partition: the box runs on, unaware
        cancelled = await pair.lc.call("POST", f"/v1/orchestrations/{info['id']}/cancel", body={})
        assert cancelled["status"] == "cancelled"
        running = await pair.bc.call("GET", f"/v1/threads/{box_thread}")
        assert running["latestRun"]["status"] in ("starting", "running")  # not stopped yet: it is owed
        await proxy.start()  # the network is back: the owed stop lands on its next try
        waited = await pair.bc.call("GET", f"/v1/threads/{box_thread}/wait", params={"timeout": 30})
        assert waited["status"] == "interrupted"
        settled = await pair.lc.call("GET", f"/v1/orchestrations/{info['id']}")
        while packets_of(settled)["slow"]["stopOwed"]:  # recorded right after the box answered
            settled = await pair.lc.call(
                "GET",
                f"/v1/orchestrations/{info['id']}",
                params={"after": settled["updatedAt"], "timeout": 10},
            )
        hold.write_text("release")
        await proxy.stop()
    assert packets_of(cancelled)["slow"]["stopOwed"] == [box_thread]


@pytest.mark.slow
async def test_an_edit_that_escaped_into_the_boxs_checkout_is_never_taken_from_there(tmp_path: Path) -> None:
    """Containment recovery is only for the orchestrator's own local packets: a box commits only the
    thread's worktree (a link may not name the box owner's files), so an escaped edit is not the
    packet's work, and the box's checkout keeps whatever is in it."""
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    async with two_daemons(tmp_path, settings=settings(tmp_path)) as pair:
        repos = {}
        for side, client in (("laptop", pair.lc), ("box", pair.bc)):
            repos[side] = tmp_path / f"{side}-repo"
            git(tmp_path, "clone", "-q", str(origin), str(repos[side]))
            await client.call("POST", "/v1/projects", body={"path": str(repos[side])})
        await pair.link("auto")
        box_repo = repos["box"]
        (box_repo / "scratch.txt").write_text("the box owner's own notes\n")
        escape = f"sed -i 's/return a - b/return a + b/' {box_repo / 'calc.py'}"
        project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
        plan = [packet("fix-add", "Fix.\n\n" + steps({"run": escape}), ["calc.py"], CHECK_ADD)]
        info = await start(pair.lc, project, plan=plan, coders=["box/script"])
        done = await finished(pair.lc, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] != "integrated"
    assert all(not r.get("recoveredPaths") for r in receipts_of(done, "implementation", "fix-add"))
    assert "return a - b" in git(repos["laptop"], "show", f"{done['branch']}:calc.py")
    assert (box_repo / "scratch.txt").read_text() == "the box owner's own notes\n"
    # Whatever the escape did to the box's checkout, peerd moved nothing out of it.
    escaped = "return a + b" in (box_repo / "calc.py").read_text()
    assert (" M calc.py" in git(box_repo, "status", "--porcelain")) == escaped


@pytest.mark.slow
async def test_a_kill_9_mid_run_resumes_and_delivers_once_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(GH_STUB.format(python=sys.executable))
    (bin_dir / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PEERD_CONFIG", str(config_file(tmp_path)))
    repo = project_repo(tmp_path / "repo")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "set-url", "origin", str(origin))
    daemon = DaemonProcess(tmp_path / "home", label="laptop")
    daemon.start()
    try:
        await daemon.ready()
        async with client_for(daemon.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            script = steps({"wait_for_file": "release"}, FIX_ADD)
            plan = [packet("fix-add", "Fix.\n\n" + script, ["calc.py", "release"], CHECK_ADD)]
            info = await start(client, project, plan=plan, coders=["script"], reviewer="script", pr=True)
            info = await wait_for(client, info["id"], lambda i: packets_of(i)["fix-add"]["threadId"])
            thread = await client.call("GET", f"/v1/threads/{packets_of(info)['fix-add']['threadId']}")
            release = Path(thread["worktreePath"]) / "release"
            await eventually(release.parent.is_dir, what="the coder at work (its worktree)", within=30)
        daemon.kill()  # SIGKILL: no shutdown of any kind (it may land while the worktree is made)
        daemon.start()
        await daemon.ready()
        async with client_for(daemon.home) as client:
            # The coder at work again, in a worktree made whole: a half-made one is made again
            # at start-up, so a file written into it before that would be gone with it.
            first = thread["latestRun"]["id"]
            path = f"/v1/threads/{thread['id']}"

            def again(latest: dict[str, Any]) -> bool:
                assert latest["status"] not in ("failed", "cancelled"), latest
                return bool(latest["id"] != first and latest["status"] == "running")

            await eventually(
                lambda: client.call("GET", path),
                what="the coder's new run running",
                until=lambda t: again(t["latestRun"]),
                within=30,
            )
            release.write_text("go")
            done = await finished(client, info["id"])
    finally:
        daemon.kill()
    assert done["status"] == "completed", done
    assert packets_of(done)["fix-add"]["state"] == "integrated", packets_of(done)["fix-add"]["failure"]
    assert git(origin, "rev-parse", f"refs/heads/{done['branch']}").strip()
    assert len([c for c in gh_calls(bin_dir) if c["argv"][:2] == ["pr", "create"]]) == 1
    assert len(receipts_of(done, "delivery")) == 1
    listed = git(repo, "worktree", "list", "--porcelain").count("worktree ")
    assert listed == 1 and git(repo, "for-each-ref", "refs/heads/peerd/") == ""
