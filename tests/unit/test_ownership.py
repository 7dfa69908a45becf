"""The ownership ledger: the pure rule (`core/ownership.py`), its records (`store/ownership.py`) and
the migration that fills it from what an older store knew."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.core.ownership import Owner, may_change, orchestration_of_branch, owner_of_thread
from peerd.errors import NotYours
from peerd.store import ownership
from peerd.store.db import Database
from peerd.store.schema import MIGRATIONS

LINK, OTHER = Owner.link("cli_a"), Owner.link("cli_b")
ORC, PERSON = Owner.orchestration("orc_1"), Owner.person()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "peerd.db")
    try:
        yield database
    finally:
        await database.close()


def test_a_ref_with_no_record_is_the_persons() -> None:
    # peerd did not make it: only the person may move it; a link or an orchestration may not.
    assert may_change(None, exists=True, caller=PERSON) == "own"
    assert may_change(None, exists=True, caller=LINK) == "not_yours"
    assert may_change(None, exists=True, caller=ORC) == "not_yours"


def test_a_new_name_is_anyones_and_a_record_is_its_owners_only() -> None:
    assert may_change(None, exists=False, caller=LINK) == "new"
    assert may_change(LINK, exists=True, caller=LINK) == "own"
    assert may_change(LINK, exists=False, caller=LINK) == "own"
    for caller in (OTHER, PERSON, ORC):
        assert may_change(LINK, exists=True, caller=caller) == "not_yours"
    # A recorded name git does not have (yet) is still its owner's: a reservation holds.
    assert may_change(ORC, exists=False, caller=LINK) == "not_yours"
    assert may_change(PERSON, exists=True, caller=LINK) == "not_yours"


def test_who_owns_a_thread_and_an_orchestration_branch() -> None:
    assert owner_of_thread("cli_a", "link:cli_a") == LINK
    assert owner_of_thread("cli_a", "orchestrate:orc_1") == LINK  # a link's work is the link's
    assert owner_of_thread(None, "orchestrate:orc_1") == ORC
    assert owner_of_thread(None, "owner") == PERSON
    assert owner_of_thread(None, None) == PERSON
    assert orchestration_of_branch("orchestrate/orc_1/p1") == ORC
    assert orchestration_of_branch("orchestrate/orc_1/integrated") == ORC
    assert orchestration_of_branch("peerd/thr_1") is None
    assert orchestration_of_branch("orchestrate//p1") is None
    for key in ("person", "link:cli_a", "orchestration:orc_1", "move:mov_1"):
        assert Owner.from_key(key).key == key
    for bad in ("person:x", "link", "link:", "thread:x"):
        with pytest.raises(ValueError, match="not an owner"):
            Owner.from_key(bad)


async def test_a_record_is_created_once_and_never_given_to_another(db: Database) -> None:
    args = {"project_id": "prj_1", "holding": "ref", "name": "refs/heads/peerd/x", "purpose": "t"}
    first = await ownership.claim_one(db, owner=LINK, now=1.0, **args)  # type: ignore[arg-type]
    again = await ownership.claim_one(db, owner=LINK, now=2.0, **args)  # type: ignore[arg-type]
    assert first == again and again.created_at == 1.0
    with pytest.raises(NotYours) as refused:
        await ownership.claim_one(db, owner=OTHER, now=3.0, **args)  # type: ignore[arg-type]
    assert refused.value.code == "not_yours" and "the link cli_a" in refused.value.message
    owned = await ownership.owner_of(db, "prj_1", "ref", "refs/heads/peerd/x")
    assert owned is not None and owned.owner == LINK
    # Only its owner's removal forgets it.
    await ownership.forget_one(db, "prj_1", "ref", "refs/heads/peerd/x", owner=OTHER)
    assert await ownership.owner_of(db, "prj_1", "ref", "refs/heads/peerd/x") is not None
    await ownership.forget_one(db, "prj_1", "ref", "refs/heads/peerd/x", owner=LINK)
    assert await ownership.owner_of(db, "prj_1", "ref", "refs/heads/peerd/x") is None


def test_the_migration_fills_the_ledger_from_an_older_store(tmp_path: Path) -> None:
    """A store of the release before the ledger: its threads', orchestrations', moves' and
    projects' git state is recorded with the right owners by migration 17."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    before = 16
    for statements in MIGRATIONS[:before]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("INSERT INTO projects (id, name, path, created_at) VALUES ('prj_1', 'p', '/r', 1)")
    rows = [
        ("thr_l", "peerd/thr_l", "cli_a", "link:cli_a", 0),
        ("thr_o", "orchestrate/orc_1/p1", None, "orchestrate:orc_1", 0),
        ("thr_p", "peerd/thr_p", None, "owner", 0),
        ("thr_i", None, None, "owner", 1),
    ]
    for thread, branch, link, started, in_place in rows:
        conn.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode, in_place,"
            " worktree_path, branch, created_at, updated_at, link_origin, started_by)"
            " VALUES (?, 'prj_1', 't', 'script', 'auto', 'default', ?, ?, ?, 1, 1, ?, ?)",
            (thread, in_place, f"/w/{thread}", branch, link, started),
        )
    conn.execute(
        "INSERT INTO orchestrations (id, project_id, task, request, status, base_commit, branch, created_at,"
        " updated_at) VALUES ('orc_1', 'prj_1', 't', '{}', 'planning', 'abc', 'orchestrate/orc_1/integrated', 1, 1)"
    )
    conn.execute(
        "INSERT INTO moves (id, thread_id, environment_id, state, started_by, created_at, updated_at)"
        " VALUES ('mov_1', 'thr_p', 'env', 'moving', 'owner', 1, 1)"
    )
    for statement in MIGRATIONS[before]:
        conn.execute(statement)
    got = {
        (h, n): o
        for h, n, o in conn.execute("SELECT holding, name, owner FROM git_owners WHERE project_id = 'prj_1'")
    }
    conn.close()
    assert got == {
        ("ref", "refs/heads/peerd/thr_l"): "link:cli_a",
        ("ref", "refs/heads/orchestrate/orc_1/p1"): "orchestration:orc_1",
        ("ref", "refs/heads/peerd/thr_p"): "person",
        ("ref", "refs/heads/orchestrate/orc_1/integrated"): "orchestration:orc_1",
        ("ref", "refs/peerd/moving/mov_1"): "move:mov_1",
        ("worktree", "/w/thr_l"): "link:cli_a",
        ("worktree", "/w/thr_o"): "orchestration:orc_1",
        ("worktree", "/w/thr_p"): "person",
        ("checkout", "/r"): "person",
    }


async def test_the_integration_branch_is_merged_into_only_while_it_is_the_runs(
    db: Database, tmp_path: Path
) -> None:
    """orchestrate/integrate.py asks the ledger before it makes or merges into the run's branch."""
    from types import SimpleNamespace  # noqa: PLC0415

    from peerd.orchestrate import integrate  # noqa: PLC0415
    from peerd.orchestrate import store as ostore  # noqa: PLC0415
    from peerd.store import projects  # noqa: PLC0415
    from tests.helpers import git, make_repo  # noqa: PLC0415

    repo = make_repo(tmp_path / "repo")
    project = await projects.add(db, name="p", path=str(repo), repository_key=None, now=1.0)
    run = await ostore.create(db, project_id=project.id, task="t", request={}, base_commit="abc", now=1.0)
    ctx = SimpleNamespace(db=db, clock=lambda: 2.0)
    await integrate._require_own_branch(ctx, run)  # type: ignore[arg-type]  # recorded at create: the run's
    # The record gone (a store that never had it) and the person's branch of that name in git: refused.
    await ownership.forget_one(
        db, project.id, "ref", f"refs/heads/{run.branch}", owner=Owner.orchestration(run.id)
    )
    git(repo, "branch", run.branch)
    with pytest.raises(NotYours, match="it is yours"):
        await integrate._require_own_branch(ctx, run)  # type: ignore[arg-type]
    # Another owner's record: refused too.
    git(repo, "branch", "-D", run.branch)
    await ownership.claim_one(
        db,
        project_id=project.id,
        holding="ref",
        name=f"refs/heads/{run.branch}",
        owner=LINK,
        purpose="x",
        now=3.0,
    )
    with pytest.raises(NotYours, match="the link cli_a"):
        await integrate._require_own_branch(ctx, run)  # type: ignore[arg-type]
