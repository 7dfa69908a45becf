"""Shared set-up for orchestration tests: a project, scripted implementers, a scripted reviewer."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from peerd.api.localclient import LocalClient
from peerd.config import LINK_PROVIDERS_DEFAULT, Config, LinksConfig, ProviderConfig
from tests.helpers import git, make_repo

REVIEWER = Path(__file__).resolve().parent / "reviewer.py"

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


def steps(*items: dict[str, Any]) -> str:
    return "```peerd-script\n" + json.dumps({"steps": list(items)}) + "\n```"


def runs(*each: list[dict[str, Any]]) -> str:
    return "```peerd-script\n" + json.dumps({"runs": [{"steps": s} for s in each]}) + "\n```"


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
        if info["status"] in ("completed", "failed", "cancelled"):
            return info
        assert loop.time() < deadline, json.dumps(info, indent=1)[:4000]
        after = info["updatedAt"]


def packets_of(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in info["packets"]}


def receipts_of(info: dict[str, Any], kind: str, packet_id: str | None = None) -> list[dict[str, Any]]:
    return [r["body"] for r in info["receipts"] if r["kind"] == kind and r["packetId"] == packet_id]
