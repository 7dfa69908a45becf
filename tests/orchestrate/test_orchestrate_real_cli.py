"""One orchestration with real coder CLIs: Codex CLI implements, Claude Code reviews, offline against
the scripted fake model (the same model script answers both; each CLI gets its own dialect's step)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakemodel import FakeModel
from tests.helpers import client_for, git, running_daemon, two_daemons
from tests.realcli import CODEX_MODEL, fake_marker, offline_settings, secure_dir
from tests.support.orchestrate import (
    CHECK_ADD,
    FIX_ADD,
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    start,
    steps,
)

FIX_PATCH = (
    "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\n"
)
VERDICT = {"verdict": "approve", "evidence": [], "summary": "add() now adds; the check passes."}
SCRIPTS = {
    "packet": {
        "steps": [
            {
                "per_dialect": {
                    "responses": {"tool_call": {"name": "apply_patch", "arguments": {"input": FIX_PATCH}}},
                    "anthropic": {"text": json.dumps(VERDICT)},
                }
            },
            {"per_dialect": {"responses": {"text": "Fixed add() in calc.py; the check passes."},
                             "anthropic": {"text": json.dumps(VERDICT)}}},
        ],
        "fallback_text": "(side request)",
    }
}  # fmt: skip


async def test_codex_implements_and_claude_reviews(tmp_path: Path) -> None:
    repo = project_repo(tmp_path / "repo")
    with FakeModel(SCRIPTS, log_path=tmp_path / "model.jsonl") as fake, secure_dir() as home:
        settings = offline_settings(tmp_path / "clis", fake)
        async with running_daemon(home, settings=settings) as daemon, client_for(daemon.paths.home) as client:
            project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
            goal = f"{fake_marker('packet')} Fix add() in calc.py: it subtracts."
            info = await start(
                client,
                project,
                plan=[packet("fix-add", goal, ["calc.py"], CHECK_ADD)],
                coders=[f"codex:{CODEX_MODEL}"],
                reviewer="claude",
                verify=CHECK_ADD,
            )
            done = await finished(client, info["id"], total=180)
    fix = packets_of(done)["fix-add"]
    assert done["status"] == "completed", done
    assert fix["state"] == "integrated", fix["failure"]
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["coder"]["backend"] == "codex" and impl["filesChanged"] == ["calc.py"]
    assert impl["verification"]["passed"]
    review = receipts_of(done, "review", "fix-add")[-1]
    assert review["reviewer"]["backend"] == "claude" and review["verdict"] == "approve"
    # each hop's usage, as each real CLI reported it: Codex without a cost, Claude Code with its own
    assert impl["usage"]["totalTokens"] > 0 and impl["usage"]["costUsd"] is None
    assert review["usage"]["totalTokens"] > 0 and review["usage"]["costUsd"] > 0
    assert fix["usage"]["totalTokens"] == impl["usage"]["totalTokens"] + review["usage"]["totalTokens"]
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")
    assert receipts_of(done, "integration")[-1]["verification"]["passed"]


ADD_DOCS_PATCH = "*** Begin Patch\n*** Add File: docs/usage.md\n+add(a, b) returns a + b\n*** End Patch\n"
MULTI = {
    "multi": {
        "steps": [
            {
                "per_dialect": {
                    "responses": {
                        "tool_call": {"name": "apply_patch", "arguments": {"input": ADD_DOCS_PATCH}}
                    },
                    "anthropic": {"text": json.dumps(VERDICT)},
                }
            },
            {
                "per_dialect": {
                    "responses": {"text": "Wrote docs/usage.md."},
                    "anthropic": {"text": json.dumps(VERDICT)},
                }
            },
        ],
        "fallback_text": "(side request)",
    }
}


async def test_a_multi_file_change_across_two_providers_and_two_machines(tmp_path: Path) -> None:
    origin = tmp_path / "origin.git"
    seed = project_repo(tmp_path / "seed")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    with FakeModel(MULTI, log_path=tmp_path / "model.jsonl") as fake, secure_dir() as homes:
        settings = offline_settings(tmp_path / "clis", fake)
        async with two_daemons(homes, settings=settings) as pair:
            repos = {}
            for side, client in (("laptop", pair.lc), ("box", pair.bc)):
                repos[side] = tmp_path / f"{side}-repo"
                git(tmp_path, "clone", "-q", str(origin), str(repos[side]))
                await client.call("POST", "/v1/projects", body={"path": str(repos[side])})
            await pair.link("auto")
            project = (await pair.lc.call("GET", "/v1/projects"))["items"][0]
            marker = fake_marker("multi")
            plan = [
                packet("fix-add", f"{marker} Fix add().\n\n" + steps(FIX_ADD), ["calc.py"], CHECK_ADD,
                       coder="box/script"),
                packet("docs", f"{marker} Document add() in docs/usage.md.", ["docs"], "test -s docs/usage.md",
                       coder=f"codex:{CODEX_MODEL}"),
            ]  # fmt: skip
            info = await start(
                pair.lc, project, plan=plan, coders=["box/script", f"codex:{CODEX_MODEL}"], reviewer="claude",
                verify=f"{CHECK_ADD} && test -s docs/usage.md", concurrency=2,
            )  # fmt: skip
            done = await finished(pair.lc, info["id"], total=180)
    packets = packets_of(done)
    assert done["status"] == "completed", done
    assert {p["state"] for p in packets.values()} == {"integrated"}, {
        k: p["failure"] for k, p in packets.items()
    }
    assert packets["fix-add"]["environment"] == "box" and packets["docs"]["environment"] is None
    assert receipts_of(done, "implementation", "docs")[-1]["coder"]["backend"] == "codex"
    assert {r["reviewer"]["backend"] for pid in packets for r in receipts_of(done, "review", pid)} == {
        "claude"
    }
    integration = receipts_of(done, "integration")[-1]
    assert integration["verification"]["passed"]
    laptop = repos["laptop"]
    assert "return a + b" in git(laptop, "show", f"{done['branch']}:calc.py")
    assert git(laptop, "show", f"{done['branch']}:docs/usage.md") == "add(a, b) returns a + b\n"
