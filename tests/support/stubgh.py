"""A stub `gh` on PATH that speaks gh's real JSON shapes and changes state over time.

    gh = StubGh.install(tmp_path / "bin", monkeypatch)     first on PATH, for this process and
                                                            every `peerd serve` it starts
    gh.play(pending(), failing(), passing())               the states, one per poll: each
                                                            `gh pr view` moves to the next (the
                                                            last one stays), `gh pr checks` answers
                                                            the state the last view moved to
    gh.calls()                                              every call's argv, in order

A state is `{"view": {...}, "checks": [...]}` with the fields of
`gh pr view --json number,url,state,reviewDecision,mergedAt,closedAt` and of
`gh pr checks --json name,state,bucket,link,workflow` (bucket: pass, fail, pending, skipping,
cancel; exit 8 while one is pending, 1 when one failed, JSON on stdout either way, as gh does), or
`RATE_LIMITED` (exit 1, "API rate limit exceeded" on stderr), or `NO_PR` (exit 1, "no pull
requests found"). `gh run view RUN --log-failed` prints `log_failed`. The state lives in files
beside the script (the test writes them), so it holds across daemons and kill -9.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

URL = "https://github.com/o/r/pull/7"
RATE_LIMITED: dict[str, Any] = {"rateLimited": True}
NO_PR: dict[str, Any] = {"noPr": True}

SCRIPT = r"""
import json, sys
from pathlib import Path
here = Path(__file__).resolve().parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\n")
states = json.loads((here / "states.json").read_text())
counter = here / "step"
step = int(counter.read_text()) if counter.exists() else 0
def current():
    return states[min(max(step - 1, 0), len(states) - 1)]
if args[:2] == ["run", "view"]:
    sys.stdout.write(json.loads((here / "log.json").read_text()) if (here / "log.json").exists() else "")
    sys.exit(0)
if args[:2] == ["auth", "status"]:
    sys.exit(0)
if args[:2] == ["pr", "view"]:
    step += 1
    counter.write_text(str(step))
state = current()
if state.get("rateLimited"):
    sys.stderr.write("HTTP 403: API rate limit exceeded for user ID 1234. (https://api.github.com/graphql)\n")
    sys.exit(1)
if state.get("noPr"):
    sys.stderr.write('no pull requests found for branch "%s"\n' % args[2])
    sys.exit(1)
if args[:2] == ["pr", "view"]:
    print(json.dumps(state["view"]))
    sys.exit(0)
if args[:2] == ["pr", "checks"]:
    checks = state.get("checks", [])
    if not checks:
        sys.stderr.write("no checks reported on the 'feature' branch\n")
        sys.exit(1)
    print(json.dumps(checks))
    buckets = {c["bucket"] for c in checks}
    sys.exit(8 if "pending" in buckets else 1 if buckets & {"fail", "cancel"} else 0)
sys.stderr.write("stub gh: unknown command %r\n" % args)
sys.exit(2)
"""


def view(state: str = "OPEN", review: str = "", number: int = 7) -> dict[str, Any]:
    merged = "2026-12-03T01:00:00Z" if state == "MERGED" else None
    closed = merged or ("2026-12-03T01:00:00Z" if state == "CLOSED" else None)
    return {"number": number, "url": URL, "state": state, "reviewDecision": review,
            "mergedAt": merged, "closedAt": closed}  # fmt: skip


def check(name: str, bucket: str) -> dict[str, Any]:
    state = {"pass": "SUCCESS", "fail": "FAILURE", "pending": "IN_PROGRESS", "skipping": "SKIPPED",
             "cancel": "CANCELLED"}[bucket]  # fmt: skip
    return {"name": name, "state": state, "bucket": bucket, "workflow": "CI",
            "link": f"https://github.com/o/r/actions/runs/4242/job/{len(name)}"}  # fmt: skip


def pending() -> dict[str, Any]:
    return {"view": view(), "checks": [check("build", "pending"), check("lint", "pass")]}


def failing() -> dict[str, Any]:
    return {"view": view(), "checks": [check("build", "fail"), check("lint", "pass")]}


def passing() -> dict[str, Any]:
    return {"view": view(), "checks": [check("build", "pass"), check("lint", "pass")]}


def reviewed(decision: str) -> dict[str, Any]:
    return {"view": view(review=decision), "checks": [check("build", "pass")]}


def merged() -> dict[str, Any]:
    return {"view": view("MERGED", "APPROVED"), "checks": [check("build", "pass")]}


class StubGh:
    def __init__(self, bin_dir: Path) -> None:
        self.dir = bin_dir

    @classmethod
    def install(cls, bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> StubGh:
        bin_dir.mkdir(parents=True, exist_ok=True)
        stub = bin_dir / "gh"
        stub.write_text(f"#!{sys.executable}\n{SCRIPT}")
        stub.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        gh = cls(bin_dir)
        gh.play(pending())
        return gh

    def play(self, *states: dict[str, Any], log_failed: str = "") -> None:
        """The states from the next poll on (the step count starts again)."""
        (self.dir / "states.json").write_text(json.dumps(list(states)))
        (self.dir / "log.json").write_text(json.dumps(log_failed))
        (self.dir / "step").write_text("0")

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def views(self) -> int:
        return sum(1 for argv in self.calls() if argv[:2] == ["pr", "view"])


__all__ = [
    "NO_PR",
    "RATE_LIMITED",
    "StubGh",
    "check",
    "failing",
    "merged",
    "passing",
    "pending",
    "reviewed",
    "view",
]
