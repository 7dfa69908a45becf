"""Provider state the previous release left, found by this one: the scripted coder's sessions
(`providers/script.py:adopt_session`, run before each resume). Real coders keep their sessions in
their own config directories (~/.codex, ~/.claude, ~/.gemini), which did not move between the
releases; a confined run mounts them writable (`providers/coders.py:state_mounts`)."""

from __future__ import annotations

import json
from pathlib import Path

from peerd.providers.script import adopt_session

THREAD, SESSION = "thr_0123456789abcdef0123", "ses_abc"


def session_file(path: Path, run: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"session_id": SESSION, "next_run": run}))
    return path


def test_a_session_the_previous_release_left_moves_where_a_confined_run_reads_it(tmp_path: Path) -> None:
    root = tmp_path / "providers" / "script"
    old = session_file(root / f"{SESSION}.json", 1)
    confined = root / "threads" / THREAD
    assert adopt_session(root, confined, THREAD, SESSION) == confined / f"{SESSION}.json"
    assert not old.exists() and json.loads((confined / f"{SESSION}.json").read_text())["next_run"] == 1
    # Idempotent: asked again (every resume asks), nothing moves and the same file is named.
    assert adopt_session(root, confined, THREAD, SESSION) == confined / f"{SESSION}.json"
    assert sorted(p.name for p in root.rglob("*.json")) == [f"{SESSION}.json"]


def test_a_session_follows_its_thread_back_to_an_unconfined_run(tmp_path: Path) -> None:
    root = tmp_path / "providers" / "script"
    session_file(root / "threads" / THREAD / f"{SESSION}.json", 2)
    assert adopt_session(root, root, THREAD, SESSION) == root / f"{SESSION}.json"
    assert not (root / "threads" / THREAD / f"{SESSION}.json").exists()


def test_the_session_where_the_run_reads_it_wins_and_strange_names_are_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "providers" / "script"
    confined = root / "threads" / THREAD
    here = session_file(confined / f"{SESSION}.json", 3)
    stale = session_file(root / f"{SESSION}.json", 1)
    assert adopt_session(root, confined, THREAD, SESSION) == here
    assert json.loads(here.read_text())["next_run"] == 3 and stale.exists()  # nothing overwritten
    assert adopt_session(root, confined, THREAD, "../x") is None
    assert adopt_session(root, confined, "../thr", SESSION) is None
    assert adopt_session(root, root, THREAD, "ses_none") is None
