"""A person may type the start of a thread id (`thr_` and at least 4 hex digits) wherever a thread
id goes; an ambiguous start is refused naming the matches, and a link's caller gets no such help
(issue 30). Real CLI subprocesses, real daemons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerd.api.localclient import LocalClient
from peerd.cli.common import EXIT_ERROR, EXIT_OK
from peerd.daemon import Daemon
from peerd.errors import PeerdError
from tests.helpers import script, two_daemons
from tests.support.approvals import set_up
from tests.support.cli import peerd

pytestmark = pytest.mark.slow  # CLI subprocesses against real daemons

Json = dict[str, Any]


async def a_thread_sharing_the_start_of(daemon: Daemon, thread_id: str) -> str:
    """A second thread whose id starts as `thread_id`'s does (8 of its characters): two random ids
    share 4 hex digits only after some 300 threads, so the other is written straight to the store."""
    assert daemon.db is not None
    other = thread_id[:8] + ("0" if thread_id[8] != "0" else "1") * 16
    async with daemon.db.write() as tx:
        await tx.execute(
            "INSERT INTO threads (id, project_id, title, provider, runtime_mode, interaction_mode, in_place,"
            " worktree_path, status, created_at, updated_at) SELECT ?, project_id, 'other', provider,"
            " runtime_mode, interaction_mode, in_place, worktree_path, status, created_at, updated_at"
            " FROM threads WHERE id = ?",
            (other, thread_id),
        )
    return other


async def test_a_unique_start_names_the_thread_and_an_ambiguous_one_is_refused(
    daemon: Daemon, client: LocalClient, project: Json
) -> None:
    home = Path((await client.call("GET", "/v1/status"))["home"])
    body = {"projectId": project["id"], "prompt": script({"reply": "x"})}
    one = (await client.call("POST", "/v1/threads", body=body))["threadId"]
    other = await a_thread_sharing_the_start_of(daemon, one)
    start = one[:8]
    unique = one[:10]  # the other's ninth digit differs
    shown = await peerd(home, "thread", "show", unique)
    assert shown.returncode == EXIT_OK, shown.stderr
    assert one in shown.stdout
    waited = await peerd(home, "thread", "wait", unique, "--timeout", "30")
    assert waited.returncode == EXIT_OK and "completed" in waited.stdout, (waited.stdout, waited.stderr)
    archived = await peerd(home, "thread", "show", other[:10])
    assert archived.returncode == EXIT_OK and other in archived.stdout, archived.stderr
    ambiguous = await peerd(home, "thread", "show", start)
    assert ambiguous.returncode == EXIT_ERROR
    assert ambiguous.stderr.startswith("error: ambiguous_id: ")
    assert one in ambiguous.stderr and other in ambiguous.stderr
    short = await peerd(home, "thread", "show", "thr_abc")  # fewer than 4 digits: taken as an id
    assert "thread_not_found" in short.stderr


async def test_a_links_caller_must_name_ids_in_full(tmp_path: Path) -> None:
    async with two_daemons(tmp_path) as pair:
        project = await set_up(tmp_path, pair, access="auto")
        body = {"projectId": project["id"], "prompt": script({"reply": "x"}), "environmentId": pair.box_id}
        launched = await pair.lc.call("POST", "/v1/threads", body=body)
        full = await pair.lc.call(
            "GET", f"/v1/threads/{launched['threadId']}", params={"environmentId": pair.box_id}
        )
        assert full["id"] == launched["threadId"]
        with pytest.raises(PeerdError) as refused:
            await pair.lc.call(
                "GET", f"/v1/threads/{launched['threadId'][:10]}", params={"environmentId": pair.box_id}
            )
        assert refused.value.code == "thread_not_found"


async def test_a_unique_start_names_a_task_and_an_approval_too(client: LocalClient, project: Json) -> None:
    """The same for tasks (`tsk_` and 4 hex digits) and approvals (`ap_`): show, and decide."""
    from tests.helpers import wait_terminal  # noqa: PLC0415  # only here
    from tests.support.approvals import launch, new_approval  # noqa: PLC0415  # only here
    from tests.support.delegation import delegate, runs_script, tasks_of  # noqa: PLC0415  # only here

    home = Path((await client.call("GET", "/v1/status"))["home"])
    prompt = runs_script([delegate(task=script({"reply": "CHILD DONE"}), title="short")])
    launched = await client.call("POST", "/v1/threads", body={"projectId": project["id"], "prompt": prompt})
    await wait_terminal(client, launched["threadId"], launched["runId"])
    [task] = await tasks_of(client, launched["threadId"])
    shown = await peerd(home, "task", "show", task["taskId"][:8])
    assert shown.returncode == EXIT_OK and task["taskId"] in shown.stdout, shown.stderr
    asking = await launch(client, project, script({"run": "echo a > a.txt"}, {"reply": "done"}))
    asked = await new_approval(client, set())
    seen = await peerd(home, "approval", "show", asked["id"][:7])
    assert seen.returncode == EXIT_OK and asked["id"] in seen.stdout, seen.stderr
    approved = await peerd(home, "approval", "approve", asked["id"][:7])
    assert approved.returncode == EXIT_OK, approved.stderr
    assert (await wait_terminal(client, asking["threadId"], asking["runId"]))["status"] == "completed"
