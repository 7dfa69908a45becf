"""Issue 26, cases 2 and 3, with a real daemon, real git and the scripted coder:

- the user's checkout is theirs: an edit the user makes during a run to a file that was clean at
  the start, inside a running packet's files, is left where it is, reported as theirs and never
  integrated, also when the coder changed the same file in its worktree (no git error quoted);
- a packet keeps to its files: what its commit changes outside them is shown to the reviewer and
  in the receipts, and the packet is held (not integrated) unless --allow-out-of-scope allows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peerd.orchestrate import report
from peerd.runtime import sandbox
from tests.helpers import client_for, git, running_daemon
from tests.support.eventually import eventually
from tests.support.orchestrate import (
    CHECK_ADD,
    CHECK_STATS,
    FIX_ADD,
    STATS,
    finished,
    packet,
    packets_of,
    project_repo,
    receipts_of,
    settings,
    start,
    steps,
    textkit_repo,
    worktree_of,
)

# Who could have written the checkout: with bwrap here the coder ran confined.
NOBODY_ELSE = "confined" if sandbox.available() else "no_coder_write"


async def test_a_users_edit_of_a_clean_file_inside_a_running_packets_files_is_left_and_reported(
    tmp_path: Path,
) -> None:
    repo = textkit_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        extra = {"write": {"path": "textkit/extra.py", "content": "X = 1\n"}}
        script = steps({"wait_for_file": "go"}, extra, {"reply": "added extra"})
        # `go`, the test's signal to the coder, is in the packet's files too (it is committed).
        plan = [packet("stats", "Extra.\n\n" + script, ["textkit/", "go"], CHECK_STATS)]
        info = await start(client, project, plan=plan, coders=["script"])
        assert git(repo, "status", "--porcelain") == ""  # clean at the start
        worktree = await worktree_of(client, info, "stats")
        # The user keeps working while the packet runs: a same-size edit of a clean file in its files.
        mine = STATS.replace("sum(xs)", "sum(ys)")
        (repo / "textkit" / "stats.py").write_text(mine)
        (worktree / "go").write_text("")
        done = await finished(client, info["id"])
    stats = packets_of(done)["stats"]
    assert stats["state"] == "integrated", stats["failure"]
    impl = receipts_of(done, "implementation", "stats")[-1]
    assert impl["recoveredPaths"] == [] and impl["leftPaths"] == ["textkit/stats.py"]
    assert impl["checkoutChanges"] == [{"path": "textkit/stats.py", "moved": False, "reason": NOBODY_ELSE}]
    assert impl["filesChanged"] == ["go", "textkit/extra.py"]  # the worktree's only
    # left where it is, exactly; the integration branch never got it
    assert (repo / "textkit" / "stats.py").read_text() == mine
    assert git(repo, "show", f"{done['branch']}:textkit/stats.py") == STATS
    assert git(repo, "status", "--porcelain") == " M textkit/stats.py\n"
    text = report.render(done)
    assert "changed in your checkout during the run, left as it is: textkit/stats.py" in text
    assert "recovered" not in text


async def test_a_users_edit_of_a_file_the_coder_also_wrote_stays_theirs_without_a_git_error(
    tmp_path: Path,
) -> None:
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        script = steps({"wait_for_file": "go"}, FIX_ADD, {"reply": "fixed add"})
        plan = [packet("fix-add", "Fix add().\n\n" + script, ["calc.py", "go"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"])
        worktree = await worktree_of(client, info, "fix-add")
        mine = (repo / "calc.py").read_text().replace("return a - b", "return a * b")
        (repo / "calc.py").write_text(mine)
        (worktree / "go").write_text("")
        done = await finished(client, info["id"])
    fix = packets_of(done)["fix-add"]
    assert fix["state"] == "integrated", fix["failure"]
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["leftPaths"] == ["calc.py"] and impl["recoveredPaths"] == []
    assert impl["notRecovered"] == [] and impl["recoveryProblem"] is None  # never even tried
    assert impl["checkoutChanges"] == [{"path": "calc.py", "moved": False, "reason": NOBODY_ELSE}]
    assert (repo / "calc.py").read_text() == mine  # the user's edit stays
    assert "return a + b" in git(repo, "show", f"{done['branch']}:calc.py")  # the coder's is integrated
    text = report.render(done)
    assert "changed in your checkout during the run, left as it is: calc.py" in text
    for git_words in ("error:", "patch", "does not apply", "escaped"):
        assert git_words not in text, git_words


async def test_an_unconfined_coders_write_the_user_then_changed_is_left(tmp_path: Path) -> None:
    """The proof needs the content to be what the coder wrote: once the user typed on, it is theirs."""
    repo = project_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        fixed = (repo / "calc.py").read_text().replace("return a - b", "return a + b")
        escape = {"write": {"path": str(repo / "calc.py"), "content": fixed}}
        script = steps(FIX_ADD, escape, {"wait_for_file": "go"}, {"reply": "fixed add"})
        plan = [packet("fix-add", "Fix add().\n\n" + script, ["calc.py", "go"], CHECK_ADD)]
        info = await start(client, project, plan=plan, coders=["script"], access="full-access")
        worktree = await worktree_of(client, info, "fix-add")
        await eventually(
            lambda: (repo / "calc.py").read_text() == fixed,
            what="the coder's write in the checkout",
            within=20,
        )
        mine = fixed + "# mine\n"
        (repo / "calc.py").write_text(mine)
        (worktree / "go").write_text("")
        done = await finished(client, info["id"])
    impl = receipts_of(done, "implementation", "fix-add")[-1]
    assert impl["checkoutChanges"] == [{"path": "calc.py", "moved": False, "reason": "content_differs"}]
    assert impl["recoveredPaths"] == [] and (repo / "calc.py").read_text() == mine


# --- case 3 ---------------------------------------------------------------------------------------

BEYOND = [
    {"edit": {"path": "textkit/stats.py", "old": "sum(xs)", "new": "sum(list(xs))"}},
    {"write": {"path": "README.md", "content": "# textkit, rewritten by the coder\n"}},
    {"write": {"path": "textkit/strings.py", "content": "def shout(s):\n    return s.upper()\n"}},
    {"reply": "Done."},
]


def _plan(**extra: Any) -> list[dict[str, Any]]:
    return [
        packet("stats", "Tidy total().\n\n" + steps(*BEYOND), ["textkit/stats.py"], CHECK_STATS, **extra),
        packet("after", "Then.\n\n" + steps({"write": {"path": "textkit/x.py", "content": "x = 1\n"}}),
               ["textkit/x.py"], "true", dependsOn=["stats"]),
    ]  # fmt: skip


def _prompt(tmp_path: Path, pid: str) -> str:
    return (tmp_path / "reviewer-home" / "reviews" / f"{pid}.1.prompt").read_text()


async def test_a_packet_that_changes_files_outside_its_own_is_held_without_the_flag(tmp_path: Path) -> None:
    repo = textkit_repo(tmp_path / "repo")
    (repo / "README.md").write_text("# textkit\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "readme")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        done = await finished(client, (await start(client, project, plan=_plan(), coders=["script"]))["id"])
    packets = packets_of(done)
    stats = packets["stats"]
    assert stats["state"] == "parked"
    assert "README.md" in stats["failure"] and "textkit/strings.py" in stats["failure"]
    assert "--allow-out-of-scope" in stats["failure"]
    assert packets["after"]["state"] == "parked"  # its base held the out-of-scope work: not integrated
    impl = receipts_of(done, "implementation", "stats")[-1]
    assert impl["outOfScope"] == ["README.md", "textkit/strings.py"]
    assert stats["outOfScope"] == ["README.md", "textkit/strings.py"]  # on the packet, too
    review = receipts_of(done, "review", "stats")[-1]
    assert review["verdict"] == "approve" and review["held"] == "out_of_scope"
    assert review["outOfScope"] == ["README.md", "textkit/strings.py"]
    # the reviewer was shown them
    prompt = _prompt(tmp_path, "stats")
    assert "Out of scope" in prompt and "- README.md" in prompt and "- textkit/strings.py" in prompt
    # the integration branch has none of the packet's work, in scope or out
    branch = done["branch"]
    assert git(repo, "show", f"{branch}:README.md") == "# textkit\n"
    assert git(repo, "show", f"{branch}:textkit/stats.py") == STATS
    assert "textkit/strings.py" not in git(repo, "ls-tree", "-r", "--name-only", branch)
    assert receipts_of(done, "integration")[-1]["merged"] == []
    text = report.render(done)
    assert "outside the packet's files: README.md, textkit/strings.py" in text
    assert "held: out_of_scope" in text


async def test_with_allow_out_of_scope_the_packet_is_integrated_whole(tmp_path: Path) -> None:
    repo = textkit_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        info = await start(client, project, plan=_plan(), coders=["script"], allowOutOfScope=True)
        done = await finished(client, info["id"])
    assert done["allowOutOfScope"] is True
    assert [p["state"] for p in done["packets"]] == ["integrated", "integrated"]
    review = receipts_of(done, "review", "stats")[-1]
    assert review["held"] is None and review["outOfScope"] == ["README.md", "textkit/strings.py"]
    assert "allowed changes outside" in _prompt(tmp_path, "stats")
    branch = done["branch"]
    assert "rewritten by the coder" in git(repo, "show", f"{branch}:README.md")
    assert "shout" in git(repo, "show", f"{branch}:textkit/strings.py")
    assert "changes outside a packet's files: allowed" in report.render(done)


async def test_the_plan_may_allow_a_packet_some_paths_outside_its_files(tmp_path: Path) -> None:
    repo = textkit_repo(tmp_path / "repo")
    async with (
        running_daemon(tmp_path / "home", settings=settings(tmp_path)) as daemon,
        client_for(daemon.paths.home) as client,
    ):
        project = await client.call("POST", "/v1/projects", body={"path": str(repo)})
        plan = _plan(allowOutOfScope=["README.md"])[:1]
        done = await finished(client, (await start(client, project, plan=plan, coders=["script"]))["id"])
    stats = packets_of(done)["stats"]
    assert stats["state"] == "parked" and "textkit/strings.py" in stats["failure"]
    assert "README.md" not in stats["failure"].split("outside the packet's files:")[1].split(".")[0]
