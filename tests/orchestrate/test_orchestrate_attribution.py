"""The pure rules of issue 26 cases 2 and 3: whose a change in the user's checkout is
(`attribution`), and what a packet changed outside its files (`scope`). No daemon, no git."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from peerd.core.runs import CONFINED
from peerd.orchestrate import containment, scope, userwork
from peerd.orchestrate.attribution import CoderWrite, HopFacts, attribute, hop_facts, writes_of
from peerd.orchestrate.models import PacketSpec, validate_plan
from peerd.orchestrate.prompts import reviewer_prompt
from peerd.orchestrate.verdicts import parse_plan_reply, verification_result
from peerd.runtime import git as rgit
from tests.helpers import git, make_repo

CHECKOUT = "/home/me/repo"
WORKTREE = "/home/me/.peerd/worktrees/t1"
WROTE = hashlib.sha256(b"return a + b\n").hexdigest()
NOW = f"sha256:{WROTE}"


def _attribute(path: str = "calc.py", **over: object) -> str:
    args: dict[str, object] = {
        "before": {},
        "now": NOW,
        "in_files": True,
        "facts": HopFacts(False, (CoderWrite(f"{CHECKOUT}/calc.py", WROTE),)),
        "checkout": CHECKOUT,
        "worktree": WORKTREE,
    }
    args.update(over)
    return attribute(path, **args).reason  # type: ignore[arg-type]


def test_only_a_proven_write_of_an_unconfined_coder_is_the_coders() -> None:
    assert _attribute() == "proven"


def test_every_doubt_leaves_the_change_to_the_user() -> None:
    # dirty before the run: the user's, whatever any coder says
    assert _attribute(before={"calc.py": "sha256:00"}) == "yours_before"
    assert _attribute(in_files=False) == "outside_files"
    # every run confined: no coder could write the checkout, even if an item names it
    confined = HopFacts(True, (CoderWrite(f"{CHECKOUT}/calc.py", WROTE),))
    assert _attribute(facts=confined) == "confined"
    # unconfined, but nothing of the coder names the path in the checkout
    assert _attribute(facts=HopFacts(False, ())) == "no_coder_write"
    # a relative path is the coder's worktree, never the checkout
    assert _attribute(facts=HopFacts(False, (CoderWrite("calc.py", WROTE),))) == "no_coder_write"
    # named, but what it wrote is not said (the coder CLIs): not proof
    assert _attribute(facts=HopFacts(False, (CoderWrite(f"{CHECKOUT}/calc.py"),))) == "unverified"
    # named, and the content now is not what it wrote: changed after it (the user typing on)
    assert _attribute(now="sha256:" + "0" * 64) == "content_differs"
    # the last write decides: an earlier matching write is not enough
    twice = HopFacts(
        False, (CoderWrite(f"{CHECKOUT}/calc.py", WROTE), CoderWrite(f"{CHECKOUT}/calc.py", "ab" * 32))
    )
    assert _attribute(facts=twice) == "content_differs"


def test_a_relative_path_that_leaves_the_worktree_for_the_checkout_names_it() -> None:
    up = "../../../repo/calc.py"  # /home/me/.peerd/worktrees/t1 -> /home/me/repo
    assert _attribute(facts=HopFacts(False, (CoderWrite(up, WROTE),))) == "proven"


def test_the_hop_facts_come_from_the_runs_own_items() -> None:
    marked = ("notice", {"code": CONFINED})
    write = ("file_change", {"action": "write", "path": f"{CHECKOUT}/a.py", "sha256": WROTE})
    codex = (
        "file_change",
        {"changes": [{"path": f"{CHECKOUT}/b.py", "kind": "update"}], "status": "completed"},
    )
    failed = ("file_change", {"changes": [{"path": f"{CHECKOUT}/c.py"}], "status": "failed"})
    declined = ("file_change", {"path": f"{CHECKOUT}/d.py", "status": "declined", "sha256": WROTE})
    prose = ("notice", {})  # a notice without the code is no mark (words never decide)
    assert writes_of([write, codex, failed, declined, ("command", {"path": "x"})]) == [
        CoderWrite(f"{CHECKOUT}/a.py", WROTE),
        CoderWrite(f"{CHECKOUT}/b.py", None),
    ]
    assert hop_facts([[marked, write], [marked]]).confined
    assert not hop_facts([[marked], [prose, write]]).confined  # one unconfined run is enough
    assert not hop_facts([]).confined  # no runs known: the proof is asked for


def _spec(**extra: object) -> PacketSpec:
    return PacketSpec.model_validate(
        {"id": "stats", "goal": "g", "files": ["textkit/stats.py"], "verify": "true", **extra}
    )


def test_out_of_scope_is_what_the_commit_changes_outside_the_packets_files() -> None:
    changed = ["README.md", "textkit/stats.py", "textkit/strings.py"]
    assert scope.outside(changed, ["textkit/stats.py"]) == ["README.md", "textkit/strings.py"]
    assert scope.outside(changed, ["textkit/", "README.md"]) == []
    assert scope.outside(["textkit/stats.py.bak"], ["textkit/stats.py"]) == ["textkit/stats.py.bak"]


def test_out_of_scope_holds_the_packet_unless_the_run_or_the_plan_allows_it() -> None:
    outside = ["README.md", "textkit/strings.py"]
    assert scope.held_paths(outside, _spec(), run_allows=False) == outside
    assert scope.held_paths(outside, _spec(), run_allows=True) == []
    assert scope.held_paths(outside, _spec(allow_out_of_scope=True), run_allows=False) == []
    assert scope.held_paths(outside, _spec(allow_out_of_scope=["README.md"]), run_allows=False) == [
        "textkit/strings.py"
    ]
    assert scope.run_allows({"flags": {"allowOutOfScope": True}})
    assert not scope.run_allows({"flags": {}}) and not scope.run_allows({})
    message = scope.held_message("stats", ["README.md"], "orchestrate/r1/stats")
    assert "README.md" in message and "--allow-out-of-scope" in message and "allow_out_of_scope" in message


def test_a_plans_allow_out_of_scope_is_validated_and_never_the_planners() -> None:
    assert validate_plan([_spec(allow_out_of_scope=["docs/"])]) == []
    errors = validate_plan([_spec(allow_out_of_scope=["../x"]), _spec(id="b", allow_out_of_scope=[])])
    assert any("'../x'" in e and "allow_out_of_scope" in e for e in errors)
    assert any("'b'" in e and "empty list" in e for e in errors)
    with pytest.raises(ValueError):
        _spec(allow_out_of_scope="yes please")
    reply = '{"packets": [{"id": "a", "goal": "g", "files": ["a.py"], "verify": "true", "allow_out_of_scope": true}]}'
    packets, problems = parse_plan_reply(reply)
    assert packets is None and "not the planner's to give" in problems[0]


def test_the_reviewer_is_shown_the_paths_outside_the_packets_files() -> None:
    check = verification_result("true", 0, False, "")
    prompt = reviewer_prompt(_spec(), "diff", check, ["README.md", "textkit/strings.py"], ["README.md"])
    assert "Out of scope" in prompt and "- README.md" in prompt and "- textkit/strings.py" in prompt
    assert "will not integrate" in prompt
    assert "Out of scope" not in reviewer_prompt(_spec(), "diff", check)
    allowed = reviewer_prompt(_spec(), "diff", check, ["README.md"], [])
    assert "allowed changes outside" in allowed and "will not integrate" not in allowed


async def test_a_proven_change_the_user_changes_again_meanwhile_stays_in_the_checkout(tmp_path: Path) -> None:
    """`recover_escaped(still=...)`: a path no longer exactly what was proven is not moved, and
    not restored after its patch went to the worktree (the user's newer edit stays)."""
    repo = make_repo(tmp_path / "repo")
    for name in ("a.py", "b.py"):
        (repo / name).write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two files")
    worktree = tmp_path / "worktrees" / "p1"
    await rgit.create_worktree(repo, worktree, "orchestrate/r1/p1", await rgit.head(repo))
    where = await rgit.locate_worktree(repo, worktree)
    (repo / "a.py").write_text("x = 2\n")  # proven the coder's, unchanged since
    (repo / "b.py").write_text("x = 3\n")  # proven the coder's, then typed on (below)
    (repo / "new.py").write_text("n = 1\n")  # an untracked one, typed on before the move
    proven = {p: userwork.content_hash(repo / p) for p in ("a.py", "b.py", "new.py")}
    asked: list[str] = []

    def still(path: str) -> bool:
        asked.append(path)
        if path in ("b.py", "new.py") and asked.count(path) == 2:  # the user types on, in between
            (repo / path).write_text((repo / path).read_text() + "# mine\n")
        return userwork.content_hash(repo / path) == proven[path]

    moved = await containment.recover_escaped(
        repo, where, ["a.py", "b.py", "new.py"], only=proven, still=still
    )
    assert moved == ["a.py"]
    assert (repo / "a.py").read_text() == "x = 1\n" and (worktree / "a.py").read_text() == "x = 2\n"
    assert (repo / "b.py").read_text() == "x = 3\n# mine\n"  # not restored: the user's newer edit
    assert (repo / "new.py").read_text() == "n = 1\n# mine\n" and not (worktree / "new.py").exists()
