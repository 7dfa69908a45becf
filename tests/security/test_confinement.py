"""peerd confines the runs it starts: a hostile link's scripted `run` step inside bubblewrap.

Two real daemons, the laptop linked to the box at `auto`; the laptop launches a scripted thread on
the box whose `run` step runs a probe (written into its own worktree first) that tries the box's
owner socket, database, key, the owner's checkout and the project's `.git/config`, and uses what a
run may use: its worktree and peerd's agent tools through `PEERD_SOCKET`.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from peerd import daemon as daemon_module
from peerd.config import Config, LinksConfig
from peerd.errors import PeerdError
from peerd.runtime import sandbox
from tests.fakemodel import FakeModel
from tests.helpers import Pair, items, make_repo, processes_in, script, two_daemons, wait_terminal
from tests.realcli import CODEX_MODEL, fake_marker, offline_settings, secure_dir
from tests.support.delegation import linked_pair
from tests.support.eventually import eventually

PROBE = r"""
import http.client, json, os, socket, subprocess, sys

paths = json.loads(sys.argv[1])
found = {}


class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("peerd", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def post(path, url, body, token=None):
    conn = Unix(path)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    conn.request("POST", url, body=json.dumps(body), headers=headers)
    return conn.getresponse().status


def attempt(name, action):
    try:
        found[name] = ["done", action()]
    except Exception as exc:
        found[name] = ["refused", type(exc).__name__]


def append(path, text):
    with open(path, "a") as handle:
        handle.write(text)
    return "written"


attempt("pair", lambda: post(paths["owner_socket"], "/v1/pair", {"access": "full-access"}))
attempt("db", lambda: len(open(paths["db"], "rb").read()))
# The daemon's own view of the filesystem, through /proc (a fresh PID namespace has no such pid).
attempt("proc_root", lambda: len(open(f"/proc/{paths['daemon_pid']}/root{paths['db']}", "rb").read()))
# Undo the hiding (possible with capabilities, e.g. when peerd runs as root).
subprocess.run(["umount", "-l", paths["home"]], capture_output=True)
attempt("db_after_umount", lambda: len(open(paths["db"], "rb").read()))
attempt("key", lambda: len(open(paths["key"], "rb").read()))
attempt("checkout_read", lambda: open(os.path.join(paths["checkout"], "README.md")).read())
attempt("checkout_write", lambda: append(os.path.join(paths["checkout"], "PWNED"), "x"))
attempt("git_config", lambda: append(os.path.join(paths["checkout"], ".git", "config"), "[core]\n\tbare = true\n"))
attempt("user_home", lambda: open(os.path.join(paths["user_home"], "secret")).read())
attempt("network", lambda: socket.create_connection(("127.0.0.1", paths["port"]), timeout=5).close())
attempt("outside", lambda: append(os.path.join(paths["outside"], "ESCAPED"), "x"))
attempt("worktree", lambda: append("mine.txt", "mine\n"))
# Deny by default: the box's secrets and everything that is not the run's own are absent.
for name, path in paths["secrets"].items():
    attempt("secret:" + name, lambda path=path: len(open(path, "rb").read()))
for path in paths["absent"]:
    attempt("absent:" + path, lambda path=path: os.listdir(path))


def build(argv):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return [done.returncode, (done.stdout + done.stderr)[-300:]]


attempt("uid", lambda: os.getuid())
attempt("root_only", lambda: open(paths["root_only"]).read())
# The run's own work still builds and tests: python, node, git, a C compiler.
with open("hello.c", "w") as handle:
    handle.write("int main(void) { return 0; }\n")
attempt("python", lambda: build(["python3", "-c", "import ssl, sqlite3; print('ok')"]))
attempt("node", lambda: build(["node", "-e", "console.log('ok')"]))
attempt("git", lambda: build(["git", "status", "--short"]))
attempt("cc", lambda: build(["sh", "-c", "cc hello.c -o hello && ./hello && echo ok"]))
attempt(
    "agent_tool",
    lambda: post(os.environ["PEERD_SOCKET"], "/v1/tools/project_list", {}, os.environ["PEERD_RUN_TOKEN"]),
)
print(json.dumps(found))
"""

Linked = tuple[Pair, dict[str, Any]]


@pytest.fixture
async def linked() -> AsyncIterator[Linked]:
    """Homes and checkouts outside /tmp (as ~/.local/share/peerd and ~/src would be): a confined
    run's private /tmp would hide them anyway, and the test is that peerd hides them."""
    with secure_dir() as base:
        async with linked_pair(base, watch_chunk_s=5) as found:
            yield found


async def box_project(pair: Pair) -> dict[str, Any]:
    return dict((await pair.bc.call("GET", "/v1/projects"))["items"][0])


def probe_steps(pair: Pair, checkout: Path) -> list[dict[str, Any]]:
    home = pair.box.paths
    targets = {
        "user_home": str(Path.home()),
        "port": urlsplit(pair.box_url).port,  # the box's own listener, on loopback
        "owner_socket": str(home.socket),
        "db": str(home.db),
        "key": str(home.home / "identity" / "key.pem"),
        "checkout": str(checkout),
        "home": str(home.home),
        "outside": str(home.home.parent),  # a directory nothing hides: read-only like all of /
        "daemon_pid": os.getpid(),  # the daemons run in this process
        "secrets": {
            "shadow": "/etc/shadow",
            "gshadow": "/etc/gshadow",
            "ssl_private": "/etc/ssl/private",
            "ssh_key": str(Path.home() / ".ssh" / "id_ed25519"),
            "other_checkout": str(home.home.parent / "other-src" / "README.md"),
            "identity": str(home.home / "identity" / "key.pem"),
            "other_worktree": str(home.home / "worktrees" / "thr_other" / "theirs.txt"),
            "other_scratch": str(home.home / "providers" / "script" / "runs" / "run_other" / "token"),
        },
        # A file only its owner may read, in a path the sandbox maps (the project's git dir):
        # when peerd runs as root, the run does not, so it cannot read it
        "root_only": str(checkout / ".git" / "peerd-root-only"),
        # Whole directories a run has no business in: other checkouts, other runs' worktrees
        # and files, the homes, the machine's data.
        "absent": [
            str(home.home.parent / "other-src"),
            str(home.home / "worktrees" / "thr_other"),
            str(home.home / "providers" / "script" / "runs" / "run_other"),
            "/home",
            "/srv",
            "/opt",
            "/var/lib",
            "/var/log",
            "/mnt",
        ],
    }
    return [
        {"write": {"path": "probe.py", "content": PROBE}},
        {"run": f"{sys.executable} probe.py '{json.dumps(targets)}'"},
    ]


async def launch_on_box(pair: Pair, prompt: str, **extra: Any) -> dict[str, Any]:
    project = await box_project(pair)
    body = {"projectId": project["id"], "prompt": prompt, **extra}
    launched: dict[str, Any] = await pair.remote("POST", "/v1/threads", body=body)
    return launched


async def probe_results(pair: Pair, thread_id: str) -> dict[str, list[Any]]:
    commands = [i for i in await items(pair.bc, thread_id) if i["kind"] == "command"]
    assert commands, await items(pair.bc, thread_id)
    output = commands[-1]["data"]["output"].strip()
    assert commands[-1]["data"]["exit_code"] == 0, output
    found: dict[str, list[Any]] = json.loads(output.splitlines()[-1])
    return found


async def test_a_links_run_step_reaches_only_its_worktree_and_the_agent_tools(
    linked: Linked, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, _ = linked
    with secure_dir() as user_home:  # the box user's $HOME, with something of theirs in it
        (user_home / "secret").write_text("the box user's\n")
        (user_home / ".ssh").mkdir(mode=0o700)
        (user_home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
        other = pair.box.paths.home.parent / "other-src"  # a checkout peerd was never told of
        other.mkdir()
        (other / "README.md").write_text("someone else's code\n")
        monkeypatch.setenv("HOME", str(user_home))
        await probe_the_box(pair)


async def test_the_owners_run_at_auto_has_the_same_shape(
    linked: Linked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deny by default is not only for links: the owner's own runs below full-access see the same."""
    pair, _ = linked
    with secure_dir() as user_home:
        (user_home / "secret").write_text("the box user's\n")
        (user_home / ".ssh").mkdir(mode=0o700)
        (user_home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
        monkeypatch.setenv("HOME", str(user_home))
        await probe_the_box(pair, by_owner=True)


async def probe_the_box(pair: Pair, *, by_owner: bool = False) -> None:
    checkout = Path((await box_project(pair))["path"])
    config_before = (checkout / ".git" / "config").read_text()
    # another run's worktree and scratch files, beside this run's own
    for other in ("worktrees/thr_other/theirs.txt", "providers/script/runs/run_other/token"):
        (pair.box.paths.home / other).parent.mkdir(parents=True, exist_ok=True)
        (pair.box.paths.home / other).write_text("another run's\n")
    root_only = checkout / ".git" / "peerd-root-only"
    root_only.write_text("only its owner's\n")
    root_only.chmod(0o600)
    prompt = script(*probe_steps(pair, checkout))
    if by_owner:
        project = await box_project(pair)
        body = {"projectId": project["id"], "prompt": prompt, "runtimeMode": "auto"}
        launched = await pair.bc.call("POST", "/v1/threads", body=body)
    else:
        launched = await launch_on_box(pair, prompt)
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    assert done["status"] == "completed", await items(pair.bc, launched["threadId"])
    found = await probe_results(pair, launched["threadId"])
    # Hidden: the owner socket, the database and key, the owner's checkout (not even readable).
    assert found["pair"] == ["refused", "FileNotFoundError"], found
    assert found["db"] == ["refused", "FileNotFoundError"], found
    assert found["proc_root"] == ["refused", "FileNotFoundError"], found
    assert found["db_after_umount"] == ["refused", "FileNotFoundError"], found
    assert found["user_home"] == ["refused", "FileNotFoundError"], found
    assert found["network"][0] == "refused", found  # the scripted provider has no network at all
    assert found["key"] == ["refused", "FileNotFoundError"], found
    assert found["checkout_read"][0] == "refused", found
    assert found["checkout_write"] in (["refused", "OSError"], ["refused", "PermissionError"]), found
    # The project's git dir is visible read-only, the worktree writable, the agent tools reachable.
    assert found["git_config"] in (["refused", "OSError"], ["refused", "PermissionError"]), found
    assert found["outside"] == ["refused", "OSError"], found
    assert not (pair.box.paths.home.parent / "ESCAPED").exists()
    assert found["worktree"] == ["done", "written"], found
    assert found["agent_tool"] == ["done", 200], found
    for name in (
        "shadow",
        "gshadow",
        "ssl_private",
        "ssh_key",
        "other_checkout",
        "identity",
        "other_worktree",
    ):
        assert found["secret:" + name] == ["refused", "FileNotFoundError"], (name, found)
    assert found["secret:other_scratch"][0] == "refused", found
    absent = {k: v for k, v in found.items() if k.startswith("absent:")}
    assert absent and all(v == ["refused", "FileNotFoundError"] for v in absent.values()), absent
    if os.geteuid() == 0:  # the run has a uid of its own, without capabilities
        assert found["uid"] == ["done", 65534], found
        assert found["root_only"] == ["refused", "PermissionError"], found
    for tool in ("python", "node", "git", "cc"):
        assert found[tool][0] == "done" and found[tool][1][0] == 0, (tool, found[tool])
    assert (checkout / ".git" / "config").read_text() == config_before
    assert not (checkout / "PWNED").exists()
    assert (Path(launched["worktreePath"]) / "mine.txt").read_text() == "mine\n"
    assert (await pair.bc.call("GET", "/v1/pair"))["items"] == [], "no code was minted"
    notices = [i["text"] for i in await items(pair.bc, launched["threadId"]) if i["kind"] == "notice"]
    assert any(n.startswith("peerd confines this run") for n in notices), notices


async def test_an_owner_run_at_full_access_is_not_confined(linked: Linked) -> None:
    pair, _ = linked
    project = await box_project(pair)
    db = pair.box.paths.db
    prompt = script({"run": f"test -r {db} && echo visible"})
    launched = await pair.bc.call(
        "POST",
        "/v1/threads",
        body={"projectId": project["id"], "prompt": prompt, "runtimeMode": "full-access"},
    )
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    found = await items(pair.bc, launched["threadId"])
    assert done["status"] == "completed", found
    assert [i["data"]["output"].strip() for i in found if i["kind"] == "command"] == ["visible"]
    assert not [i for i in found if i["kind"] == "notice"], "nothing to say: the owner is the owner"


async def test_without_bwrap_a_links_auto_run_is_refused_and_a_read_only_one_runs(
    linked: Linked, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair, _ = linked
    monkeypatch.setattr(sandbox, "available", lambda: False)
    refused = await launch_on_box(pair, script({"run": "echo ran > ran.txt"}))
    done = await wait_terminal(pair.bc, refused["threadId"], refused["runId"])
    assert done["status"] == "failed"
    errors = [i for i in await items(pair.bc, refused["threadId"]) if i["kind"] == "error"]
    assert [e["data"].get("code") for e in errors] == ["confinement_unavailable"], errors
    assert "allow_unconfined" in errors[0]["text"] and "bubblewrap" in errors[0]["text"]
    assert not (Path(refused["worktreePath"]) / "ran.txt").exists()

    reader = await launch_on_box(pair, script({"reply": "looked"}), runtimeMode="read-only")
    done = await wait_terminal(pair.bc, reader["threadId"], reader["runId"])
    assert done["status"] == "completed", await items(pair.bc, reader["threadId"])


async def test_an_interrupt_ends_a_confined_run_and_its_children(linked: Linked) -> None:
    pair, _ = linked
    launched = await launch_on_box(pair, script({"run": "sleep 60 & sleep 61 & touch started; wait"}))
    worktree = launched["worktreePath"]
    await eventually((Path(worktree) / "started").exists, what="the confined run started", within=20)
    assert len(processes_in(worktree)) >= 3  # the agent, its shell and the two sleeps
    await pair.bc.call("POST", f"/v1/threads/{launched['threadId']}/interrupt", body={})
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=20)
    assert done["status"] == "interrupted"
    run = (await pair.bc.call("GET", f"/v1/threads/{launched['threadId']}"))["latestRun"]
    assert run["exitCode"] == 130, run  # the agent itself got SIGINT and ended as it does, not bwrap
    await eventually(lambda: not processes_in(worktree), what="no process left in the worktree", within=10)


# --- a real coder CLI: Codex at auto, driven by the fake model to run a command -------------------

SOCKET_PROBE = (
    'python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); '
    "open('socket-probe.txt','w').write(str(s.connect_ex(sys.argv[1])))\" {socket}"
)


async def test_a_links_codex_run_at_auto_cannot_reach_the_owner_socket(tmp_path: Path) -> None:
    scripts = {
        "probe": {
            "steps": [
                {"tool_call": {"name": "exec_command", "arguments": {"cmd": "{var:cmd}"}}},
                {"text": "Probed."},
            ],
            "fallback_text": "side request",
        }
    }
    with FakeModel(scripts, log_path=tmp_path / "model.jsonl") as fake:
        settings = offline_settings(tmp_path / "clis", fake)
        with secure_dir() as homes:
            async with two_daemons(homes, settings=settings) as pair:
                repo = make_repo(homes / "box-repo")
                project = await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
                await pair.link("auto")
                fake.variables["cmd"] = SOCKET_PROBE.format(socket=pair.box.paths.socket)
                body = {
                    "projectId": project["id"],
                    "prompt": f"{fake_marker('probe')} Look around.",
                    "provider": "codex",
                    "model": CODEX_MODEL,
                }
                launched = await pair.remote("POST", "/v1/threads", body=body)
                done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"], total=90)
                found = await items(pair.bc, launched["threadId"])
                assert done["status"] == "completed", [(i["kind"], i["text"][:300]) for i in found]
                # The command ran, wrote in its worktree, and found no owner socket (ENOENT).
                probe = Path(launched["worktreePath"]) / "socket-probe.txt"
                assert probe.read_text() == str(errno.ENOENT), found
                notices = [i["text"] for i in found if i["kind"] == "notice"]
                assert any("Codex runs with its own sandbox off inside peerd's" in n for n in notices), (
                    notices
                )
                assert (await pair.bc.call("GET", "/v1/pair"))["items"] == []


# --- what the box owner lets links use ([links] in config.toml) ------------------------------------


@asynccontextmanager
async def linked_with(tmp_path: Path, links: LinksConfig) -> AsyncIterator[Pair]:
    async with two_daemons(tmp_path, settings=Config(links=links)) as pair:
        repo = make_repo(tmp_path / "box-repo")
        await pair.bc.call("POST", "/v1/projects", body={"path": str(repo)})
        await pair.link("auto")
        yield pair


async def failure_codes(pair: Pair, launched: dict[str, Any]) -> list[str | None]:
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    assert done["status"] == "failed", await items(pair.bc, launched["threadId"])
    return [i["data"].get("code") for i in await items(pair.bc, launched["threadId"]) if i["kind"] == "error"]


async def test_a_link_may_not_use_a_provider_the_owner_did_not_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with linked_with(tmp_path, LinksConfig(providers=["script"])) as pair:
        with pytest.raises(PeerdError) as refused:  # at launch
            await launch_on_box(pair, "hello", provider="codex")
        assert refused.value.code == "capability_denied"
        # And when the run starts (a launch taken before the owner narrowed the list, say).
        monkeypatch.setattr(daemon_module, "link_may_use", lambda _config, _provider: True)
        # (and as if codex were installed here: the run is refused when it starts, not at launch)
        monkeypatch.setattr(
            daemon_module.registry, "available", lambda providers: dict.fromkeys(providers, True)
        )
        launched = await launch_on_box(pair, "hello", provider="codex")
        assert await failure_codes(pair, launched) == ["capability_denied"]
        allowed = await launch_on_box(pair, script({"reply": "fine"}))
        done = await wait_terminal(pair.bc, allowed["threadId"], allowed["runId"])
        assert done["status"] == "completed"


async def test_script_run_false_refuses_a_links_run_steps(tmp_path: Path) -> None:
    async with linked_with(tmp_path, LinksConfig(script_run=False)) as pair:
        launched = await launch_on_box(
            pair, script({"write": {"path": "a.txt", "content": "a"}}, {"run": "touch b"})
        )
        done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
        assert done["status"] == "failed"
        worktree = Path(launched["worktreePath"])
        assert (worktree / "a.txt").exists() and not (worktree / "b").exists()
        notices = [i["text"] for i in await items(pair.bc, launched["threadId"]) if i["kind"] == "notice"]
        assert any("links.script_run = false" in n for n in notices), notices


async def test_allow_unconfined_lets_a_links_run_go_on_without_bwrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "available", lambda: False)
    async with linked_with(tmp_path, LinksConfig(allow_unconfined=True)) as pair:
        launched = await launch_on_box(pair, script({"write": {"path": "a.txt", "content": "a"}}))
        done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
        found = await items(pair.bc, launched["threadId"])
        assert done["status"] == "completed", found
        notices = [i["text"] for i in found if i["kind"] == "notice"]
        assert any("links.allow_unconfined = true" in n for n in notices), notices


async def test_a_links_run_sees_no_credential_in_the_repositorys_config(linked: Linked) -> None:
    """Remote URLs in `.git/config` may carry the owner's token: a link's run sees only what git
    needs to read the repository, and git still works there."""
    pair, _ = linked
    checkout = Path((await box_project(pair))["path"])
    (checkout / ".git" / "config").write_text(
        (checkout / ".git" / "config").read_text()
        + '[remote "mirror"]\n\turl = https://owner:SECRET-TOKEN@git.example.invalid/r.git\n'
        + "[credential]\n\thelper = store\n"
    )
    steps = [
        {"run": f"cat {checkout / '.git' / 'config'}"},
        {"run": "git status --porcelain && git log --oneline -1 && git remote", "check": True},
    ]
    launched = await launch_on_box(pair, script(*steps))
    done = await wait_terminal(pair.bc, launched["threadId"], launched["runId"])
    assert done["status"] == "completed", await items(pair.bc, launched["threadId"])
    seen, git_ran = [i["data"] for i in await items(pair.bc, launched["threadId"]) if i["kind"] == "command"]
    assert "SECRET-TOKEN" not in seen["output"] and "helper" not in seen["output"]
    assert "repositoryformatversion" in seen["output"]
    assert git_ran["exit_code"] == 0 and "mirror" not in git_ran["output"], git_ran
    assert "SECRET-TOKEN" in (checkout / ".git" / "config").read_text(), "the owner's own file is unchanged"
