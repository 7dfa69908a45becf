"""Ids a person pastes are one URL path segment each, in the CLI and when forwarded: `/`, `?`, `..`
and `%` in them never reach another endpoint or crash; they are typed not-found errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.cli.common import EXIT_ERROR
from peerd.core.text import path_segment
from peerd.daemon import Daemon
from tests.support.cli import home_of, ok, peerd

ODD_IDS = ["/path/to/checkout", "shop?x=1", "..", ".", "50%", "a#b", "thr_1/../../projects"]


def test_path_segment_escapes_what_would_leave_the_segment() -> None:
    assert path_segment("/a/b") == "%2Fa%2Fb"
    assert path_segment("x?y=1#z") == "x%3Fy%3D1%23z"
    assert path_segment("..") == "%2E%2E" and path_segment(".") == "%2E"
    assert path_segment("50%") == "50%25"
    assert path_segment("thr_abc") == "thr_abc"


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["project", "show"], "project_not_found"),
        (["thread", "show"], "thread_not_found"),
        (["task", "show"], "task_not_found"),
    ],
)
async def test_odd_ids_are_typed_not_found_errors(
    daemon: Daemon, project: dict[str, Any], command: list[str], code: str
) -> None:
    for odd in ODD_IDS:
        done = await peerd(home_of(daemon), *command, odd)
        assert done.returncode == EXIT_ERROR, (odd, done.stdout, done.stderr)
        assert done.stderr.startswith(f"error: {code}:"), (odd, done.stderr)
        assert "Traceback" not in done.stderr and "No such endpoint" not in done.stderr


async def test_a_project_named_like_a_query_is_not_another_project(
    daemon: Daemon, project: dict[str, Any], tmp_path: Path
) -> None:
    shown = ok(await peerd(home_of(daemon), "project", "show", str(project["name"]), "--json"))
    assert str(project["id"]) in shown
    done = await peerd(home_of(daemon), "project", "show", f"{project['name']}?x=1")
    assert done.returncode == EXIT_ERROR and "project_not_found" in done.stderr
