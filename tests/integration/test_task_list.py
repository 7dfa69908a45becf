"""`GET /v1/tasks`: every task of this machine, newest first, paged, filtered by parent, status and
target environment, each page a handful of index searches (checked with EXPLAIN QUERY PLAN)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.errors import PeerdError
from peerd.paths import Paths
from peerd.store import links
from peerd.store.schema import MIGRATIONS
from peerd.tasks import store as tasks
from tests.helpers import make_repo, running_daemon, script, wait_terminal
from tests.support.tasks import BOX, GONE, seed


async def every_page(client: LocalClient, limit: int, **params: Any) -> tuple[list[dict[str, Any]], int]:
    found: list[dict[str, Any]] = []
    cursor, pages = None, 0
    while True:
        page = await client.call("GET", "/v1/tasks", params={**params, "limit": limit, "cursor": cursor})
        assert len(page["items"]) <= limit
        found += page["items"]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            return found, pages


def where(t: dict[str, Any]) -> str | None:
    return (t.get("remoteChild") or {}).get("environmentId")


async def test_all_tasks_newest_first_paged_and_filtered(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "shop")
    async with (
        running_daemon(tmp_path / "home", label="laptop") as daemon,
        LocalClient(Paths(daemon.paths.home).socket) as lc,
    ):
        assert daemon.db is not None and daemon.identity is not None
        await links.upsert(
            daemon.db,
            links.LinkRow(
                env_id=BOX,
                label="box",
                urls=("https://127.0.0.1:9",),
                fingerprint=bytes(32),
                access="auto",
                client_id="cli_x",
                refresh_token="r",
                refresh_expires_at=None,
                access_token=None,
                access_expires_at=None,
                linked_at=time.time(),
            ),
        )
        await lc.call("POST", "/v1/projects", body={"path": str(repo)})
        parents = []
        for title in ("one", "two"):
            launched = await lc.call(
                "POST",
                "/v1/threads",
                body={"projectId": "shop", "title": title, "prompt": script({"reply": "ok"})},
            )
            await wait_terminal(lc, launched["threadId"], launched["runId"])
            parents.append((launched["threadId"], launched["runId"]))
        made = await seed(daemon.db, parents, 230)
        newest_first = list(reversed(made))

        everything, pages = await every_page(lc, 100)
        assert [t["taskId"] for t in everything] == [t["taskId"] for t in newest_first]
        assert pages == 3
        assert [t["status"] for t in everything] == [t["status"] for t in newest_first]

        cases: list[tuple[dict[str, Any], Any]] = [
            ({"status": "running"}, lambda t: t["status"] == "running"),
            ({"status": "pending,running"}, lambda t: t["status"] in ("pending", "running")),
            (
                {"status": "completed,failed,cancelled"},
                lambda t: t["status"] in ("completed", "failed", "cancelled"),
            ),
            ({"threadId": parents[1][0]}, lambda t: t["parent"] == parents[1][0]),
            (
                {"threadId": parents[0][0], "status": "completed"},
                lambda t: t["parent"] == parents[0][0] and t["status"] == "completed",
            ),
            ({"targetEnvironment": "box"}, lambda t: t["target"] == BOX),
            ({"targetEnvironment": BOX.lower()}, lambda t: t["target"] == BOX),  # typed as people do
            ({"targetEnvironment": GONE}, lambda t: t["target"] == GONE),
            ({"targetEnvironment": "laptop"}, lambda t: t["target"] is None),  # this machine, by label
            (
                {"targetEnvironment": daemon.identity.env_id, "status": "pending"},
                lambda t: t["target"] is None and t["status"] == "pending",
            ),
            (
                {"targetEnvironment": "box", "status": "failed,completed"},
                lambda t: t["target"] == BOX and t["status"] in ("failed", "completed"),
            ),
            (
                {"threadId": parents[0][0], "targetEnvironment": "box", "status": "running"},
                lambda t: t["parent"] == parents[0][0] and t["target"] == BOX and t["status"] == "running",
            ),
        ]
        for params, wanted in cases:
            expected = [t["taskId"] for t in newest_first if wanted(t)]
            assert expected, params
            got, _ = await every_page(lc, 7, **params)
            assert [t["taskId"] for t in got] == expected, params
        # A page is TaskInfo, as `task show` has it, without the prompt.
        first = (await lc.call("GET", "/v1/tasks", params={"limit": 1}))["items"][0]
        assert first["taskId"] == newest_first[0]["taskId"] and where(first) == newest_first[0]["target"]
        assert "prompt" not in first and first["title"] == "task 229"


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"status": "runing"}, "invalid_request"),
        ({"cursor": "abc"}, "invalid_request"),
        ({"limit": 1000}, "invalid_request"),
        ({"threadId": "thr_nope"}, "thread_not_found"),
        ({"targetEnvironment": "nowhere"}, "not_linked"),
        ({"environment": "box"}, "invalid_request"),
    ],
)
async def test_bad_filters_are_typed_errors(tmp_path: Path, params: dict[str, Any], code: str) -> None:
    async with (
        running_daemon(tmp_path / "home", listen=None) as daemon,
        LocalClient(Paths(daemon.paths.home).socket) as lc,
    ):
        with pytest.raises(PeerdError) as err:
            await lc.call("GET", "/v1/tasks", params=params)
        assert err.value.code == code, err.value.message


FILTERS = [
    tasks.TaskFilter(),
    tasks.TaskFilter(statuses=("running",)),
    tasks.TaskFilter(statuses=("pending", "running", "completed")),
    tasks.TaskFilter(target_env=BOX),
    tasks.TaskFilter(local=True),
    tasks.TaskFilter(target_env=BOX, statuses=("failed",)),
    tasks.TaskFilter(local=True, statuses=("pending", "running")),
    tasks.TaskFilter(parent_thread_id="thr_a"),
    tasks.TaskFilter(parent_thread_id="thr_a", statuses=("completed", "failed")),
    tasks.TaskFilter(parent_thread_id="thr_a", target_env=BOX),
    tasks.TaskFilter(parent_thread_id="thr_a", local=True, statuses=("running",)),
]


@pytest.mark.parametrize("found", FILTERS, ids=repr)
def test_every_list_query_is_an_index_search_in_rowid_order(found: tasks.TaskFilter) -> None:
    db = sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        for statement in migration:
            db.execute(statement)
    queries = tasks.listing_queries(found, before=2**63 - 1, limit=100)
    assert len(queries) <= len(tasks.TASK_STATUSES)
    for sql, params in queries:
        plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        assert len(plan) == 1, plan  # no temp b-tree for the order
        assert plan[0].startswith("SEARCH tasks USING "), plan
        if found.parent_thread_id is not None:
            assert "INDEX tasks_parent" in plan[0], plan
        elif found.local or found.target_env is not None:
            assert "INDEX tasks_open (target_env=? AND status=? AND rowid<?)" in plan[0], plan
        elif found.statuses:
            assert "INDEX tasks_status (status=? AND rowid<?)" in plan[0], plan
