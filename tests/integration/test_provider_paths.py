"""A provider's own files are part of its run (issue 27, case 3), through real daemons.

A custom command provider (approved in the config file) whose config names files below /tmp, where a
confined run has a private /tmp of its own: the run sees them. One that names a file peerd hides on
purpose (its home; for a linked machine's run the box user's home) fails before the command starts,
with `provider_path_unreachable` and one sentence naming the path and the setting, never the
command's own "No such file or directory".
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.config import Config, LinksConfig, ProviderConfig
from peerd.core.runs import CONFINED
from tests.helpers import client_for, make_repo, running_daemon, two_daemons, wait_terminal

# Prints the file its env names and the one its --greeting= argument names; marks its start in
# its worktree (its cwd), so a test can tell it never started.
CODER = """\
import os, pathlib, sys
pathlib.Path("STARTED").write_text("yes")
print(pathlib.Path(os.environ["CODER_DATA"]).read_text().strip())
for arg in sys.argv[2:]:
    if arg.startswith("--greeting="):
        print(pathlib.Path(arg.split("=", 1)[1]).read_text().strip())
"""


@pytest.fixture
def tools() -> Iterator[Path]:
    """The custom coder and its files in a directory of their own below /tmp."""
    path = Path(tempfile.mkdtemp(prefix="peerd-tools-", dir="/tmp"))  # the point
    (path / "data").mkdir()
    (path / "coder.py").write_text(CODER)
    (path / "data" / "data.txt").write_text("data from /tmp")
    (path / "greeting.txt").write_text("greeting from /tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def settings_for(tools: Path, data: Path, **extra: Any) -> Config:
    command = f"{sys.executable} {tools / 'coder.py'} {{SPEC}}"
    mine = ProviderConfig(
        command=command, args=[f"--greeting={tools / 'greeting.txt'}"], env={"CODER_DATA": str(data)}
    )
    return Config(providers={"mine": mine}, approved_commands=["mine"], **extra)


async def launch(client: LocalClient, project_id: str, **extra: Any) -> dict[str, Any]:
    body = {"projectId": project_id, "prompt": "go", "provider": "mine", "runtimeMode": "auto", **extra}
    launched: dict[str, Any] = await client.call("POST", "/v1/threads", body=body)
    return launched


async def outcome(
    client: LocalClient, launched: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    done = await wait_terminal(client, launched["threadId"], launched["runId"])
    items = (await client.call("GET", f"/v1/threads/{launched['threadId']}/items"))["items"]
    return done, items


def assert_refused(done: dict[str, Any], items: list[dict[str, Any]], path: Path, where: str) -> None:
    assert done["status"] == "failed", items
    errors = [i for i in items if i["kind"] == "error"]
    assert [e.get("data", {}).get("code") for e in errors] == ["provider_path_unreachable"], errors
    sentence = errors[0]["text"]
    assert sentence.startswith(
        f"Provider 'mine' cannot start: {path}, named by providers.mine.env.CODER_DATA, lies in {where}"
    )
    assert "No such file" not in sentence and sentence.endswith("name its new place in config.toml.")


@pytest.mark.slow
async def test_a_confined_run_sees_the_files_its_config_names_below_tmp(tmp_path: Path, tools: Path) -> None:
    async with (
        running_daemon(
            tmp_path / "home", settings=settings_for(tools, tools / "data" / "data.txt")
        ) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        done, items = await outcome(client, await launch(client, project["id"]))
        assert done["status"] == "completed", items
        assert any(i.get("data", {}).get("code") == CONFINED for i in items), "the run was confined"
        replies = [i["text"] for i in items if i["kind"] == "assistant_message"]
        assert replies == ["data from /tmp\ngreeting from /tmp"]


async def test_a_file_in_peerds_home_named_by_the_config_fails_the_run_before_it_starts(
    tmp_path: Path, tools: Path
) -> None:
    home = tmp_path / "home"
    secret = home / "secret.txt"
    async with (
        running_daemon(home, settings=settings_for(tools, secret)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        secret.write_text("peerd's own")
        project = await client.call("POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "repo"))})
        launched = await launch(client, project["id"])
        done, items = await outcome(client, launched)
        assert_refused(done, items, secret, f"peerd's home ({home})")
        thread = await client.call("GET", f"/v1/threads/{launched['threadId']}")
        assert thread["latestRun"]["reason"] == next(i["text"] for i in items if i["kind"] == "error")
        assert not (Path(launched["worktreePath"]) / "STARTED").exists(), "the command never started"


@pytest.mark.slow
async def test_a_links_run_never_gets_the_box_users_home_because_the_config_names_it(
    tmp_path: Path, tools: Path
) -> None:
    """The box owner's config names a file in their home: the owner's own confined run reads it; a
    run a linked machine started fails, naming it (that home is hidden from a link's runs)."""
    in_home = Path(tempfile.mkdtemp(prefix=".peerd-test-", dir=Path.home()))
    try:
        data = in_home / "data.txt"
        data.write_text("the owner's")
        links = LinksConfig(providers=["script", "mine"])
        async with two_daemons(tmp_path, settings=settings_for(tools, data, links=links)) as pair:
            project = await pair.bc.call(
                "POST", "/v1/projects", body={"path": str(make_repo(tmp_path / "box-repo"))}
            )
            done, items = await outcome(pair.bc, await launch(pair.bc, project["id"]))
            assert done["status"] == "completed", items
            await pair.link("auto")
            body = {"projectId": project["id"], "prompt": "go", "provider": "mine", "runtimeMode": "auto"}
            launched = await pair.remote("POST", "/v1/threads", body=body)
            done, items = await outcome(pair.bc, launched)
            assert_refused(done, items, data, f"your home directory ({Path.home().resolve()})")
            assert not (Path(launched["worktreePath"]) / "STARTED").exists()
    finally:
        shutil.rmtree(in_home, ignore_errors=True)
