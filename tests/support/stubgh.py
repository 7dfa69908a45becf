"""A stub `gh` on PATH that speaks gh's real JSON shapes and changes state over time.

    gh = StubGh.install(tmp_path / "bin", monkeypatch)     first on PATH, for this process and
                                                            every `peerd serve` it starts
    gh.play(pending(), failing(), passing())               the states, one per poll: each
                                                            `gh pr view` moves to the next (the
                                                            last one stays), `gh pr checks` answers
                                                            the state the last view moved to
    gh.calls()                                              every call's argv, in order

A state is `{"view": {...}, "checks": [...]}` with the fields of
`gh pr view --json number,url,state,reviewDecision,mergedAt,closedAt,headRefOid,latestReviews` and of
`gh pr checks --json name,state,bucket,link,workflow` (bucket: pass, fail, pending, skipping,
cancel; exit 8 while one is pending, 1 when one failed, JSON on stdout either way, as gh does), or
`RATE_LIMITED` (exit 1, "API rate limit exceeded" on stderr), or `NO_PR` (exit 1, "no pull
requests found"); a state may carry `reviews` and `comments` (`review()`, `comment()`: gh's shapes),
which `gh pr view --json reviews,comments` answers (without moving to the next state).
`gh run view RUN --log-failed` prints `log_failed`. `gh.rounds(...)`: states per head pushed
(below); `gh pr create` opens the pull request. The state lives in files
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
# In `rounds`: GitHub still shows the head before the push (its last state, its headRefOid).
STALE: dict[str, Any] = {"stale": True}

SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path
here = Path(__file__).resolve().parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\n")
made = here / "pr.json"
if args[:2] == ["run", "view"]:
    sys.stdout.write(json.loads((here / "log.json").read_text()) if (here / "log.json").exists() else "")
    sys.exit(0)
if args[:2] == ["auth", "status"]:
    sys.exit(0)
if args[:2] == ["pr", "create"]:
    made.write_text(json.dumps({"branch": args[args.index("--head") + 1]}))
    print(URL)
    sys.exit(0)
if args[:2] == ["pr", "view"] and "--jq" in args:  # `orchestrate --pr` asks for an open one first
    if made.exists():
        print(URL)
        sys.exit(0)
    sys.stderr.write('no pull requests found for branch "%s"\n' % args[2])
    sys.exit(1)
fields = args[args.index("--json") + 1].split(",") if "--json" in args else []
head = ""
if (here / "rounds.json").exists():
    # One list of states per head the pull request's branch had at the origin (each push of a
    # fix is a new head, and GitHub checks and reviews it afresh): the round is that head's index.
    branch = json.loads(made.read_text())["branch"] if made.exists() else ""
    if branch:
        found = subprocess.run(["git", "ls-remote", "origin", "refs/heads/" + branch],
                               capture_output=True, text=True).stdout.split()
        head = found[0] if found else ""
    heads_file = here / "heads.json"
    heads = json.loads(heads_file.read_text()) if heads_file.exists() else []
    if head and head not in heads:
        heads.append(head)
        heads_file.write_text(json.dumps(heads))
    rounds = json.loads((here / "rounds.json").read_text())
    index = heads.index(head) if head in heads else 0
    states = rounds[min(index, len(rounds) - 1)]
    counter = here / ("step-%d" % index)
else:
    states = json.loads((here / "states.json").read_text())
    counter = here / "step"
step = int(counter.read_text()) if counter.exists() else 0
def current():
    return states[min(max(step - 1, 0), len(states) - 1)]
polling = args[:2] == ["pr", "view"] and not ({"reviews", "comments"} & set(fields) and "state" not in fields)
if polling:
    step += 1
    counter.write_text(str(step))
state = current()
if state.get("stale") and (here / "rounds.json").exists():
    # GitHub has not caught up with the push yet: the head before it, as it last was.
    before = max(index - 1, 0)
    state = rounds[min(before, len(rounds) - 1)][-1]
    head = heads[before] if heads else head
if state.get("rateLimited"):
    sys.stderr.write("HTTP 403: API rate limit exceeded for user ID 1234. (https://api.github.com/graphql)\n")
    sys.exit(1)
if state.get("noPr"):
    sys.stderr.write('no pull requests found for branch "%s"\n' % args[2])
    sys.exit(1)
if args[:2] == ["pr", "view"] and not polling:  # gh pr view --json reviews,comments
    print(json.dumps({k: state.get(k, []) for k in fields}))
    sys.exit(0)
if args[:2] == ["pr", "view"]:
    answer = {**state["view"], **({"headRefOid": head} if head else {})}
    if "latestReviews" in fields:  # each reviewer's latest review, as gh gives them
        latest = {}
        for r in sorted(state.get("reviews", []), key=lambda r: r["submittedAt"]):
            latest[r["author"]["login"]] = r
        answer["latestReviews"] = list(latest.values())
    print(json.dumps(answer))
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


def review(login: str, state: str, body: str, at: str = "2026-12-03T01:00:00Z") -> dict[str, Any]:
    """One entry of `gh pr view --json reviews`, in gh's shape."""
    return {"id": f"PRR_{login}_{state}", "author": {"login": login}, "authorAssociation": "MEMBER",
            "body": body, "submittedAt": at, "includesCreatedEdit": False, "reactionGroups": [],
            "state": state, "commit": {"oid": "0" * 40}}  # fmt: skip


def comment(login: str, body: str, at: str = "2026-12-03T01:01:00Z") -> dict[str, Any]:
    """One entry of `gh pr view --json comments`, in gh's shape."""
    return {"id": f"IC_{login}", "author": {"login": login}, "authorAssociation": "MEMBER", "body": body,
            "createdAt": at, "includesCreatedEdit": False, "isMinimized": False, "minimizedReason": "",
            "reactionGroups": [], "url": f"{URL}#issuecomment-1", "viewerDidAuthor": False}  # fmt: skip


def merged() -> dict[str, Any]:
    return {"view": view("MERGED", "APPROVED"), "checks": [check("build", "pass")]}


class StubGh:
    def __init__(self, bin_dir: Path) -> None:
        self.dir = bin_dir

    @classmethod
    def install(cls, bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> StubGh:
        bin_dir.mkdir(parents=True, exist_ok=True)
        stub = bin_dir / "gh"
        stub.write_text(f"#!{sys.executable}\nURL = {URL!r}\n{SCRIPT}")
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

    def rounds(self, *rounds: list[dict[str, Any]], log_failed: str = "") -> None:
        """States per head of the pull request's branch at the origin (its `origin` remote, as gh
        finds it in the checkout): the first list until a new commit is pushed, then the next, so
        a pushed fix is checked and reviewed afresh (`headRefOid` says which head). `gh pr create`
        makes the pull request, which `gh pr view BRANCH --json url --jq .url` finds from then on."""
        self.play(*rounds[0], log_failed=log_failed)
        for counter in self.dir.glob("step-*"):  # each head's states from their start again
            counter.unlink()
        (self.dir / "rounds.json").write_text(json.dumps([list(r) for r in rounds]))

    def created(self) -> int:
        return sum(1 for argv in self.calls() if argv[:2] == ["pr", "create"])

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
    "STALE",
    "StubGh",
    "check",
    "comment",
    "failing",
    "merged",
    "passing",
    "pending",
    "review",
    "reviewed",
    "view",
]
