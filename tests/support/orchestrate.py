"""Shared set-up for orchestration tests: a project, scripted implementers and their checks, a
scripted reviewer, the user's own work, a stub `gh`, and `peerd` run in a directory (`peerd_in`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.config import LINK_PROVIDERS_DEFAULT, Config, LinksConfig, ProviderConfig
from peerd.orchestrate.states import TERMINAL_RUN
from tests.helpers import git, make_repo, script
from tests.support.delegation import runs_script
from tests.support.eventually import eventually

REVIEWER = Path(__file__).resolve().parents[1] / "orchestrate" / "reviewer.py"

CALC = '''\
"""A tiny calculator."""


def add(a: int, b: int) -> int:
    return a - b
'''


def project_repo(root: Path) -> Path:
    repo = make_repo(root)
    (repo / "calc.py").write_text(CALC)
    (repo / "docs").mkdir()
    (repo / "docs" / "index.md").write_text("# calc\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "calc with a bug")
    return repo


def settings(tmp_path: Path, verdicts: dict[str, list[Any]] | None = None) -> Config:
    """The scripted coders are built in; the reviewer is a custom command the config approves (and
    lets linked machines use, for reviews on a box). Its verdicts and counters live in the HOME
    its config sets, which peerd's confinement keeps visible and writable for it."""
    home = tmp_path / "reviewer-home"
    home.mkdir(exist_ok=True)
    verdict_file = home / "verdicts.json"
    verdict_file.write_text(json.dumps(verdicts or {}))
    state = home / "reviews"
    state.mkdir(exist_ok=True)
    command = f"{sys.executable} {REVIEWER} {{SPEC}} {{WORKTREE}} {verdict_file} {state}"
    return Config(
        providers={"reviewer": ProviderConfig(command=command, env={"HOME": str(home)})},
        approved_commands=["reviewer"],
        links=LinksConfig(providers=[*LINK_PROVIDERS_DEFAULT, "reviewer"]),
    )


# The orchestration tests' names for a scripted coder's prompt: one run's steps, or each run's.
steps = script
runs = runs_script


def packet(pid: str, goal: str, files: list[str], verify: str, **extra: Any) -> dict[str, Any]:
    return {"id": pid, "goal": goal, "files": files, "verify": verify, **extra}


async def start(client: LocalClient, project: dict[str, Any], **body: Any) -> dict[str, Any]:
    request = {"projectId": project["id"], "reviewer": "reviewer", "nonInteractive": True, **body}
    info: dict[str, Any] = await client.call("POST", "/v1/orchestrations", body=request)
    return info


async def finished(client: LocalClient, run_id: str, total: float = 120.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total
    after = 0.0
    while True:
        info: dict[str, Any] = await client.call(
            "GET", f"/v1/orchestrations/{run_id}", params={"after": after, "timeout": 10}
        )
        if info["status"] in TERMINAL_RUN:
            return info
        assert loop.time() < deadline, json.dumps(info, indent=1)[:4000]
        after = info["updatedAt"]


def packets_of(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in info["packets"]}


def receipts_of(info: dict[str, Any], kind: str, packet_id: str | None = None) -> list[dict[str, Any]]:
    return [r["body"] for r in info["receipts"] if r["kind"] == kind and r["packetId"] == packet_id]


FIX_ADD = {"edit": {"path": "calc.py", "old": "return a - b", "new": "return a + b"}}
ADD_MUL = {
    "edit": {
        "path": "calc.py",
        "old": "    return a + b\n",
        "new": "    return a + b\n\n\ndef mul(a: int, b: int) -> int:\n    return a * b\n",
    }
}


CHECK_ADD = "python3 -c 'import calc; assert calc.add(2, 3) == 5'"
CHECK_MUL = "python3 -c 'import calc; assert calc.mul(2, 3) == 6'"
WRONG_ADD = {"edit": {"path": "calc.py", "old": "return a - b", "new": "return a * b"}}
FIX_ADD_AFTER_WRONG = {"edit": {"path": "calc.py", "old": "return a * b", "new": "return a + b"}}
STATS = "def total(xs):\n    return sum(xs)\n"
CHECK_STATS = "python3 -c 'from textkit import stats; assert stats.total([1, 2]) == 3'"


def textkit_repo(root: Path) -> Path:
    repo = make_repo(root)
    (repo / "textkit").mkdir()
    (repo / "textkit" / "__init__.py").write_text("")
    (repo / "textkit" / "stats.py").write_text(STATS)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "textkit")
    return repo


async def worktree_of(client: LocalClient, info: dict[str, Any], pid: str) -> Path:
    while not packets_of(info)[pid]["threadId"]:
        info = await client.call(
            "GET", f"/v1/orchestrations/{info['id']}", params={"after": info["updatedAt"], "timeout": 10}
        )
    thread = await client.call("GET", f"/v1/threads/{packets_of(info)[pid]['threadId']}")
    worktree = Path(thread["worktreePath"])
    await eventually(worktree.is_dir, what=f"{pid}'s worktree (the run makes it as it starts)")
    return worktree


GH_STUB = """#!{python}
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
args = sys.argv[1:]
record = {{"argv": args}}
if "--body-file" in args:
    record["body"] = Path(args[args.index("--body-file") + 1]).read_text()
with open(here / "gh-calls.jsonl", "a") as log:
    log.write(json.dumps(record) + "\\n")
if args[:2] == ["auth", "status"]:
    sys.exit(1 if (here / "logged-out").exists() else 0)
if args[:2] == ["pr", "view"]:
    print("no pull requests found for branch", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["pr", "create"]:
    print("https://github.com/peerd/demo/pull/7")
    sys.exit(0)
sys.exit(2)
"""


def gh_calls(bin_dir: Path) -> list[dict[str, Any]]:
    log = bin_dir / "gh-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def peerd_in(
    home: Path, cwd: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "peerd", "--home", str(home), *args]
    return await asyncio.to_thread(
        subprocess.run, argv, cwd=cwd, capture_output=True, text=True, timeout=120, input=stdin or ""
    )
